"""Packing: fixed-length training rows as a view over a flat token stream.

Row k is tokens[k * (L + 1) : (k + 1) * (L + 1)], non-overlapping; the tail shorter than
a row is dropped. A row holds L + 1 tokens so that inputs and next-token labels (the
row shifted by one) both have length L without reading across rows. Documents run
across row boundaries, separated by EOS, so no token is spent on padding.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


class PackedRows:
    """Rows of `seq_len + 1` consecutive tokens over a flat (memory-mapped) token array."""

    def __init__(self, tokens: np.ndarray, seq_len: int) -> None:
        self._tokens = tokens
        self.seq_len = seq_len
        self.row_width = seq_len + 1
        self.num_rows = len(tokens) // self.row_width

    def __len__(self) -> int:
        return self.num_rows

    def row(self, index: int) -> np.ndarray:
        """Row `index` as a view (no copy until used)."""
        if not 0 <= index < self.num_rows:
            raise IndexError(f"row {index} out of range [0, {self.num_rows})")
        return self._tokens[index * self.row_width : (index + 1) * self.row_width]

    def batch(self, indices: Sequence[int]) -> dict[str, torch.Tensor]:
        """A micro-batch: `input_ids` = rows[:, :-1], `labels` = rows[:, 1:], both int64 [b, seq_len]."""
        rows = torch.from_numpy(np.stack([self.row(i) for i in indices]).astype(np.int64))
        return {"input_ids": rows[:, :-1].contiguous(), "labels": rows[:, 1:].contiguous()}

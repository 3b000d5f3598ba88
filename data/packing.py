"""Packing: fixed-length training rows as a view over flat token streams.

Row k of a stream is tokens[k * (L + 1) : (k + 1) * (L + 1)], non-overlapping; the tail
shorter than a row is dropped. A row holds L + 1 tokens so that inputs and next-token
labels (the row shifted by one) both have length L without reading across rows.
Documents run across row boundaries, separated by EOS, so no token is spent on padding.

Several streams (token files used in place) are packed one after the other, each on its
own, so that no row joins the end of one file to the start of the next.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from itertools import accumulate

import numpy as np
import torch


class PackedRows:
    """Rows of `seq_len + 1` consecutive tokens over one or more flat (memory-mapped) token arrays."""

    def __init__(self, tokens: np.ndarray | Sequence[np.ndarray], seq_len: int) -> None:
        self._segments = [tokens] if isinstance(tokens, np.ndarray) else list(tokens)
        self.seq_len = seq_len
        self.row_width = seq_len + 1
        self._ends = list(accumulate(len(segment) // self.row_width for segment in self._segments))
        self.num_rows = self._ends[-1] if self._ends else 0

    def __len__(self) -> int:
        return self.num_rows

    def row(self, index: int) -> np.ndarray:
        """Row `index` as a view (no copy until used)."""
        if not 0 <= index < self.num_rows:
            raise IndexError(f"row {index} out of range [0, {self.num_rows})")
        segment = bisect.bisect_right(self._ends, index)
        local = index - (self._ends[segment - 1] if segment else 0)
        return self._segments[segment][local * self.row_width : (local + 1) * self.row_width]

    def batch(self, indices: Sequence[int]) -> dict[str, torch.Tensor]:
        """A micro-batch: `input_ids` = rows[:, :-1], `labels` = rows[:, 1:], both int64 [b, seq_len]."""
        rows = torch.from_numpy(np.stack([self.row(i) for i in indices]).astype(np.int64))
        return {"input_ids": rows[:, :-1].contiguous(), "labels": rows[:, 1:].contiguous()}

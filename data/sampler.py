"""The resumable, rank-interleaved order in which training rows are read.

The *global order* is an infinite sequence of row indices: epoch e is a permutation of
all rows drawn with `torch.Generator().manual_seed(seed + e)` (or 0..N-1 when not
shuffling), and epochs follow each other without a gap (a micro-batch may straddle two
epochs, so no row is ever dropped). The order is cut into *groups* of
`micro_batch_size * dp_size` consecutive positions; rank r reads positions
[r * b, (r + 1) * b) of every group as one micro-batch.

So once every rank has read k micro-batches, exactly the first k * b * dp_size positions
of the global order are consumed, however micro-batches are grouped into optimizer
steps: the global batch may change between steps and resuming only needs that count.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import torch
from torch.utils.data import Sampler

from common.errors import CheckpointError


class RowOrder(Protocol):
    """A global order other than epochs over one set of rows (a weighted mixture's)."""

    def row_at(self, position: int) -> int:
        """The row index at a position of the global order."""


@dataclass(eq=False)
class ResumableRankSampler(Sampler[list[int]]):
    """An infinite batch sampler: yields this rank's micro-batches (lists of b row indices).

    `position` is the global position of the next group this rank has not started: where a
    resumed run starts (rows consumed), then + b * dp_size for each micro-batch yielded. A new
    iterator continues from `position`, so use one live iterator at a time. `order` replaces
    the epoch order (a mixture's); the grouping by rank is the same.
    """

    num_rows: int
    micro_batch_size: int
    dp_rank: int = 0
    dp_size: int = 1
    seed: int = 0
    shuffle: bool = True
    position: int = 0
    order: RowOrder | None = None

    def __post_init__(self) -> None:
        if self.num_rows < 1 or self.micro_batch_size < 1:
            raise ValueError(
                f"need num_rows >= 1 and micro_batch_size >= 1, got {self.num_rows} and {self.micro_batch_size}"
            )
        if not 0 <= self.dp_rank < self.dp_size:
            raise ValueError(f"data-parallel rank {self.dp_rank} is not in [0, dp_size={self.dp_size})")
        self.group_size = self.micro_batch_size * self.dp_size
        check_position(self.position, self.micro_batch_size, self.dp_size)
        self._epoch_orders: dict[int, torch.Tensor] = {}

    def __iter__(self) -> Iterator[list[int]]:
        while True:
            first = self.position + self.dp_rank * self.micro_batch_size
            indices = [self.row_at(p) for p in range(first, first + self.micro_batch_size)]
            self.position += self.group_size
            yield indices

    def row_at(self, position: int) -> int:
        """The row index at a position of the global order."""
        if self.order is not None:
            return self.order.row_at(position)
        epoch, offset = divmod(position, self.num_rows)
        if not self.shuffle:
            return offset
        return int(self._epoch_order(epoch)[offset])

    def _epoch_order(self, epoch: int) -> torch.Tensor:
        """Epoch permutations, keeping at most the two a straddling micro-batch needs."""
        if epoch not in self._epoch_orders:
            generator = torch.Generator().manual_seed(self.seed + epoch)
            self._epoch_orders = {
                epoch: torch.randperm(self.num_rows, generator=generator),
                **{e: order for e, order in self._epoch_orders.items() if e == epoch - 1},
            }
        return self._epoch_orders[epoch]


def check_position(position: int, micro_batch_size: int, dp_size: int) -> None:
    """A resume position must fall on a group boundary, or ranks would disagree on what was read."""
    group = micro_batch_size * dp_size
    if isinstance(position, bool) or not isinstance(position, int) or position < 0 or position % group:
        raise CheckpointError(
            f"start position {position!r} (rows consumed) must be a non-negative multiple of "
            f"micro_batch_size * dp_size = {micro_batch_size} * {dp_size} = {group}; resume with the "
            "micro_batch_size and data-parallel size that wrote the checkpoint, or ones whose product divides it"
        )

"""Iterable datasets that yield ready micro-batches for this data-parallel rank.

Both loaders are `IterableDataset`s because they shard by rank themselves: Lightning
then never injects a `DistributedSampler` (it skips iterable datasets), whatever the
Trainer's `use_distributed_sampler`, so rows are never sharded twice.

Both define `__len__`. For training this matters for exact resume: Lightning prefetches
one batch ahead from loaders without a length (to detect the last batch), which would
advance the sampler past what training consumed; with a length it does not prefetch.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import IterableDataset

from data.packing import PackedRows
from data.sampler import ResumableRankSampler

Batch = dict[str, torch.Tensor]


class TrainBatches(IterableDataset[Batch]):
    """Endless training micro-batches in the sampler's order.

    `len()` is the number of micro-batches Lightning counts as one epoch (about one pass
    over the rows); iteration itself never ends, and a new iterator continues where the
    previous one stopped, so Lightning epochs do not restart the data order.
    """

    def __init__(self, rows: PackedRows, sampler: ResumableRankSampler) -> None:
        self.rows = rows
        self.sampler = sampler

    def __iter__(self) -> Iterator[Batch]:
        for indices in self.sampler:
            yield self.rows.batch(indices)

    def __len__(self) -> int:
        return max(1, self.rows.num_rows // self.sampler.group_size)


class ValidationBatches(IterableDataset[Batch]):
    """Rows r, r + dp_size, r + 2 * dp_size, ... for rank r, in micro-batches.

    The first `max_rows` rows (all when None) are truncated to a multiple of dp_size, so
    every rank runs the same number of batches (a collective-using validation step would
    otherwise hang) and the rows evaluated barely depend on the number of ranks. The last
    batch may be smaller than `micro_batch_size`.
    """

    def __init__(
        self,
        rows: PackedRows,
        micro_batch_size: int,
        dp_rank: int,
        dp_size: int,
        max_rows: int | None,
        source: str | None = None,
    ) -> None:
        self.rows = rows
        self.source = source
        self.micro_batch_size = micro_batch_size
        usable = rows.num_rows if max_rows is None else min(rows.num_rows, max_rows)
        self.row_indices = list(range(dp_rank, usable - usable % dp_size, dp_size))

    def __iter__(self) -> Iterator[Batch]:
        for start in range(0, len(self.row_indices), self.micro_batch_size):
            batch = self.rows.batch(self.row_indices[start : start + self.micro_batch_size])
            yield batch if self.source is None else {**batch, "source": self.source}

    def __len__(self) -> int:
        return -(-len(self.row_indices) // self.micro_batch_size)


class ChainedBatches(IterableDataset[Batch]):
    """Several validation loaders one after the other (a mixture's sources, each tagged)."""

    def __init__(self, parts: list[ValidationBatches]) -> None:
        self.parts = parts

    def __iter__(self) -> Iterator[Batch]:
        for part in self.parts:
            yield from part

    def __len__(self) -> int:
        return sum(len(part) for part in self.parts)

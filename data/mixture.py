"""Weighted mixtures of sources (`data=mixture`): which source's which row is read at each
position of the global training order.

Position p draws its source from a fixed uniform number u_p (seeded by `data.seed` and p's
block of positions) through the cumulative weights in force at p: source s when
cum(w)_{s-1} <= u_p < cum(w)_s. The draws do not depend on the weights, so a resumed run
that changes them keeps every earlier choice and applies the new weights from the resume
position on (the checkpoint keeps the history of weights). Within a source, its k-th draw
reads its k-th row in its own order: passes over its rows, each pass a permutation seeded
by (seed, source, pass). A source that runs out therefore starts another pass in a fresh
order; it is repeated, never stops the run.

Counting is exact and cheap: the source counts at any position are the sum of per-block
counts, so resuming at position p costs p / BLOCK vectorised blocks, with no replay of rows.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from common.errors import ConfigError

SETTING = "data.mixture"
BLOCK = 4096  # positions per block of source draws
DRAW_STREAM = 0x6D6978  # keeps the draws apart from other uses of data.seed


@dataclass(frozen=True)
class MixtureEntry:
    """One named source of a mixture: its share of the training rows and its `data.source`-style block."""

    name: str
    weight: float
    source: dict[str, Any]


def mixture_entries(cfg: Mapping[str, Any]) -> list[MixtureEntry]:
    """Check `data.mixture` ({name: {weight, source}}); weights are shares, normalised to sum to 1.
    A null entry is no source (how a config built on another leaves one of its sources out)."""
    if isinstance(cfg, Mapping):
        cfg = {name: entry for name, entry in cfg.items() if entry is not None}
    if not isinstance(cfg, Mapping) or not cfg:
        raise ConfigError(f"{SETTING} must map source names to {{weight: ..., source: {{kind: ...}}}}, got {cfg!r}")
    entries = []
    for name, entry in cfg.items():
        if not isinstance(entry, Mapping) or set(entry) != {"weight", "source"}:
            raise ConfigError(f"{SETTING}.{name} must have exactly the keys weight and source, got {entry!r}")
        weight = entry["weight"]
        if (
            isinstance(weight, bool)
            or not isinstance(weight, (int, float))
            or not weight > 0
            or not math.isfinite(weight)
        ):
            raise ConfigError(
                f"{SETTING}.{name}.weight must be a positive number (its share of training rows), got {weight!r}"
            )
        if not isinstance(entry["source"], Mapping):
            raise ConfigError(
                f"{SETTING}.{name}.source must be a source block such as {{kind: embedded}}, got {entry['source']!r}"
            )
        entries.append(MixtureEntry(str(name), float(weight), dict(entry["source"])))
    total = sum(entry.weight for entry in entries)
    return [MixtureEntry(entry.name, entry.weight / total, entry.source) for entry in entries]


class MixtureOrder:
    """The global training order over several sources' rows, laid end to end (source s owns
    rows [offset_s, offset_s + rows_s)).

    `history` lists (first position, weights) pairs: the weights in force from each position on.
    """

    def __init__(
        self, source_rows: Sequence[int], history: Sequence[tuple[int, Sequence[float]]], seed: int, shuffle: bool
    ) -> None:
        if not history or history[0][0] != 0:
            raise ValueError("the weight history must start at position 0")
        self.source_rows = list(source_rows)
        self.offsets = np.concatenate([[0], np.cumsum(self.source_rows)[:-1]]).astype(np.int64)
        self.history = [(int(start), np.asarray(weights, dtype=np.float64)) for start, weights in history]
        self.seed = seed
        self.shuffle = shuffle
        self._blocks: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # block -> (sources, draw index within source)
        self._counts_at: dict[int, np.ndarray] = {0: np.zeros(len(self.source_rows), dtype=np.int64)}
        self._passes: dict[int, dict[int, torch.Tensor]] = {}  # source -> pass -> row order

    def row_at(self, position: int) -> int:
        """The row (in the end-to-end numbering) read at `position`."""
        block, index = divmod(position, BLOCK)
        sources, draws = self._block(block)
        source = int(sources[index])
        return int(self.offsets[source]) + self._row_of_draw(source, int(draws[index]))

    def rows_per_source(self, position: int) -> list[int]:
        """How many rows of each source positions [0, position) read."""
        block, index = divmod(position, BLOCK)
        sources, _ = self._block(block)
        counts = self._counts_before(block) + np.bincount(sources[:index], minlength=len(self.source_rows))
        return [int(count) for count in counts]

    def _block(self, block: int) -> tuple[np.ndarray, np.ndarray]:
        """The sources drawn in a block and each draw's index within its source."""
        if block not in self._blocks:
            sources = self._sources(block)
            within = np.zeros(BLOCK, dtype=np.int64)
            for source in range(len(self.source_rows)):
                mask = sources == source
                within[mask] = np.arange(int(mask.sum()))
            draws = self._counts_before(block)[sources] + within
            self._blocks = {block: (sources, draws), **{b: v for b, v in self._blocks.items() if b == block - 1}}
        return self._blocks[block]

    def _sources(self, block: int) -> np.ndarray:
        """Source of each position in the block: its fixed uniform draw through the weights in force there."""
        draws = np.random.default_rng([self.seed, DRAW_STREAM, block]).random(BLOCK)
        positions = block * BLOCK + np.arange(BLOCK)
        sources = np.empty(BLOCK, dtype=np.int64)
        for i, (start, weights) in enumerate(self.history):
            end = self.history[i + 1][0] if i + 1 < len(self.history) else math.inf
            mask = (positions >= start) & (positions < end)
            cumulative = np.cumsum(weights)
            sources[mask] = np.minimum(np.searchsorted(cumulative, draws[mask], side="right"), len(weights) - 1)
        return sources

    def _counts_before(self, block: int) -> np.ndarray:
        """Rows of each source read before the block starts (block counts summed, without rows)."""
        known = max(b for b in self._counts_at if b <= block)
        counts = self._counts_at[known]
        for b in range(known, block):
            counts = counts + np.bincount(self._sources(b), minlength=len(self.source_rows))
        self._counts_at[block] = counts
        return counts

    def _row_of_draw(self, source: int, draw: int) -> int:
        """A source's k-th draw: pass k // rows, row at k % rows of that pass's order."""
        rows = self.source_rows[source]
        epoch, offset = divmod(draw, rows)
        if not self.shuffle:
            return offset
        passes = self._passes.setdefault(source, {})
        if epoch not in passes:  # keep the two passes a micro-batch may straddle
            seed = int(np.random.SeedSequence([self.seed, source, epoch]).generate_state(1)[0])
            order = torch.randperm(rows, generator=torch.Generator().manual_seed(seed))
            self._passes[source] = {epoch: order, **{e: v for e, v in passes.items() if e == epoch - 1}}
        return int(self._passes[source][epoch][offset])

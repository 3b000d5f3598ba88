"""An arm's search: which searcher proposes its points, and what its results say.

A tuned study searches each arm (``study/preset.py``) with one searcher, ``study.searcher``:

- ``gp`` (the default), ``tpe``, ``random``: the joint search (``study/joint_search.py``),
  Optuna's samplers over every dimension at once, ``round_size`` points a round, until the
  arm's ``budget`` of points has run;
- ``coordinate``: the coordinate rule (``study/coordinate_search.py``), until the winner is
  bracketed along every dimension (or the budget, if one is set, has run).

Whatever the searcher, a search is a pure function of its results (point -> mean loss over
the tuning seeds) and its seed, and the same rules judge it:

- the **winner** is the best point the searcher chose itself (a NaN, a diverged run, is the
  worst; ties go to the smallest indices), so anchors stay controls;
- each dimension's **status**: ``bracketed`` (the winner has run points on both sides, for
  the coordinate rule its two grid neighbours at its other settings), ``at limit`` (a hard
  limit on the open side), ``all tried`` (a list, every value run) or ``not bracketed``
  (including a winner stopped by the extension guard or the span's margin rather than a hard
  limit: the loss may fall further beyond it);
- the **regret check**: every anchor must end no lower than the winner on the tuning seeds;
  an anchor that beats it means the search missed a known point of its own space;
- **tuned** = nothing left to run, every dimension bracketed, at a limit or all tried, and no
  anchor beating the winner. A claim on an arm that is not tuned is not judged.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import cached_property

from study.claim_tests import Estimate, Spread, paired
from study.coordinate_search import (
    ALL_TRIED,
    AT_LIMIT,
    BRACKETED,
    NOT_BRACKETED,
    TUNED,
    incumbent,
    loss_key,
    own_points,
    proposals,
    status,
)
from study.joint_search import SAMPLERS, replay
from study.search_record import SearchRecord
from study.search_space import Choice, Point, Range, SearchSpace
from study.surrogate import posterior_mean

SEARCHERS = (*SAMPLERS, "coordinate")
DEFAULT_SEARCHER = "gp"
#: Points a joint search proposes at once (``study.round_size``): one per worker and more.
DEFAULT_ROUND_SIZE = 4

__all__ = ["ALL_TRIED", "AT_LIMIT", "BRACKETED", "NOT_BRACKETED", "Search", "Tuning"]


@dataclass(frozen=True)
class Search:
    """How one arm is searched: its space, searcher, budget (points, each run on every
    tuning seed; None only for the coordinate rule, which stops when bracketed), round size,
    the searcher's seed and the anchors every search runs in its first round (in a ladder
    with ``previous_size_anchor``, also the winner of the same arm at the next smaller size,
    added by the plan once that search is over)."""

    space: SearchSpace
    searcher: str = DEFAULT_SEARCHER
    budget: int | None = None
    round_size: int = DEFAULT_ROUND_SIZE
    seed: int = 0
    anchors: tuple[Point, ...] = ()
    #: How many of the best points (by the surrogate's mean) run again on ``finalist_seeds``.
    finalists: int = 0
    finalist_seeds: tuple[int, ...] = ()
    previous_size_anchor: bool = False


#: The pairing unit of a point's mean over the tuning seeds (one value, every point the same seeds).
TUNING_SEEDS = -1


@dataclass(frozen=True)
class Tuning:
    """One arm's search as it stands: the results, the next points, the finalists, the
    winner, each dimension's status and the regret check."""

    search: Search
    #: Each finished point of the space at its mean loss over the tuning seeds: what the
    #: searcher is told at the points it asks.
    results: dict[Point, float]
    #: The finalists' and anchors' losses on each finalist seed.
    reruns: dict[Point, dict[int, float]] = field(default_factory=dict)
    #: The search's record (``study/search_record.py``): its rounds are taken as recorded.
    record: SearchRecord | None = field(default=None, compare=False)

    @property
    def space(self) -> SearchSpace:
        return self.search.space

    @cached_property
    def _plan(self) -> tuple[list[Point], frozenset[Point], frozenset[Point]]:
        """The points to run next, the searcher's own points and every point it asked."""
        search, results = self.search, self.results
        if search.searcher == "coordinate":
            pending = proposals(search.space, results, search.anchors)
            if search.budget is not None:
                pending = pending[: max(0, search.budget - len(results))]
            return pending, own_points(search.space, results, search.anchors), frozenset(results)
        found = replay(
            search.space,
            search.searcher,
            search.seed,
            search.budget,
            search.round_size,
            search.anchors,
            results,
            self.record,
        )
        return found.pending, found.own, found.asked

    @property
    def pending(self) -> list[Point]:
        """The searcher's points to run next on the tuning seeds (empty when its search is over)."""
        return self._plan[0] if self.space.dimensions else []

    @cached_property
    def searched(self) -> dict[Point, float]:
        """The points this search asked that finished, with their mean over the tuning seeds:
        what its finalists, brackets and report read. The coordinate rule takes every point of
        its space; a joint search only its replay's, so a run an earlier search left in the
        same space (a preset edited mid-study, say) is not counted as this one's."""
        return {p: v for p, v in self.results.items() if p in self._plan[2]}

    @cached_property
    def own(self) -> dict[Point, float]:
        """The searcher's own points that ran, with their mean over the tuning seeds."""
        return {p: self.results[p] for p in self._plan[1] if p in self.results}

    @cached_property
    def finalists(self) -> tuple[Point, ...]:
        """The points the winner is picked from: without finalists every own point; with them,
        once the search is over, the ``count`` own points of lowest surrogate mean (ties: the
        smallest indices)."""
        if not self.search.finalists:
            return tuple(self.own)
        if self.pending or not self.own:
            return ()
        points = sorted(self.own)
        means = posterior_mean(self.space, self.searched, points)
        ranked = sorted(zip(means, points), key=lambda pair: (loss_key(pair[0]), pair[1]))
        return tuple(point for _, point in ranked[: self.search.finalists])

    @property
    def pending_reruns(self) -> list[tuple[Point, int]]:
        """The (point, finalist seed) runs still missing: every finalist's and anchor's."""
        points = (
            [*self.finalists, *(a for a in self.search.anchors if a in self.searched)] if self.search.finalists else []
        )
        return [
            (p, seed)
            for p in dict.fromkeys(points)
            for seed in self.search.finalist_seeds
            if seed not in self.reruns.get(p, {})
        ]

    def losses(self, point: Point) -> dict[int, float]:
        """A point's losses by pairing unit: its tuning seeds' mean, then each finalist seed."""
        return {TUNING_SEEDS: self.results[point], **self.reruns.get(point, {})} if point in self.results else {}

    def mean(self, point: Point) -> float:
        """A point's mean loss over every seed it ran (a diverged run's NaN makes it NaN)."""
        values = list(self.losses(point).values())
        return sum(values) / len(values) if values else math.nan

    @cached_property
    def winner(self) -> Point | None:
        """The finalist with the lowest mean over its seeds, the provisional best own point while
        the search runs (None before any ran; an arm that searches nothing has one setting)."""
        if not self.space.dimensions:
            return ()
        candidates = self.finalists or tuple(self.own)
        return incumbent({p: self.mean(p) for p in candidates}) if candidates else None

    @cached_property
    def statuses(self) -> dict[str, str]:
        best = self.winner
        if best is None:
            return {d.key: NOT_BRACKETED for d in self.space.dimensions}
        return {d.key: self._status(best, axis) for axis, d in enumerate(self.space.dimensions)}

    def _status(self, best: Point, axis: int) -> str:
        if self.search.searcher == "coordinate":
            return status(self.space, self.results, best, axis)
        dimension, tried = self.space.dimensions[axis], {p[axis] for p in self.searched}
        if isinstance(dimension, Choice):
            return ALL_TRIED if tried >= set(dimension.span) else NOT_BRACKETED
        assert isinstance(dimension, Range)
        here = best[axis]
        nearest = {
            direction: min((i for i in tried if (i - here) * direction > 0), key=lambda i: abs(i - here), default=None)
            for direction in (-1, 1)
        }
        if all(index is not None for index in nearest.values()):
            sides = tuple(nearest.values())
            rises = rises_on_both_sides(self.space, self.searched, best, axis, sides, self.losses)
            return BRACKETED if rises else NOT_BRACKETED
        open_sides = [direction for direction, index in nearest.items() if index is None]
        edge = [
            here == (dimension.span.start if d < 0 else dimension.span.stop - 1) and dimension.at_hard_limit(here, d)
            for d in open_sides
        ]
        return AT_LIMIT if all(edge) else NOT_BRACKETED

    def regret(self, anchor: Point) -> Estimate | None:
        """The winner's loss minus the anchor's, paired over the seeds both ran (None: not both ran)."""
        best = self.winner
        if best is None or anchor not in self.searched:
            return None
        mine, theirs = self.losses(best), self.losses(anchor)
        shared = sorted(set(mine) & set(theirs))
        if len(shared) == 1:
            return Estimate("difference", mine[shared[0]] - theirs[shared[0]])
        return paired(
            Spread(tuple(mine[s] for s in shared), tuple(shared)),
            Spread(tuple(theirs[s] for s in shared), tuple(shared)),
            "difference",
        )

    @property
    def beaten_by(self) -> list[tuple[Point, float]]:
        """The anchors whose mean over the seeds they share with the winner is lower (with the
        winner's excess): the regret check."""
        if self.winner is None or not self.space.dimensions:
            return []
        found = [(a, self.regret(a)) for a in self.search.anchors]
        return [
            (a, r.value)
            for a, r in found
            if r is not None and (r.value > 0 or math.isnan(r.value) and not math.isnan(self.mean(a)))
        ]

    @property
    def over(self) -> bool:
        """Nothing left to run: the searcher's points and the reruns all finished."""
        return not self.pending and not self.pending_reruns

    @property
    def tuned(self) -> bool:
        """Nothing left to run, every dimension tuned, no anchor better than the winner."""
        return (
            self.winner is not None
            and self.over
            and all(s in TUNED for s in self.statuses.values())
            and not self.beaten_by
        )


def rises_on_both_sides(
    space: SearchSpace,
    results: dict[Point, float],
    best: Point,
    axis: int,
    sides: tuple[int, int],
    losses: Callable[[Point], dict[int, float]] | None = None,
) -> bool:
    """Whether the loss along ``axis`` through ``best`` (its other settings held) is higher at
    both of these indices than at the winner: by the surrogate of the tuning seeds' results,
    except that a neighbour which ran the finalist seeds beside the winner (``losses``: a
    point's loss per seed) is compared as the winner was picked, on the mean over the seeds
    both ran. The surrogate alone could put a finalist that lost on two seeds below the
    winner, and call the winner unbracketed beside it."""
    line = [best, *((*best[:axis], index, *best[axis + 1 :]) for index in sides)]
    at_winner, *modelled = posterior_mean(space, results, line)
    mine = losses(best) if losses else {}
    for neighbour, surrogate in zip(line[1:], modelled):
        theirs = losses(neighbour) if losses else {}
        shared = [seed for seed in mine if seed in theirs]
        higher = sum(theirs[s] - mine[s] for s in shared) > 0 if len(shared) > 1 else surrogate > at_winner
        if not higher:
            return False
    return True


def anchored_on(search: Search, previous: Tuning | None) -> Search:
    """The search with the same arm's winner at the next smaller size among its anchors (after
    the preset's, once), where it anchors on that size and the smaller search has a winner."""
    if not search.previous_size_anchor or previous is None or previous.winner is None:
        return search
    if previous.winner in search.anchors:
        return search
    return replace(search, anchors=(*search.anchors, previous.winner))


def tuning_from_seeds(
    search: Search, tuning_seeds: list[int], by_point: dict[Point, dict[int, float]], record: SearchRecord | None = None
) -> Tuning:
    """A search from each point's losses by seed: a point counts once every tuning seed ran, at
    their mean; its losses on the finalist seeds are its reruns."""
    results = {
        p: sum(v[s] for s in tuning_seeds) / len(tuning_seeds)
        for p, v in by_point.items()
        if set(tuning_seeds) <= set(v)
    }
    reruns = {p: {s: v[s] for s in search.finalist_seeds if s in v} for p, v in by_point.items()}
    return Tuning(search, results, {p: r for p, r in reruns.items() if r}, record)

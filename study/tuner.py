"""An arm's search: which searcher proposes its points, and what its results say.

A tuned study searches each arm (``study/preset.py``) with one searcher, ``study.searcher``:

- ``gp`` (the default), ``tpe``, ``random``: the joint search (``study/joint_search.py``),
  Optuna's samplers over every dimension at once, ``round_size`` points a round, until the
  arm's ``budget`` of points has run;
- ``coordinate``: the coordinate rule (``study/coordinate_search.py``), until the winner is
  bracketed along every dimension (or the budget, if one is set, has run).

Whatever the searcher, a search is a pure function of its results (point -> mean loss over
the tuning seeds) and its seed, and the same rules judge it:

- the **winner**: with finalists, the candidate (finalist or anchor) with the lowest mean over
  the finalist seeds, the tuning seeds left out and the seeds sized to a regret margin
  (``study/selection.py``); without them, the best point the searcher chose itself on the
  tuning seeds (a NaN, a diverged run, is the worst; ties go to the smallest indices), the
  anchors staying controls;
- each dimension's **status**: ``bracketed`` (the winner has run points on both sides, for
  the coordinate rule its two grid neighbours at its other settings), ``at limit`` (a hard
  limit on the open side), ``all tried`` (a list, every value run) or ``not bracketed``
  (including a winner stopped by the extension guard or the span's margin rather than a hard
  limit: the loss may fall further beyond it);
- the **regret test**: the search's own best against each anchor on the seeds the pick used
  (``study/selection.py``): an anchor resolvably ahead by more than the margin makes the arm
  ``not tuned``, ahead by more than the margin but unresolved ``undecided``;
- **tuned** = nothing left to run, every dimension bracketed, at a limit or all tried, and the
  regret test passed. A claim on an arm that is not tuned is not judged.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import cached_property

from study.coordinate_search import (
    ALL_TRIED,
    AT_LIMIT,
    BRACKETED,
    NOT_BRACKETED,
    incumbent,
    loss_key,
    own_points,
    proposals,
    status,
)
from study.coordinate_search import TUNED as TUNED_STATUSES
from study.joint_search import SAMPLERS, replay
from study.search_record import SearchRecord
from study.search_space import Choice, Point, Range, SearchSpace
from study.selection import (
    DEFAULT_REGRET_MARGIN,
    NOT_TUNED,
    TUNED,
    UNDECIDED,
    AnchorLead,
    anchor_lead,
    finalist_seed_count,
    pick,
)
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
    #: How many of the best points (by the surrogate's mean) run again, with the anchors, on ``finalist_seeds``.
    finalists: int = 0
    #: The seeds the finalists and anchors may run, in order: the first ``finalist_first`` always,
    #: then as many as the spread measured on those asks (``study/selection.py``).
    finalist_seeds: tuple[int, ...] = ()
    previous_size_anchor: bool = False
    #: The finalist seeds every candidate runs before the spread is measured (None: all of them).
    finalist_first: int | None = None
    #: A candidate this much worse than the best (nats) is a miss: what the finalist seeds are
    #: sized to avoid and the regret test's margin.
    regret_margin: float = DEFAULT_REGRET_MARGIN

    @property
    def first_finalist_seeds(self) -> int:
        """How many finalist seeds every candidate runs before the spread is measured."""
        return len(self.finalist_seeds) if self.finalist_first is None else self.finalist_first


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
        """The own points that run again: without finalists every own point; with them, once
        the search is over, the ``count`` own points of lowest surrogate mean (ties: the
        smallest indices)."""
        if not self.search.finalists:
            return tuple(self.own)
        if self.pending or not self.own:
            return ()
        points = sorted(self.own)
        means = posterior_mean(self.space, self.searched, points)
        ranked = sorted(zip(means, points), key=lambda pair: (loss_key(pair[0]), pair[1]))
        return tuple(point for _, point in ranked[: self.search.finalists])

    @cached_property
    def candidates(self) -> tuple[Point, ...]:
        """The points the winner is picked from on the finalist seeds, on equal terms: the
        finalists and the anchors that ran (none in a search without finalists)."""
        if not self.search.finalists or not self.finalists:
            return ()
        return tuple(dict.fromkeys([*self.finalists, *(a for a in self.search.anchors if a in self.searched)]))

    @cached_property
    def finalist_seed_count(self) -> int | None:
        """How many finalist seeds the candidates run (``study/selection.py``); None until every
        candidate ran the first ones."""
        search, runs = self.search, {p: self.reruns.get(p, {}) for p in self.candidates}
        return finalist_seed_count(runs, search.finalist_seeds, search.first_finalist_seeds, search.regret_margin)

    @property
    def pending_reruns(self) -> list[tuple[Point, int]]:
        """The (candidate, finalist seed) runs still missing: the first seeds, then those the spread asks."""
        count = self.finalist_seed_count or self.search.first_finalist_seeds
        seeds = self.search.finalist_seeds[:count]
        return [(p, s) for p in self.candidates for s in seeds if s not in self.reruns.get(p, {})]

    @cached_property
    def selection_seeds(self) -> tuple[int, ...]:
        """The finalist seeds every candidate ran: the seeds that vote (never the tuning seeds,
        which proposed the finalists)."""
        if not self.candidates:
            return ()
        return tuple(s for s in self.search.finalist_seeds if all(s in self.reruns.get(p, {}) for p in self.candidates))

    def votes(self, point: Point) -> dict[int, float]:
        """A point's losses on the seeds the pick uses: the finalist seeds every candidate ran,
        or, before (or without) them, its tuning seeds' mean."""
        if self.selection_seeds and point in self.candidates:
            return {s: self.reruns[point][s] for s in self.selection_seeds}
        return {TUNING_SEEDS: self.results[point]} if point in self.results else {}

    def mean(self, point: Point) -> float:
        """A point's mean loss over the seeds the pick uses (a diverged run's NaN makes it NaN)."""
        values = list(self.votes(point).values())
        return sum(values) / len(values) if values else math.nan

    @cached_property
    def winner(self) -> Point | None:
        """The candidate with the lowest mean over the finalist seeds; before they ran (or
        without finalists) the best own point on the tuning seeds (None before any ran; an arm
        that searches nothing has one setting)."""
        if not self.space.dimensions:
            return ()
        if self.selection_seeds:
            return pick({p: self.votes(p) for p in self.candidates}, self.selection_seeds)
        own = self.finalists or tuple(self.own)
        return incumbent({p: self.results[p] for p in own}) if own else None

    @cached_property
    def own_best(self) -> Point | None:
        """The search's own best point: the winner, or the best finalist where an anchor won."""
        if self.winner is None or self.winner in self.own or not self.selection_seeds:
            return self.winner
        own = [p for p in self.candidates if p in self.own]
        return pick({p: self.votes(p) for p in own}, self.selection_seeds) if own else None

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
            rises = rises_on_both_sides(self.space, self.searched, best, axis, sides, self.votes)
            return BRACKETED if rises else NOT_BRACKETED
        open_sides = [direction for direction, index in nearest.items() if index is None]
        edge = [
            here == (dimension.span.start if d < 0 else dimension.span.stop - 1) and dimension.at_hard_limit(here, d)
            for d in open_sides
        ]
        return AT_LIMIT if all(edge) else NOT_BRACKETED

    @cached_property
    def anchor_leads(self) -> list[AnchorLead]:
        """The regret test of every anchor that ran against the search's own best point, on the
        seeds the pick uses (``study/selection.py``)."""
        best = self.own_best
        if best is None or not self.space.dimensions:
            return []
        margin = self.search.regret_margin
        return [
            anchor_lead(self.votes(best), self.votes(a), a, margin)
            for a in self.search.anchors
            if a in self.searched and a != best
        ]

    @property
    def over(self) -> bool:
        """Nothing left to run: the searcher's points and the reruns all finished."""
        return not self.pending and not self.pending_reruns

    @property
    def verdict(self) -> str:
        """``tuned``, ``not tuned`` (runs left, a dimension not tuned, or an anchor resolvably
        ahead of the search by more than the margin) or ``undecided`` (an anchor ahead by more
        than the margin, unresolved)."""
        if self.winner is None or not self.over or any(s not in TUNED_STATUSES for s in self.statuses.values()):
            return NOT_TUNED
        found = {lead.verdict for lead in self.anchor_leads}
        return NOT_TUNED if NOT_TUNED in found else UNDECIDED if UNDECIDED in found else TUNED

    @property
    def tuned(self) -> bool:
        """Nothing left to run, every dimension tuned, and the regret test passed."""
        return self.verdict == TUNED


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

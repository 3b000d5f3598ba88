"""An arm's search: which searcher proposes its points, and what its results say.

A tuned study searches each arm (``analysis/study.py``) with one searcher, ``study.searcher``:

- ``gp`` (the default), ``tpe``, ``random``: the joint search (``analysis/model_search.py``),
  Optuna's samplers over every dimension at once, ``round_size`` points a round, until the
  arm's ``budget`` of points has run;
- ``coordinate``: the coordinate rule (``analysis/coordinate_search.py``), until the winner is
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

from dataclasses import dataclass
from functools import cached_property

from analysis.coordinate_search import ALL_TRIED, AT_LIMIT, BRACKETED, NOT_BRACKETED, TUNED, incumbent, loss_key, own_points, proposals, status
from analysis.model_search import SAMPLERS, replay
from analysis.search_space import Choice, Point, Range, SearchSpace

SEARCHERS = (*SAMPLERS, "coordinate")
DEFAULT_SEARCHER = "gp"
#: Points a joint search proposes at once (``study.round_size``): one per worker and more.
DEFAULT_ROUND_SIZE = 4

__all__ = ["ALL_TRIED", "AT_LIMIT", "BRACKETED", "NOT_BRACKETED", "Search", "Tuning"]


@dataclass(frozen=True)
class Search:
    """How one arm is searched: its space, searcher, budget (points, each run on every
    tuning seed; None only for the coordinate rule, which stops when bracketed), round size,
    the searcher's seed and the anchors every search runs in its first round."""

    space: SearchSpace
    searcher: str = DEFAULT_SEARCHER
    budget: int | None = None
    round_size: int = DEFAULT_ROUND_SIZE
    seed: int = 0
    anchors: tuple[Point, ...] = ()


@dataclass(frozen=True)
class Tuning:
    """One arm's search as it stands: the results, the next points, the winner, each
    dimension's status and the regret check."""

    search: Search
    results: dict[Point, float]

    @property
    def space(self) -> SearchSpace:
        return self.search.space

    @cached_property
    def _plan(self) -> tuple[list[Point], frozenset[Point]]:
        search, results = self.search, self.results
        if search.searcher == "coordinate":
            pending = proposals(search.space, results, search.anchors)
            if search.budget is not None:
                pending = pending[: max(0, search.budget - len(results))]
            return pending, own_points(search.space, results, search.anchors)
        found = replay(search.space, search.searcher, search.seed, search.budget, search.round_size, search.anchors, results)
        return found.pending, found.own

    @property
    def pending(self) -> list[Point]:
        """The points to run next (empty when the search is over)."""
        return self._plan[0] if self.space.dimensions else []

    @property
    def winner(self) -> Point | None:
        """The best of the searcher's own points so far (None before any ran; an arm that
        searches nothing has one setting)."""
        if not self.space.dimensions:
            return ()
        own = {p: self.results[p] for p in self._plan[1] if p in self.results}
        return incumbent(own) if own else None

    @property
    def statuses(self) -> dict[str, str]:
        best = self.winner
        if best is None:
            return {d.key: NOT_BRACKETED for d in self.space.dimensions}
        return {d.key: self._status(best, axis) for axis, d in enumerate(self.space.dimensions)}

    def _status(self, best: Point, axis: int) -> str:
        if self.search.searcher == "coordinate":
            return status(self.space, self.results, best, axis)
        dimension, tried = self.space.dimensions[axis], {p[axis] for p in self.results}
        if isinstance(dimension, Choice):
            return ALL_TRIED if tried >= set(dimension.span) else NOT_BRACKETED
        assert isinstance(dimension, Range)
        here = best[axis]
        sides = [(direction, any((i - here) * direction > 0 for i in tried)) for direction in (-1, 1)]
        if all(explored for _, explored in sides):
            return BRACKETED
        open_sides = [direction for direction, explored in sides if not explored]
        edge = [here == (dimension.span.start if d < 0 else dimension.span.stop - 1) and dimension.at_hard_limit(here, d) for d in open_sides]
        return AT_LIMIT if all(edge) else NOT_BRACKETED

    @property
    def beaten_by(self) -> list[tuple[Point, float]]:
        """The anchors that ended lower than the winner (with their losses): the regret check."""
        best = self.winner
        if best is None or not self.space.dimensions:
            return []
        bar = loss_key(self.results[best])
        return [(a, self.results[a]) for a in self.search.anchors if a in self.results and loss_key(self.results[a]) < bar]

    @property
    def tuned(self) -> bool:
        """Nothing left to run, every dimension tuned, no anchor better than the winner."""
        return self.winner is not None and not self.pending and all(s in TUNED for s in self.statuses.values()) and not self.beaten_by

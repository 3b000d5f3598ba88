"""The bracketing tuner: search each arm until its best setting is bracketed in every dimension.

The rule, on the tuning seeds (each point's loss is its mean over them):

1. **First design.** The centre of the space (the middle of each dimension's first grid) and,
   for every dimension, each value of its first grid with the other dimensions at the centre.
2. **Then, round after round,** the incumbent is the best point so far. Along every range
   dimension its two grid neighbours must have run: where the incumbent sits on the edge of
   what was tried, that is one grid step beyond it (the grid is extended), unless a hard limit
   is in the way; along every list dimension each value must have run with the incumbent's
   other settings. The points still missing are the next round.
3. **Done** when a round has nothing to run: the incumbent is then a grid optimum along every
   dimension, each range either bracketed (both neighbours ran and are no better) or at a hard
   limit, each list fully tried with the winner's other settings.

This is a coordinate-wise search, so it costs a few runs per dimension instead of the full
product of the grids (5 dimensions of 3-5 values: about 15-25 runs against 270); it finds a
grid optimum along each axis, which on the smooth, single-valley loss surfaces of learning
rates and intervals is the optimum a full grid would find. Everything here is a pure function
of the results so far, so a resumed study proposes the same jobs in the same order.
"""

from dataclasses import dataclass

from analysis.search_space import Choice, Point, Range, SearchSpace

BRACKETED, AT_LIMIT, NOT_BRACKETED, ALL_TRIED = "bracketed", "at limit", "not bracketed", "all tried"
#: Dimension statuses that count as tuned.
TUNED = (BRACKETED, AT_LIMIT, ALL_TRIED)


def first_design(space: SearchSpace) -> list[Point]:
    """The centre and, for each dimension, its first grid with the others at the centre
    (nothing for an arm that searches nothing: it has one setting, judged as it is)."""
    if not space.dimensions:
        return []
    centre = space.centre()
    points = [centre]
    for axis, dimension in enumerate(space.dimensions):
        points += [_moved(centre, axis, index) for index in dimension.first_grid]
    return list(dict.fromkeys(points))


def _moved(point: Point, axis: int, index: int) -> Point:
    return (*point[:axis], index, *point[axis + 1 :])


def incumbent(results: dict[Point, float]) -> Point:
    """The best point: lowest loss (a NaN, a diverged run, counts as the worst), ties broken by
    the smallest indices so that the choice never depends on the order results came in."""
    return min(results, key=lambda p: (_loss(results[p]), p))


def _loss(value: float) -> float:
    return float("inf") if value != value else value


def line(space: SearchSpace, point: Point, axis: int) -> list[Point]:
    """The points that bracket ``point`` along one dimension: its two grid neighbours for a
    range (fewer at a hard limit), every other value for a list."""
    dimension = space.dimensions[axis]
    if isinstance(dimension, Choice):
        return [_moved(point, axis, index) for index in dimension.first_grid if index != point[axis]]
    neighbours = (dimension.neighbour(point[axis], direction) for direction in (-1, 1))
    return [_moved(point, axis, index) for index in neighbours if index is not None]


def proposals(space: SearchSpace, results: dict[Point, float]) -> list[Point]:
    """The points to run next: what the first design or the incumbent's lines still lack."""
    wanted = first_design(space)
    if results:
        best = incumbent(results)
        wanted += [p for axis in range(len(space.dimensions)) for p in line(space, best, axis)]
    return [p for p in dict.fromkeys(wanted) if p not in results]


def status(space: SearchSpace, results: dict[Point, float], axis: int) -> str:
    """Whether the incumbent is tuned along one dimension: bracketed, at limit (a hard limit on
    one side), all tried (a list), or not bracketed (a neighbour has not run yet)."""
    best = incumbent(results)
    dimension = space.dimensions[axis]
    if any(p not in results for p in line(space, best, axis)):
        return NOT_BRACKETED
    if isinstance(dimension, Choice):
        return ALL_TRIED
    assert isinstance(dimension, Range)
    at_limit = any(dimension.neighbour(best[axis], direction) is None for direction in (-1, 1))
    return AT_LIMIT if at_limit else BRACKETED


@dataclass(frozen=True)
class Tuning:
    """One arm's search as it stands: the results, the winner, each dimension's status."""

    space: SearchSpace
    results: dict[Point, float]

    @property
    def winner(self) -> Point | None:
        """The best point so far (None before any ran; an arm that searches nothing has one)."""
        if not self.space.dimensions:
            return ()
        return incumbent(self.results) if self.results else None

    @property
    def statuses(self) -> dict[str, str]:
        if self.winner is None:
            return {d.key: NOT_BRACKETED for d in self.space.dimensions}
        return {d.key: status(self.space, self.results, axis) for axis, d in enumerate(self.space.dimensions)}

    @property
    def tuned(self) -> bool:
        """Bracketed (or at a limit, or fully tried) in every dimension, with nothing left to run."""
        return self.winner is not None and not proposals(self.space, self.results) and all(
            s in TUNED for s in self.statuses.values()
        )

"""The coordinate rule: search each dimension in turn until the best point is bracketed.

One of the study's searchers (``study.searcher: coordinate``; ``study/tuner.py``). On the
tuning seeds (each point's loss is its mean over them):

1. **First design.** The centre of the space (the middle of each dimension's first grid) and,
   for every dimension, each value of its first grid with the other dimensions at the centre;
   the arm's anchors run beside it.
2. **Then, round after round,** the incumbent is the best of the rule's own points (the
   anchors are controls, not candidates). Along every range dimension its two grid
   neighbours must have run: where the incumbent sits on the edge of what was tried, that is
   one grid step beyond it (the grid is extended), unless a hard limit is in the way; along
   every list dimension each value must have run with the incumbent's other settings. The
   points still missing are the next round.
3. **Done** when a round has nothing to run: the incumbent is then a grid optimum along every
   dimension, each range either bracketed (both neighbours ran and are no better) or at a hard
   limit, each list fully tried with the winner's other settings.

It costs a few runs per dimension instead of the full product of the grids, and finds the
optimum of a separable surface. Where settings act together (a ridge along lr / (1 - momentum))
it stops where no single-axis neighbour is better, short of the optimum: the searcher
benchmark (``scripts/benchmark_searchers.py``) measures this, and the joint search
(``study/joint_search.py``) is the default. Everything here is a pure function of the
results so far, so a resumed study proposes the same jobs in the same order.
"""

from study.search_space import Choice, Point, Range, SearchSpace

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
    return min(results, key=lambda p: (loss_key(results[p]), p))


def loss_key(value: float) -> float:
    """A loss to compare: a NaN (a diverged run) as +inf, the worst."""
    return float("inf") if value != value else value


def line(space: SearchSpace, point: Point, axis: int) -> list[Point]:
    """The points that bracket ``point`` along one dimension: its two grid neighbours for a
    range (fewer at a hard limit), every other value for a list."""
    dimension = space.dimensions[axis]
    if isinstance(dimension, Choice):
        return [_moved(point, axis, index) for index in dimension.first_grid if index != point[axis]]
    neighbours = (dimension.neighbour(point[axis], direction) for direction in (-1, 1))
    return [_moved(point, axis, index) for index in neighbours if index is not None]


def own_points(space: SearchSpace, results: dict[Point, float], anchors: tuple[Point, ...]) -> frozenset[Point]:
    """The points the rule would propose itself: every result but an anchor off the first design."""
    design = set(first_design(space))
    return frozenset(p for p in results if p in design or p not in anchors)


def proposals(space: SearchSpace, results: dict[Point, float], anchors: tuple[Point, ...] = ()) -> list[Point]:
    """The points to run next: what the first design, the anchors or the incumbent's lines
    still lack."""
    wanted = [*first_design(space), *anchors]
    own = own_points(space, results, anchors)
    if own:
        best = incumbent({p: results[p] for p in own})
        wanted += [p for axis in range(len(space.dimensions)) for p in line(space, best, axis)]
    return [p for p in dict.fromkeys(wanted) if p not in results]


def status(space: SearchSpace, results: dict[Point, float], best: Point, axis: int) -> str:
    """Whether ``best`` is tuned along one dimension: bracketed, at limit (a hard limit on one
    side), all tried (a list), or not bracketed (a neighbour has not run, or the extension
    guard, not a hard limit, stopped the grid)."""
    dimension = space.dimensions[axis]
    if any(p not in results for p in line(space, best, axis)):
        return NOT_BRACKETED
    if isinstance(dimension, Choice):
        return ALL_TRIED
    assert isinstance(dimension, Range)
    stopped = [direction for direction in (-1, 1) if dimension.neighbour(best[axis], direction) is None]
    if any(not dimension.at_hard_limit(best[axis], direction) for direction in stopped):
        return NOT_BRACKETED  # at the extension guard: the loss may still fall beyond it
    return AT_LIMIT if stopped else BRACKETED

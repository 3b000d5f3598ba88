"""An arm's winner picked among its finalists and anchors: an estimation step, not a minimum.

Once a search is over, the points it ranks best (its finalists, by the surrogate's mean) and the
arm's anchors (the candidates) run again on the finalist seeds, every candidate on the same seeds:

- **The winner** is the candidate with the lowest mean over the finalist seeds. The tuning seeds
  do not vote: they proposed the finalists, so a point whose tuning run drew lucky noise would
  carry that luck into its mean (the winner's curse). Anchors compete on equal terms.
- **How many finalist seeds** (``study.finalists.seeds: {first: [...], max: N}``): the first
  ones on every candidate, then as many as order two candidates a regret margin apart correctly
  with probability ``POWER`` at the spread measured on the first ones:
  ``n = ceil((t(POWER; df) * s_d / margin) ** 2)``, where ``s_d`` is the standard deviation of
  one paired difference between two candidates, pooled over all of them (the residual of
  candidate + seed effects, times sqrt 2) with ``df = (k - 1)(n0 - 1)`` degrees of freedom,
  capped at N. This is the two-candidate case of Bechhofer's (1954) indifference-zone rule: a
  pick, unlike a claim, has no null hypothesis to reject, only an order to get right.
- **The regret test**: the search's own best candidate against each anchor, paired over the
  finalist seeds, a one-sided t-test at ``ONE_SIDED_ALPHA``: an anchor resolvably ahead by more
  than the margin means the search never reached a known point of its own space (**not
  tuned**, whichever candidate won); ahead by more than the margin but not resolved,
  **undecided**, with the seeds the lead would take to resolve.
"""

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from analysis.student_t import t_quantile
from study.claim_tests import ONE_SIDED_ALPHA, POWER, Estimate, Spread, paired
from study.search_space import Point

#: A candidate this much worse than the best (nats) is a miss the finalist seeds are sized to avoid.
DEFAULT_REGRET_MARGIN = 0.005
#: The most seeds a regret test's "would take" reports (a lead at the margin would take forever).
MOST_SEEDS = 1000

TUNED, NOT_TUNED, UNDECIDED = "tuned", "not tuned", "undecided"


@dataclass(frozen=True)
class PairedSpread:
    """The standard deviation of a paired difference between two candidates, and its degrees of freedom."""

    sd: float
    df: int


def pooled_spread(losses: Mapping[Point, Mapping[int, float]], seeds: Sequence[int]) -> PairedSpread | None:
    """The paired-difference spread of the candidates that ran every one of ``seeds`` with a
    finite loss: the residual of an additive candidate + seed model, times sqrt 2 (a difference
    of two residuals). None below two candidates or two seeds."""
    rows = [
        [values[s] for s in seeds]
        for values in losses.values()
        if all(math.isfinite(values.get(s, math.nan)) for s in seeds)
    ]
    k, n = len(rows), len(seeds)
    if k < 2 or n < 2:
        return None
    grand = statistics.fmean(v for row in rows for v in row)
    row_means = [statistics.fmean(row) for row in rows]
    seed_means = [statistics.fmean(row[j] for row in rows) for j in range(n)]
    squares = sum((row[j] - row_means[i] - seed_means[j] + grand) ** 2 for i, row in enumerate(rows) for j in range(n))
    df = (k - 1) * (n - 1)
    return PairedSpread(math.sqrt(2 * squares / df), df)


def seeds_to_order(spread: PairedSpread, margin: float) -> int:
    """The seeds that put two candidates ``margin`` apart in the right order with probability
    ``POWER``: ``ceil((t(POWER; df) * sd / margin) ** 2)``, at least 1."""
    return max(1, math.ceil((t_quantile(spread.df, POWER) * spread.sd / margin) ** 2))


def finalist_seed_count(
    losses: Mapping[Point, Mapping[int, float]], seeds: Sequence[int], first: int, margin: float
) -> int | None:
    """How many of ``seeds`` the candidates run: the first ``first``, then as many as
    ``seeds_to_order`` asks at the spread measured on them, at most all of them. None until every
    candidate ran the first seeds."""
    head = list(seeds[:first])
    if any(s not in values for values in losses.values() for s in head):
        return None
    spread = pooled_spread(losses, head)
    wanted = first if spread is None else seeds_to_order(spread, margin)
    return min(len(seeds), max(first, wanted))


def pick(losses: Mapping[Point, Mapping[int, float]], seeds: Sequence[int]) -> Point:
    """The candidate with the lowest mean over ``seeds`` (a diverged run's NaN is the worst; ties
    go to the smallest indices, so the pick never depends on the order runs finished in)."""

    def key(point: Point) -> tuple[float, Point]:
        mean = statistics.fmean(losses[point][s] for s in seeds)
        return (math.inf if math.isnan(mean) else mean, point)

    return min(losses, key=key)


@dataclass(frozen=True)
class AnchorLead:
    """The search's own best candidate minus one anchor, paired over the finalist seeds: how far
    the anchor is ahead (positive: the anchor is lower), and what the regret test makes of it."""

    anchor: Point
    lead: Estimate
    verdict: str  # tuned | not tuned | undecided
    #: Seeds that would resolve an unresolved lead beyond the margin (None otherwise).
    seeds_needed: int | None = None


def anchor_lead(own_best: Mapping[int, float], anchor: Mapping[int, float], point: Point, margin: float) -> AnchorLead:
    """The regret test of one anchor: ``not tuned`` when its lead over the search's best own
    candidate is resolvably beyond ``margin`` (the lower one-sided bound at ``ONE_SIDED_ALPHA``),
    ``undecided`` when the lead exceeds the margin but is not resolved, else ``tuned``."""
    seeds = sorted(set(own_best) & set(anchor))
    lead = paired(
        Spread(tuple(own_best[s] for s in seeds), tuple(seeds)),
        Spread(tuple(anchor[s] for s in seeds), tuple(seeds)),
        "difference",
    )
    if lead is None:  # one shared seed: a lead, but no spread to test it with
        value = own_best[seeds[0]] - anchor[seeds[0]] if seeds else math.nan
        lead = Estimate("difference", value)
        return AnchorLead(point, lead, UNDECIDED if value > margin else TUNED)
    if lead.value <= margin:
        return AnchorLead(point, lead, TUNED)
    if lead.known and lead.bounds(ONE_SIDED_ALPHA)[0] > margin:
        return AnchorLead(point, lead, NOT_TUNED)
    spread = PairedSpread(lead.error * math.sqrt(lead.df + 1), lead.df) if lead.known else None
    return AnchorLead(point, lead, UNDECIDED, seeds_to_resolve(spread, lead.value - margin) if spread else None)


def seeds_to_resolve(spread: PairedSpread, excess: float) -> int:
    """The seeds at which a paired one-sided t-test at ``ONE_SIDED_ALPHA`` resolves an ``excess``
    with power ``POWER`` at this spread: the least n with
    ``(t(1 - alpha; n - 1) + t(POWER; n - 1)) * sd / sqrt(n) <= excess`` (at most ``MOST_SEEDS``)."""
    for n in range(2, MOST_SEEDS):
        reach = (t_quantile(n - 1, 1 - ONE_SIDED_ALPHA) + t_quantile(n - 1, POWER)) * spread.sd / math.sqrt(n)
        if reach <= excess:
            return n
    return MOST_SEEDS

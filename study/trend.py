"""Claims as trends: how a difference between two arms changes with model size.

A trend claim (``trend: params`` in a study's claim) compares ``arm`` with ``baseline`` at
every model size the study was crossed with (a ladder): at each size and judging seed the
paired difference ``arm_s - baseline_s``, their mean per size, then the least-squares line
of those per-size means against log10 N (N: the model's parameter count). Seeds of one size
share its model and settings, so they are not independent points of the line: the slope's
standard error has sizes - 2 degrees of freedom, its spread the per-size means' scatter about
the line (which holds their seed noise). The claim's tests are made on the slope as on a
difference (``study/claim_tests.py``): ``lower_than: 0`` is superiority, the gap shrinks
with N (a one-sided t-test at 2.5%), with the slope the seeds resolve at 80% power beside it.
With fewer than 3 sizes there is no scatter about a line to judge its slope against, and more
seeds cannot supply it: such a trend is **too few sizes**, with each size's mean difference
in place of a slope; judging seeds added in looks (``study/looks.py``) show it on their seeds
but are never added for it.
"""

import math
from dataclasses import dataclass

from study.claim_tests import Estimate, Spread
from study.preset import Claim
from study.verdicts import FEW_SIZES, NOT_RUN, NOT_TUNED, Level, Verdict, combine, describe, full_level, judged, margin


@dataclass(frozen=True)
class TrendPoint:
    """One size and seed: the parameter count and the arm's difference from the baseline."""

    n_params: float
    seed: int
    difference: float


def slope(points: list[TrendPoint]) -> Estimate:
    """The slope of the per-size mean difference against log10 N, with its standard error
    (none with fewer than 3 sizes: no scatter to judge against)."""
    by_size = _by_size(points)
    xs = [math.log10(n) for n in sorted(by_size)]
    ys = [sum(by_size[n]) / len(by_size[n]) for n in sorted(by_size)]
    n = len(xs)
    if n < 2:
        return Estimate("slope", float("nan"))
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    if n < 3:
        return Estimate("slope", b)
    residual = sum((y - my - b * (x - mx)) ** 2 for x, y in zip(xs, ys)) / (n - 2)
    return Estimate("slope", b, math.sqrt(residual / sxx), n - 2)


def points_of(claim: Claim, sizes: list[float], bases: list[dict[str, dict[str, Spread]]]) -> list[TrendPoint]:
    """Each size's (one base job's groups: arm -> metric -> its values by seed) paired
    differences of the claim's metric, arm minus baseline, on the seeds both ran."""
    metric = next(iter(claim.expect))
    points = []
    for n_params, groups in zip(sizes, bases):
        ours, theirs = groups.get(claim.arm, {}).get(metric), groups.get(claim.baseline, {}).get(metric)
        mine, base = (ours.by_seed() if ours else None), (theirs.by_seed() if theirs else None)
        if mine and base:
            points += [TrendPoint(n_params, seed, mine[seed] - base[seed]) for seed in sorted(set(mine) & set(base))]
    return points


#: Fewest sizes whose per-size means give a slope with a spread (sizes - 2 >= 1 degrees of freedom).
MIN_TREND_SIZES = 3


def judge_trend(
    claim: Claim, points: list[TrendPoint], untuned: frozenset[str] = frozenset(), level: Level = full_level
) -> Verdict:
    """A trend claim's verdict on the (size, seed) differences of its arm from its baseline,
    each test at ``level`` of its own (a look's share when seeds are added in looks)."""
    if not points:
        return Verdict(claim, [f"no size with finished runs of both {claim.arm} and {claim.baseline}"], NOT_RUN)
    if len(_by_size(points)) < MIN_TREND_SIZES:
        measured, verdict = _per_size_means(claim, points), FEW_SIZES
    else:
        measured, verdict = _slope_tests(claim, points, level)
    if {claim.arm, claim.baseline} & untuned:
        return Verdict(claim, [*measured, "not tuned at every size (see the tuning table)"], NOT_TUNED)
    return Verdict(claim, measured, verdict)


def _slope_tests(claim: Claim, points: list[TrendPoint], level: Level) -> tuple[list[str], str]:
    """Each condition's test on the slope, in words, and their combined verdict."""
    estimate, sizes = slope(points), len(_by_size(points))
    measured, verdicts = [], []
    for metric, conditions in claim.expect.items():
        for condition in conditions:
            smallest, alpha = margin(claim, condition), level(condition.alpha)
            shown = f"slope per decade of N {estimate.text(alpha)}"
            measured.append(
                f"{metric} difference: {describe(shown, estimate, condition, alpha, smallest, 'slope')};"
                f" per-size means of {len(points)} seeds over {sizes} sizes, {sizes - 2} degrees of freedom"
            )
            verdicts.append(judged(estimate, condition, smallest, alpha))
    return measured, combine(verdicts)


def _per_size_means(claim: Claim, points: list[TrendPoint]) -> list[str]:
    """A trend over one or two sizes in words: each size's mean difference, no slope."""
    by_size = _by_size(points)
    means = ", ".join(f"N = {n:,.0f}: {sum(d) / len(d):+.4g} ({len(d)} seeds)" for n, d in sorted(by_size.items()))
    return [
        f"{next(iter(claim.expect))} difference per size: {means}; {len(by_size)} size(s) with both arms judged,"
        f" a slope's interval needs {MIN_TREND_SIZES}"
    ]


def _by_size(points: list[TrendPoint]) -> dict[float, list[float]]:
    """The differences of each size (its parameter count), over its seeds."""
    by_size: dict[float, list[float]] = {}
    for p in points:
        by_size.setdefault(p.n_params, []).append(p.difference)
    return by_size

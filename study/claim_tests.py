"""The tests a study's claims name: an arm's final values against a baseline's, over seeds.

A claim's condition names the hypothesis test it makes, so a verdict never claims more than
its test shows (``study/preset.py`` parses them; the values are the thresholds):

- ``lower_than: T`` / ``higher_than: T`` - **superiority**: the difference (arm minus
  baseline) is below (above) T; T = 0 is plain "ends lower", T < 0 "lower by more than |T|".
  A one-sided t-test at 2.5% (the 95% interval's upper, or lower, end beyond T).
- ``no_worse_than: d`` - **non-inferiority**: the arm is worse than the baseline by at most d
  (d > 0; worse is higher unless the claim says ``better: higher``). A one-sided t-test at 2.5%.
- ``within: d`` - **equivalence**: the difference lies inside +-d, by two one-sided tests at
  5% each (Schuirmann 1987): the 90% interval inside +-d. "Matches within d" is this claim,
  not non-inferiority, which a much better arm also passes.

Each has a ``ratio_`` form on ``mean(arm) / mean(baseline)`` (``ratio_lower_than: 0.7``: "with
less than 0.7 of the baseline's steps"; ratio margins are factors: ``ratio_within: 1.05``). A
trend claim (``study/trend.py``) makes the same tests on a slope.

Every test passes (**holds**) when its interval lies inside the claim's region, **fails** when
the interval lies wholly outside it, and is otherwise unresolved. The **resolvable
difference** is the distance from the region's edge that the test would resolve with 80%
power at the spread measured, ``(t(1 - alpha) + t(power)) * se`` (for equivalence the power
is split over the two sides); an unresolved test whose resolvable difference exceeds the
claim's margin is **underpowered**: more seeds would decide it. Studies that add seeds in
rounds spend each test's alpha over the looks (``study/sequential.py``); the level a test
used is printed with it.
"""

import math
import statistics
from dataclasses import dataclass

from analysis.student_t import t_quantile

#: The one-sided level of superiority and non-inferiority tests (the 95% interval's end).
ONE_SIDED_ALPHA = 0.025
#: The level of each of equivalence's two one-sided tests (the 90% interval).
EQUIVALENCE_ALPHA = 0.05
#: The power at which the resolvable difference is reported.
POWER = 0.8

SUPERIORITY, NON_INFERIORITY, EQUIVALENCE = "superiority", "non-inferiority", "equivalence"
#: Each test's name, the hypothesis it tests, and the level of each of its one-sided tests.
TESTS = {
    "lower_than": (SUPERIORITY, ONE_SIDED_ALPHA),
    "higher_than": (SUPERIORITY, ONE_SIDED_ALPHA),
    "no_worse_than": (NON_INFERIORITY, ONE_SIDED_ALPHA),
    "within": (EQUIVALENCE, EQUIVALENCE_ALPHA),
}
CONDITIONS = (*TESTS, *(f"ratio_{name}" for name in TESTS))
#: The names of the retired conditions, with what to write instead.
RETIRED = {
    "difference_at_most": "lower_than (superiority, threshold <= 0) or no_worse_than (non-inferiority, margin > 0)",
    "difference_at_least": "higher_than (superiority, threshold >= 0) or no_worse_than with better: higher",
    "ratio_at_most": "ratio_lower_than (threshold <= 1) or ratio_no_worse_than (a factor > 1)",
    "ratio_at_least": "ratio_higher_than (threshold >= 1) or ratio_no_worse_than with better: higher",
    "slope_at_most": "lower_than (on the slope, with trend: params)",
    "slope_at_least": "higher_than (on the slope, with trend: params)",
}
BETTER = ("lower", "higher")


@dataclass(frozen=True)
class Spread:
    """A quantity over the seeds of one group."""

    values: tuple[float, ...]
    #: The seed of each value, where known (what pairs two arms' runs).
    seeds: tuple[int | None, ...] = ()

    def by_seed(self) -> dict[int, float] | None:
        """Value by seed, or None when a seed is unknown or repeats."""
        if len(self.seeds) != self.n or None in self.seeds or len(set(self.seeds)) < self.n:
            return None
        return dict(zip(self.seeds, self.values))

    def on(self, seeds: list[int]) -> "Spread":
        """The values of these seeds only (a look at the first seeds of a study that added more)."""
        found = self.by_seed() or {}
        kept = [s for s in seeds if s in found]
        return Spread(tuple(found[s] for s in kept), tuple(kept))

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values)

    @property
    def std(self) -> float:
        """The sample standard deviation (n - 1); 0 for one seed."""
        return statistics.stdev(self.values) if self.n > 1 else 0.0

    def __str__(self) -> str:
        """Mean ± std, both at the mean's precision: whole numbers for counts (one decimal for
        a small count's fractional mean: 1 spike in 3 seeds is 0.3, not 0) and anything >= 1000,
        one decimal from 10, four below."""
        counts = all(float(v).is_integer() for v in self.values)
        if counts and abs(self.mean) < 10 and not float(self.mean).is_integer():
            return f"{self.mean:.1f} ± {self.std:.1f}"
        if counts or abs(self.mean) >= 1000:
            return f"{self.mean:,.0f} ± {self.std:,.0f}"
        decimals = 1 if abs(self.mean) >= 10 else 4
        return f"{self.mean:.{decimals}f} ± {self.std:.{decimals}f}"


@dataclass(frozen=True)
class Estimate:
    """A measured difference, ratio or slope with its standard error and degrees of freedom
    (``error`` None: one seed, no spread known)."""

    kind: str  # difference | ratio | slope
    value: float
    error: float | None = None
    df: int = 0

    @property
    def known(self) -> bool:
        return self.error is not None and self.df > 0 and not math.isnan(self.error)

    def bounds(self, alpha: float) -> tuple[float, float]:
        """The interval whose each end is a one-sided bound at level ``alpha`` (0.025: the 95% interval)."""
        half = t_quantile(self.df, 1 - alpha) * self.error if self.known else math.nan
        return self.value - half, self.value + half

    def text(self, alpha: float) -> str:
        sign = "+" if self.kind != "ratio" and self.value >= 0 else ""
        if not self.known:
            return f"{sign}{self.value:.4g}"
        low, high = self.bounds(alpha)
        return f"{sign}{self.value:.4g} [{low:.4g}, {high:.4g}]"


def unpaired(arm: Spread, baseline: Spread, kind: str) -> Estimate:
    """``mean(arm) - mean(baseline)`` (or their ratio) with Welch's standard error (the ratio's
    by the delta method) and ``min(n) - 1`` degrees of freedom, a conservative choice for
    unequal variances."""
    if kind == "difference":
        value = arm.mean - baseline.mean
        error = math.sqrt(arm.std**2 / arm.n + baseline.std**2 / baseline.n)
    else:
        value = arm.mean / baseline.mean
        relative = [(s.std / s.mean) ** 2 / s.n if s.mean else math.inf for s in (arm, baseline)]
        error = abs(value) * math.sqrt(sum(relative))
    df = min(arm.n, baseline.n) - 1
    return Estimate(kind, value, error if df > 0 else None, df)


def paired(arm: Spread, baseline: Spread, kind: str) -> Estimate | None:
    """The mean of the per-seed differences (or ratios) on the seeds both ran, its standard
    error and n - 1 degrees of freedom; None unless they share two or more seeds."""
    a, b = arm.by_seed(), baseline.by_seed()
    shared = sorted(set(a) & set(b)) if a is not None and b is not None else []
    if len(shared) < 2:
        return None
    per_seed = Spread(tuple(a[s] - b[s] if kind == "difference" else a[s] / b[s] for s in shared))
    return Estimate(kind, per_seed.mean, per_seed.std / math.sqrt(per_seed.n), per_seed.n - 1)


@dataclass(frozen=True)
class Condition:
    """One test of a claim on one metric: its name, threshold and what counts as better."""

    name: str  # a key of CONDITIONS
    threshold: float
    better: str = "lower"

    @property
    def test(self) -> str:
        return self.name.removeprefix("ratio_")

    @property
    def kind(self) -> str:
        return "ratio" if self.name.startswith("ratio_") else "difference"

    @property
    def hypothesis(self) -> str:
        return TESTS[self.test][0]

    @property
    def alpha(self) -> float:
        """The level of each one-sided test this condition makes."""
        return TESTS[self.test][1]

    @property
    def null(self) -> float:
        return 1.0 if self.kind == "ratio" else 0.0

    def region(self) -> tuple[float, float]:
        """The values of the estimate for which the claim is true."""
        t, inf = self.threshold, math.inf
        if self.test == "lower_than":
            return -inf, t
        if self.test == "higher_than":
            return t, inf
        lowest = 1 / t if self.kind == "ratio" else -t  # the worst still accepted when higher is better
        if self.test == "within":
            return lowest, t
        return (-inf, t) if self.better == "lower" else (lowest, inf)

    def margin(self) -> float:
        """The distance of the region's nearer edge from no effect (0 for plain superiority)."""
        return min(abs(edge - self.null) for edge in self.region() if math.isfinite(edge))

    def words(self, alpha: float | None = None, of: str | None = None) -> str:
        """The test and its level in words, e.g. 'non-inferiority: difference <= +0.01, one-sided
        t-test at 2.5%' (``of``: what the estimate is, a slope in a trend claim)."""
        low, high = self.region()
        what = of or self.kind
        if self.test == "within":
            bound = f"{what} in [{low:.4g}, {high:.4g}]"
        else:
            bound = f"{what} <= {high:+.4g}" if math.isinf(low) else f"{what} >= {low:+.4g}"
        level = f"{100 * (self.alpha if alpha is None else alpha):.3g}%"
        test = f"two one-sided t-tests at {level} each" if self.test == "within" else f"one-sided t-test at {level}"
        return f"{self.hypothesis}: {bound}, {test}"

    def check(self, path: str) -> None:
        """A threshold of the wrong sign for its test: raise ValueError naming the fix."""
        t, null = self.threshold, self.null
        if self.kind == "ratio" and t <= 0:
            raise ValueError(f"{path}: {self.name}={t:g} is a ratio and must be > 0")
        if self.test == "lower_than" and t > null:
            raise ValueError(
                f"{path}: {self.name}={t:g} claims superiority, so it must be <= {null:g} (a margin below no"
                f" effect); to claim the arm is at most {t - null:g} worse, use {self.name.replace('lower_than', 'no_worse_than')}"
            )
        if self.test == "higher_than" and t < null:
            raise ValueError(
                f"{path}: {self.name}={t:g} claims superiority, so it must be >= {null:g}; to claim the arm is at"
                f" most {null - t:g} lower, use {self.name.replace('higher_than', 'no_worse_than')} with better: higher"
            )
        if self.test in ("no_worse_than", "within") and t <= null:
            example = "1.05" if self.kind == "ratio" else "0.01"
            raise ValueError(
                f"{path}: {self.name}={t:g} is a margin and must be > {null:g}, e.g. {self.name}: {example}"
            )


def verdict(estimate: Estimate, condition: Condition, alpha: float | None = None) -> str:
    """holds / fails / inconclusive for one condition on an estimate, each one-sided test at
    ``alpha`` (the condition's own level unless a sequential look spends less)."""
    if not estimate.known:
        return "inconclusive"
    low, high = estimate.bounds(condition.alpha if alpha is None else alpha)
    region_low, region_high = condition.region()
    if region_low <= low and high <= region_high:
        return "holds"
    if high < region_low or low > region_high:
        return "fails"
    return "inconclusive"


def resolvable(estimate: Estimate, condition: Condition, alpha: float | None = None) -> float | None:
    """The distance from the region's edge the test resolves with 80% power at this spread."""
    if not estimate.known:
        return None
    level = condition.alpha if alpha is None else alpha
    power = 1 - (1 - POWER) / 2 if condition.test == "within" else POWER
    return (t_quantile(estimate.df, 1 - level) + t_quantile(estimate.df, power)) * estimate.error

"""Studies: arms x seeds, grouped results with their seed spread, and verdicts on claims.

A study preset (``conf/sweep/NAME.yaml``) declares, under ``study``:

- ``arms``: named lists of overrides (``constant_16: [+technique=constant_batch, ...]``);
- ``seeds``: the seeds every arm runs with;
- ``columns`` (optional): extra report columns, a final value, ``max(KEY)`` / ``min(KEY)``
  over the run (``max(stability/loss_spike_ratio)``) or ``spikes(KEY>T)``, the number of
  times KEY rose above T;
- ``claims``: what the study tests, each comparing one arm with a baseline arm on the
  final value of a metric, e.g. "``adaptive`` ends within 0.01 nats of ``constant_16``
  with at most 0.7 of its optimizer steps"::

      claims:
        - claim: adaptive matches constant_16 with >= 30% fewer steps
          arm: adaptive
          baseline: constant_16
          expect:
            val/loss: {difference_at_most: 0.01}
            steps: {ratio_at_most: 0.7}

``arm`` and ``baseline`` may also list several arms (a tuning grid: ``arm: [muon_lr2e-3,
muon_lr4e-3]``): the claim then compares the best of each list, the arm with the lowest
mean ``select`` metric (``val/loss`` unless given). Picking the best on the same seeds that
judge it favours the winner slightly; the verdict line names the arms that were picked.

A claim may instead place an arm against a front of other arms (``front: [constant_16,
constant_32, ...]``, with ``x: steps`` and ``y: val/loss``): the arm is below the front
(holds) when it ends lower on ``y`` than every front arm that needed no more ``x``; it is
dominated (fails) when one of those ends lower than it; otherwise it lies on the front
within the seed spread (inconclusive).

A **tuned** study also declares a search space (``analysis/search_space.py``), shared
under ``study.search`` and per arm (an arm is then ``{overrides: [...], search: {...}}``),
and ``tuning_seeds``: the study sweeper searches each arm on the tuning seeds until its best
setting is bracketed in every dimension (``analysis/tuner.py``), then runs each arm's
winner on ``seeds``, the judging seeds, which must not repeat a tuning seed. Claims are
judged on the judging runs only, so the seeds that picked a winner never judge it.

A tuned study crossed with model sizes (a ladder) may hold one size out of the search
(``held_out: ladder_2_1m``, a value of the swept ``model``): its searched settings are not
searched but follow a power law in the parameter count, fitted to the other sizes' winners
(Charles et al. 2025's way to set a large model's hyperparameters from small runs), and it
runs on the judging seeds after every other size has been judged
(``++study.phase=held_out``), so a prediction of its loss can be written first.

The study sweeper (``hydra_plugins/study_sweeper``) turns arms x seeds into jobs; the
report groups finished runs by arm (or, in any other sweep, by their overrides less the
seed) and judges each claim here.

A condition is judged on the 95% confidence interval of the measured difference
(``mean(arm) - mean(baseline)``) or ratio (``mean(arm) / mean(baseline)``): it **holds**
when the whole interval satisfies it, **fails** when none of it does, and is
**inconclusive** when the interval straddles the threshold, that is when the effect is
within the seed spread. The interval is Student's t with ``min(n_arm, n_baseline) - 1``
degrees of freedom (a conservative choice for unequal variances) around the standard
error ``sqrt(s_a^2 / n_a + s_b^2 / n_b)``; for ratios the standard error comes from the
delta method. With a single seed in either arm there is no spread to judge against, and
every condition is inconclusive.

Where both arms ran the same seeds (two or more), they started from the same weights and saw
the same data order, so the **paired** interval decides: the per-seed differences (or
ratios) ``arm_s - baseline_s``, their mean, and Student's t with ``n - 1`` degrees of freedom
around their standard error; the unpaired interval is printed beside it. A claim whose arm
(or baseline) has no finished run is **not run**; in a tuned study, a claim on an arm whose
search has not bracketed its winner in every dimension is **not tuned**, never holds or
fails.
"""

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from analysis.runs import parse_reduction
from analysis.search_space import Dimension, Range, SearchSpace, parse_search
from common.errors import ConfigError

#: Two-sided 95% quantiles of Student's t by degrees of freedom (beyond 30: the normal's).
T_95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
        10: 2.228, 12: 2.179, 15: 2.131, 20: 2.086, 25: 2.060, 30: 2.042}  # fmt: skip

CONDITIONS = ("difference_at_most", "difference_at_least", "ratio_at_most", "ratio_at_least", "slope_at_most", "slope_at_least")
#: What a trend claim's slope is taken against (``analysis/trend.py``).
TREND_AXES = ("params",)


def t_quantile(df: int) -> float:
    """The two-sided 95% quantile of Student's t with ``df`` degrees of freedom (table values,
    the next smaller tabled df in between, so the interval is never too narrow)."""
    if df > 30:
        return 1.96
    return T_95[max(d for d in T_95 if d <= df)]


@dataclass(frozen=True)
class Claim:
    """A claim of the study: ``arm`` against ``baseline``, one condition per metric; or,
    with ``front``, ``arm`` against the front of those arms in the (``x``, ``y``) plane."""

    claim: str
    arm: str | list[str]
    baseline: str | list[str] | None = None
    expect: dict[str, dict[str, float]] = field(default_factory=dict)
    front: list[str] = field(default_factory=list)
    x: str = "steps"
    y: str = "val/loss"
    #: The metric that picks the best of a list of arms (lowest mean).
    select: str = "val/loss"
    #: A trend claim: the x its difference's slope is taken against (``params``: log10 N).
    trend: str | None = None

    @property
    def arms(self) -> list[str]:
        return [*_names(self.arm), *_names(self.baseline), *self.front]

    @property
    def metrics(self) -> list[str]:
        if self.front:
            return [self.x, self.y]
        return list(dict.fromkeys([*self.expect, self.select]))


def _names(arms: str | list[str] | None) -> list[str]:
    if arms is None:
        return []
    return [arms] if isinstance(arms, str) else list(arms)


@dataclass(frozen=True)
class StudySpec:
    """The ``study`` block of a preset."""

    arms: dict[str, list[str]]
    #: The judging seeds: every arm (in a tuned study, every arm's winner) runs with each.
    seeds: list[int]
    claims: list[Claim] = field(default_factory=list)
    #: Extra report columns: final values or ``max(KEY)`` / ``min(KEY)`` over a run.
    columns: list[str] = field(default_factory=list)
    #: The seeds the search runs on (a tuned study only).
    tuning_seeds: list[int] = field(default_factory=list)
    #: Each tuned arm's search space (every arm, in a tuned study).
    spaces: dict[str, SearchSpace] = field(default_factory=dict)
    #: A tuned study's token budget rule: this many tokens per model parameter (a ladder's).
    tokens_per_parameter: float | None = None
    #: A ladder's size (``model`` preset) whose searched settings are extrapolated, not searched.
    held_out: str | None = None

    @property
    def tuned(self) -> bool:
        return bool(self.spaces)

    @classmethod
    def from_config(cls, node: Any) -> "StudySpec":
        """Check and convert a ``study`` block (a plain dict); mistakes name the key and the fix."""
        node = dict(node or {})
        arms, seeds = node.get("arms"), node.get("seeds")
        if not isinstance(arms, dict) or not arms:
            raise ConfigError("study.arms must map each arm's name to its list of overrides, e.g. {small: [batch.global_batch_size=16]}.")
        shared = parse_search(node.get("search"), "study.search")
        overrides, searches = {}, {}
        for name, entry in arms.items():
            overrides[name], own = _arm(name, entry)
            searches[name] = {**shared, **own}
        seeds = _seeds(seeds, "study.seeds")
        tuning_seeds = _seeds(node.get("tuning_seeds"), "study.tuning_seeds") if node.get("tuning_seeds") is not None else []
        spaces = {}
        if any(searches.values()):
            spaces = {name: _space(name, searches[name], overrides[name]) for name in arms}
            if not tuning_seeds:
                raise ConfigError("study.tuning_seeds is missing: a study with a search needs the seeds it tunes on, e.g. [1], apart from study.seeds.")
            repeated = sorted(set(tuning_seeds) & set(seeds))
            if repeated:
                raise ConfigError(f"study.seeds repeats the tuning seeds {repeated}: winners are judged on other seeds; e.g. tuning_seeds [1], seeds [2, 3, 4].")
        elif tuning_seeds:
            raise ConfigError("study.tuning_seeds is set but nothing is searched: add study.search (or an arm's search), or drop tuning_seeds.")
        claims = [_claim(index, entry, arms) for index, entry in enumerate(node.get("claims") or [])]
        columns = list(node.get("columns") or [])
        for column in columns:
            try:
                parse_reduction(str(column))
            except ValueError as error:
                raise ConfigError(f"study.columns: {error}.") from None
        per_parameter = node.get("tokens_per_parameter")
        if per_parameter is not None and (isinstance(per_parameter, bool) or not isinstance(per_parameter, int | float) or per_parameter <= 0):
            raise ConfigError(f"study.tokens_per_parameter={per_parameter!r} must be a number > 0 (or null: the config's token_budget).")
        held_out = _held_out(node.get("held_out"), spaces)
        return cls(arms=overrides, seeds=seeds, claims=claims, columns=columns, tuning_seeds=tuning_seeds, spaces=spaces,
                   tokens_per_parameter=per_parameter, held_out=held_out)  # fmt: skip


def _held_out(name: Any, spaces: dict[str, SearchSpace]) -> str | None:
    """The held-out size: a model preset's name, in a study whose every searched dimension is a
    numeric range (a list of choices has no power law to follow)."""
    if name is None:
        return None
    if not isinstance(name, str) or not name:
        raise ConfigError(f"study.held_out={name!r} must name one of the ladder's model presets, e.g. ladder_2_1m.")
    if not spaces:
        raise ConfigError("study.held_out needs a search (study.search): the held-out size's settings are fitted to the others' winners.")
    listed = sorted({d.key for space in spaces.values() for d in space.dimensions if not isinstance(d, Range)})
    if listed:
        raise ConfigError(f"study.held_out: {', '.join(listed)} is searched over a list, which has no power law in N to extrapolate; search a range or drop held_out.")
    return name


def _seeds(seeds: Any, key: str) -> list[int]:
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) for s in seeds) or len(set(seeds)) < len(seeds):
        raise ConfigError(f"{key} must be a list of distinct integers, got {seeds!r}.")
    return list(seeds)


def _arm(name: str, entry: Any) -> tuple[list[str], dict[str, Dimension]]:
    """An arm's fixed overrides and its own search: a list of overrides, or a mapping
    ``{overrides: [...], search: {...}}``."""
    key = f"study.arms.{name}"
    search = {}
    if isinstance(entry, dict):
        unknown = set(entry) - {"overrides", "search"}
        if unknown:
            raise ConfigError(f"{key}: unknown fields {sorted(unknown)}; an arm is a list of overrides or {{overrides: [...], search: {{...}}}}.")
        search = parse_search(entry.get("search"), f"{key}.search")
        entry = entry.get("overrides") or []
    if not isinstance(entry, list) or not all(isinstance(o, str) and "=" in o for o in entry):
        raise ConfigError(f"{key} must be a list of overrides such as 'optimizer.lr=1e-3', got {entry!r}.")
    return list(entry), search


def _space(name: str, search: dict[str, Dimension], overrides: list[str]) -> SearchSpace:
    fixed = {o.split("=", 1)[0].lstrip("+~") for o in overrides}
    space = SearchSpace(tuple(search.values()))
    clash = sorted(fixed & set(space.keys))
    if clash:
        raise ConfigError(f"study.arms.{name} fixes {clash}, which its search also tunes: drop one of them.")
    return space


def _one_or_list(arms: Any) -> str | list[str]:
    return arms if isinstance(arms, str) else list(arms)


def _claim(index: int, entry: Any, arms: dict[str, Any]) -> Claim:
    key = f"study.claims[{index}]"
    if not isinstance(entry, dict) or "arm" not in entry or not ({"baseline", "expect"} <= set(entry) or "front" in entry):
        raise ConfigError(
            f"{key} needs arm, and baseline with expect (metric: {{condition: value}}) or front (a list of arms), got {entry!r}."
        )
    text = entry.get("claim") or f"{entry['arm']} vs {entry.get('baseline') or 'the front'}"
    if "front" in entry:
        claim = Claim(claim=text, arm=entry["arm"], front=list(entry["front"] or []), x=entry.get("x", "steps"),
                      y=entry.get("y", "val/loss"))  # fmt: skip
        if not claim.front or not isinstance(claim.arm, str):
            raise ConfigError(f"{key}: a front claim needs one arm and front, the list of arms that make the front.")
    else:
        expect = entry["expect"]
        if not isinstance(expect, dict) or not expect:
            raise ConfigError(f"{key}.expect must map metrics to conditions, e.g. {{val/loss: {{difference_at_most: 0.01}}}}.")
        for metric, conditions in expect.items():
            if not isinstance(conditions, dict) or not conditions or not set(conditions) <= set(CONDITIONS):
                raise ConfigError(f"{key}.expect.{metric}: conditions are {CONDITIONS}, got {conditions!r}.")
        trend = entry.get("trend")
        slopes = {c for conditions in expect.values() for c in conditions if c.startswith("slope_")}
        if trend is not None and (trend not in TREND_AXES or not isinstance(entry["arm"], str) or not isinstance(entry["baseline"], str)):
            raise ConfigError(f"{key}.trend={trend!r}: a trend claim takes one arm, one baseline and trend: params.")
        if bool(slopes) != (trend is not None) or (trend is not None and slopes != {c for v in expect.values() for c in v}):
            raise ConfigError(f"{key}: slope_at_most / slope_at_least go with trend: params, and only they.")
        claim = Claim(claim=text, arm=_one_or_list(entry["arm"]), baseline=_one_or_list(entry["baseline"]),
                      expect=dict(expect), select=entry.get("select", "val/loss"), trend=trend)  # fmt: skip
    for arm in claim.arms:
        if arm not in arms:
            raise ConfigError(f"{key} names {arm!r}, which is not an arm; the arms are {sorted(arms)}.")
    return claim


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
class Interval:
    """A measured difference or ratio with its 95% confidence interval (None: no spread known)."""

    kind: str  # difference | ratio
    value: float
    low: float | None
    high: float | None

    def __str__(self) -> str:
        sign = "+" if self.kind == "difference" and self.value >= 0 else ""
        if self.low is None:
            return f"{sign}{self.value:.4g}"
        return f"{sign}{self.value:.4g} [{self.low:.4g}, {self.high:.4g}]"


def compare(arm: Spread, baseline: Spread, kind: str) -> Interval:
    """``mean(arm) - mean(baseline)`` or ``mean(arm) / mean(baseline)``, with its 95% interval."""
    if kind == "difference":
        value = arm.mean - baseline.mean
        error = math.sqrt(arm.std**2 / arm.n + baseline.std**2 / baseline.n)
    else:
        value = arm.mean / baseline.mean
        relative = [(s.std / s.mean) ** 2 / s.n if s.mean else math.inf for s in (arm, baseline)]
        error = abs(value) * math.sqrt(sum(relative))
    if min(arm.n, baseline.n) < 2:
        return Interval(kind, value, None, None)
    half = t_quantile(min(arm.n, baseline.n) - 1) * error
    return Interval(kind, value, value - half, value + half)


def paired(arm: Spread, baseline: Spread, kind: str) -> Interval | None:
    """The paired interval over per-seed differences (or ratios) ``arm_s - baseline_s``:
    their mean and Student's t with n - 1 degrees of freedom; None unless both ran the same
    two or more seeds."""
    a, b = arm.by_seed(), baseline.by_seed()
    if a is None or b is None or set(a) != set(b) or len(a) < 2:
        return None
    per_seed = Spread(tuple(a[s] - b[s] if kind == "difference" else a[s] / b[s] for s in sorted(a)))
    half = t_quantile(per_seed.n - 1) * per_seed.std / math.sqrt(per_seed.n)
    return Interval(kind, per_seed.mean, per_seed.mean - half, per_seed.mean + half)


def judge(interval: Interval, condition: str, threshold: float) -> str:
    """holds / fails / inconclusive for one condition on a measured interval."""
    if interval.low is None:
        return "inconclusive"
    at_most = condition.endswith("at_most")
    if (interval.high <= threshold) if at_most else (interval.low >= threshold):
        return "holds"
    if (interval.low > threshold) if at_most else (interval.high < threshold):
        return "fails"
    return "inconclusive"


NOT_RUN, NOT_TUNED = "not run", "not tuned"


def combine(verdicts: list[str]) -> str:
    """A claim is not run if an arm has no run, fails if any condition fails, holds if all
    hold, else it is inconclusive."""
    if NOT_RUN in verdicts:
        return NOT_RUN
    if "fails" in verdicts:
        return "fails"
    return "holds" if all(v == "holds" for v in verdicts) else "inconclusive"


@dataclass(frozen=True)
class Verdict:
    claim: Claim
    measured: list[str]  # one line per condition: metric, interval, condition
    verdict: str


def judge_claim(claim: Claim, groups: dict[str, dict[str, Spread]], untuned: frozenset[str] = frozenset()) -> Verdict:
    """Judge a claim on the groups' spreads (arm -> metric -> Spread); a claim on an arm in
    ``untuned`` (a tuned study's arm whose search is not finished) is not tuned."""
    if claim.front:
        return judge_front(claim, groups)
    arm_name, baseline_name = best(claim.arm, claim.select, groups), best(claim.baseline, claim.select, groups)
    missing = [name for name in (arm_name, baseline_name) if name not in groups]
    if missing:
        return Verdict(claim, [f"no finished run of {' or '.join(missing)}"], NOT_RUN)
    measured, verdicts = [], []
    if not isinstance(claim.arm, str) or not isinstance(claim.baseline, str):
        measured.append(f"best by {claim.select}: {arm_name} against {baseline_name}")
    for metric, conditions in claim.expect.items():
        arm, baseline = groups[arm_name].get(metric), groups[baseline_name].get(metric)  # {}: split or unlogged
        for condition, threshold in conditions.items():
            if arm is None or baseline is None:
                measured.append(f"{metric}: no finished run of {arm_name if arm is None else baseline_name} logged it")
                verdicts.append("inconclusive")
                continue
            kind = condition.split("_")[0]
            unpaired, pair = compare(arm, baseline, kind), paired(arm, baseline, kind)
            symbol = "<=" if condition.endswith("at_most") else ">="
            intervals = f"paired {pair}, unpaired {unpaired}" if pair else str(unpaired)
            measured.append(f"{metric} {kind} {intervals} (want {symbol} {threshold:g}; n={arm.n}/{baseline.n})")
            verdicts.append(judge(pair or unpaired, condition, float(threshold)))
    not_tuned = sorted({arm_name, baseline_name} & untuned)
    if not_tuned:
        measured.append(f"{', '.join(not_tuned)} not bracketed in every dimension")
        return Verdict(claim, measured, NOT_TUNED)
    return Verdict(claim, measured, combine(verdicts))


def best(arms: str | list[str] | None, metric: str, groups: dict[str, dict[str, Spread]]) -> str:
    """The arm itself, or of a list the one with the lowest mean ``metric`` (the first if none
    finished)."""
    names = _names(arms)
    measured = [name for name in names if metric in groups.get(name, {})]
    return min(measured, key=lambda name: groups[name][metric].mean) if measured else names[0]


def judge_front(claim: Claim, groups: dict[str, dict[str, Spread]]) -> Verdict:
    """The arm against each front arm that needed no more ``x`` (by mean): lower ``y`` than all
    of them holds, higher ``y`` than one of them (95% interval above 0) fails."""
    arm = groups.get(claim.arm, {})
    if not arm:
        return Verdict(claim, [f"no finished run of {claim.arm}"], NOT_RUN)
    if claim.x not in arm or claim.y not in arm:
        return Verdict(claim, [f"no finished run of {claim.arm} logged {claim.x} and {claim.y}"], "inconclusive")
    measured, verdicts = [], []
    for name in claim.front:
        other = groups.get(name, {})
        if claim.x not in other or claim.y not in other:
            measured.append(f"{name}: no finished run")
            verdicts.append("inconclusive")
        elif other[claim.x].mean <= arm[claim.x].mean:
            interval = compare(arm[claim.y], other[claim.y], "difference")
            measured.append(f"vs {name} ({arm[claim.x].mean / other[claim.x].mean:.2f}x its {claim.x}): {claim.y} {interval}")
            verdicts.append(judge(interval, "difference_at_most", 0.0))
    if not measured:
        measured.append(f"fewer {claim.x} than every front arm")
    return Verdict(claim, measured, combine(verdicts))

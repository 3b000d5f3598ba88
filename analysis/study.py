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
and ``tuning_seeds``: each arm is searched on the tuning seeds (``analysis/tuner.py``) by
``searcher`` (``gp``, the default; ``tpe``, ``random``, ``coordinate``) within its ``budget``
of points (study-wide or per arm), ``round_size`` points a round, the searcher seeded with
``search_seed``; an arm may name ``anchors``, points every search runs in its first round as
controls. Then each tuned arm's winner runs on ``seeds``, the judging seeds, which must not
repeat a tuning seed; ``seeds: {first: [2, 3, 4], max: 8}`` adds seeds in rounds while a claim
is unresolved (``analysis/study_plan.py``). Claims are judged on the judging runs only, so the
seeds that picked a winner never judge it.

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
every condition is underpowered (inconclusive where it has no margin).

Where both arms ran the same seeds (two or more), they started from the same weights and saw
the same data order, so the **paired** interval decides: the per-seed differences (or
ratios) ``arm_s - baseline_s``, their mean, and Student's t with ``n - 1`` degrees of freedom
around their standard error (on the seeds both ran); the unpaired interval is printed
beside it. Each condition also reports the smallest difference its seeds resolve (the
interval's half-width) beside the claim's **margin**, the smallest effect it is about (the
claim's ``margin``, else the threshold's distance from no effect): an inconclusive condition
whose seeds cannot resolve the margin is **underpowered** (more seeds would decide it); one
that resolves it but straddles the threshold stays **inconclusive**. A claim whose arm (or
baseline) has no finished run is **not run**; in a tuned study, a claim on an arm that is
not tuned (search unfinished, a dimension not bracketed, or an anchor better than the
winner) is **not tuned**, never holds or fails.
"""

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from analysis.runs import parse_reduction
from analysis.search_space import Dimension, Range, SearchSpace, parse_anchors, parse_search
from analysis.tuner import DEFAULT_ROUND_SIZE, DEFAULT_SEARCHER, SEARCHERS, Search
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
    #: The smallest effect the claim is about, which its seeds must resolve (else it is
    #: underpowered): by default the threshold's distance from no effect (0 for a
    #: difference, 1 for a ratio); give it where that distance is 0 ("ends lower than").
    margin: float | None = None

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
    #: Each tuned arm's search (every arm, in a tuned study): space, searcher, budget, anchors.
    searches: dict[str, Search] = field(default_factory=dict)
    #: Judging seeds to add, round by round, until every claim is resolved: at most this
    #: many judging seeds in all (``study.seeds: {first: [2, 3, 4], max: 8}``); None: no more.
    max_seeds: int | None = None
    #: A tuned study's token budget rule: this many tokens per model parameter (a ladder's).
    tokens_per_parameter: float | None = None
    #: A ladder's size (``model`` preset) whose searched settings are extrapolated, not searched.
    held_out: str | None = None

    @property
    def tuned(self) -> bool:
        return bool(self.searches)

    @property
    def spaces(self) -> dict[str, SearchSpace]:
        return {name: search.space for name, search in self.searches.items()}

    @classmethod
    def from_config(cls, node: Any) -> "StudySpec":
        """Check and convert a ``study`` block (a plain dict); mistakes name the key and the fix."""
        node = dict(node or {})
        arms, seeds = node.get("arms"), node.get("seeds")
        if not isinstance(arms, dict) or not arms:
            raise ConfigError("study.arms must map each arm's name to its list of overrides, e.g. {small: [batch.global_batch_size=16]}.")
        shared = parse_search(node.get("search"), "study.search")
        overrides, dimensions, extras = {}, {}, {}
        for name, entry in arms.items():
            overrides[name], own, extras[name] = _arm(name, entry)
            dimensions[name] = {**shared, **own}
        seeds, max_seeds = _judging_seeds(seeds)
        tuning_seeds = _seeds(node.get("tuning_seeds"), "study.tuning_seeds") if node.get("tuning_seeds") is not None else []
        searches = {}
        if any(dimensions.values()):
            searches = {name: _search(name, node, dimensions[name], overrides[name], extras[name]) for name in arms}
            if not tuning_seeds:
                raise ConfigError("study.tuning_seeds is missing: a study with a search needs the seeds it tunes on, e.g. [1], apart from study.seeds.")
            repeated = sorted(set(tuning_seeds) & set(seeds))
            if repeated:
                raise ConfigError(f"study.seeds repeats the tuning seeds {repeated}: winners are judged on other seeds; e.g. tuning_seeds [1], seeds [2, 3, 4].")
        elif tuning_seeds:
            raise ConfigError("study.tuning_seeds is set but nothing is searched: add study.search (or an arm's search), or drop tuning_seeds.")
        else:
            _no_search_settings(node, extras)
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
        held_out = _held_out(node.get("held_out"), {name: search.space for name, search in searches.items()})
        return cls(arms=overrides, seeds=seeds, claims=claims, columns=columns, tuning_seeds=tuning_seeds, searches=searches,
                   tokens_per_parameter=per_parameter, held_out=held_out, max_seeds=max_seeds)  # fmt: skip


#: Settings of an arm's search, given for the whole study or per arm (the arm's wins).
SEARCH_SETTINGS = ("searcher", "budget", "round_size", "search_seed")


def _search(name: str, node: dict, dimensions: dict[str, Dimension], overrides: list[str], own: dict[str, Any]) -> Search:
    """An arm's search from the study's settings and its own (``budget``, ``anchors``, ...)."""
    space = _space(name, dimensions, overrides)
    settings = {key: own[key] if key in own else node.get(key) for key in SEARCH_SETTINGS}
    where = {key: f"study.arms.{name}.{key}" if key in own else f"study.{key}" for key in SEARCH_SETTINGS}
    searcher = settings["searcher"] if settings["searcher"] is not None else DEFAULT_SEARCHER
    if searcher not in SEARCHERS:
        raise ConfigError(f"{where['searcher']}={searcher!r} is not a searcher; use one of {', '.join(SEARCHERS)} (gp is the default).")
    anchors = parse_anchors(own.get("anchors"), space, f"study.arms.{name}.anchors") if space.dimensions else ()
    budget, round_size, seed = settings["budget"], settings["round_size"], settings["search_seed"]
    for key, value in (("budget", budget), ("round_size", round_size), ("search_seed", seed)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < (0 if key == "search_seed" else 1)):
            raise ConfigError(f"{where[key]}={value!r} must be a whole number{' >= 0' if key == 'search_seed' else ' >= 1'}.")
    if space.dimensions and budget is None and searcher != "coordinate":
        raise ConfigError(f"study.arms.{name}: the {searcher} searcher needs a budget of tuning points (study.budget or"
                          f" study.arms.{name}.budget), e.g. budget: {max(8, len(anchors) + 4)}.")  # fmt: skip
    if space.dimensions and budget is not None and budget < len(anchors) + 1:
        raise ConfigError(f"{where['budget']}={budget} leaves no point to search beside the arm's {len(anchors)} anchor(s);"
                          f" give at least {len(anchors) + 1}.")  # fmt: skip
    return Search(space, searcher, budget, round_size or DEFAULT_ROUND_SIZE, seed or 0, anchors)


def _no_search_settings(node: dict, extras: dict[str, dict[str, Any]]) -> None:
    """A study without a search must not set how one would run (a sign of a missing search)."""
    given = [f"study.{key}" for key in SEARCH_SETTINGS if node.get(key) is not None]
    given += [f"study.arms.{name}.{key}" for name, own in extras.items() for key in own]
    if given:
        raise ConfigError(f"{', '.join(given)} set, but nothing is searched: add study.search (or an arm's search), or drop them.")


def _judging_seeds(node: Any) -> tuple[list[int], int | None]:
    """``seeds: [2, 3, 4]``, or ``seeds: {first: [2, 3, 4], max: 8}`` to add seeds until every
    claim is resolved."""
    if not isinstance(node, dict):
        return _seeds(node, "study.seeds"), None
    unknown = set(node) - {"first", "max"}
    if unknown or "first" not in node:
        raise ConfigError(f"study.seeds is a list of seeds or {{first: [2, 3, 4], max: 8}}; got {node!r}.")
    first, cap = _seeds(node["first"], "study.seeds.first"), node.get("max")
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < len(first):
        raise ConfigError(f"study.seeds.max={cap!r} must be a whole number of judging seeds, at least the {len(first)} of study.seeds.first.")
    return first, cap


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


ARM_FIELDS = ("overrides", "search", "anchors", *SEARCH_SETTINGS)


def _arm(name: str, entry: Any) -> tuple[list[str], dict[str, Dimension], dict[str, Any]]:
    """An arm's fixed overrides, its own search and its own search settings: a list of
    overrides, or a mapping ``{overrides: [...], search: {...}, anchors: [...], budget: N}``."""
    key = f"study.arms.{name}"
    search, settings = {}, {}
    if isinstance(entry, dict):
        unknown = set(entry) - set(ARM_FIELDS)
        if unknown:
            raise ConfigError(f"{key}: unknown fields {sorted(unknown)}; an arm is a list of overrides or a mapping of {', '.join(ARM_FIELDS)}.")
        search = parse_search(entry.get("search"), f"{key}.search")
        settings = {field: entry[field] for field in ("anchors", *SEARCH_SETTINGS) if entry.get(field) is not None}
        entry = entry.get("overrides") or []
    if not isinstance(entry, list) or not all(isinstance(o, str) and "=" in o for o in entry):
        raise ConfigError(f"{key} must be a list of overrides such as 'optimizer.lr=1e-3', got {entry!r}.")
    return list(entry), search, settings


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
        margin = entry.get("margin")
        if margin is not None and (isinstance(margin, bool) or not isinstance(margin, int | float) or margin <= 0):
            raise ConfigError(f"{key}.margin={margin!r} must be a number > 0: the smallest effect the claim is about.")
        claim = Claim(claim=text, arm=_one_or_list(entry["arm"]), baseline=_one_or_list(entry["baseline"]),
                      expect=dict(expect), select=entry.get("select", "val/loss"), trend=trend, margin=margin)  # fmt: skip
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
    """The paired interval over per-seed differences (or ratios) ``arm_s - baseline_s`` on the
    seeds both ran: their mean and Student's t with n - 1 degrees of freedom; None unless
    they share two or more seeds (an arm given more seeds for another claim pairs on the
    shared ones)."""
    a, b = arm.by_seed(), baseline.by_seed()
    shared = sorted(set(a) & set(b)) if a is not None and b is not None else []
    if len(shared) < 2:
        return None
    per_seed = Spread(tuple(a[s] - b[s] if kind == "difference" else a[s] / b[s] for s in shared))
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


NOT_RUN, NOT_TUNED, UNDERPOWERED = "not run", "not tuned", "underpowered"
#: Verdicts that more judging seeds could still change.
UNRESOLVED = ("inconclusive", UNDERPOWERED)


def combine(verdicts: list[str]) -> str:
    """A claim is not run if an arm has no run, fails if any condition fails, holds if all
    hold, is underpowered if a condition is, else it is inconclusive."""
    if NOT_RUN in verdicts:
        return NOT_RUN
    if "fails" in verdicts:
        return "fails"
    if all(v == "holds" for v in verdicts):
        return "holds"
    return UNDERPOWERED if UNDERPOWERED in verdicts else "inconclusive"


def margin(claim: Claim, condition: str, threshold: float) -> float:
    """The smallest effect a condition is about: the claim's ``margin``, else the threshold's
    distance from no effect (0 for a difference, 1 for a ratio)."""
    if claim.margin is not None:
        return claim.margin
    return abs(threshold - (1.0 if condition.startswith("ratio") else 0.0))


def resolvable(interval: Interval) -> float | None:
    """The smallest difference the seeds resolve: the 95% interval's half-width."""
    return None if interval.low is None else (interval.high - interval.low) / 2


def powered(verdict: str, interval: Interval, smallest: float) -> str:
    """An inconclusive verdict whose seeds cannot resolve the claim's margin is underpowered
    (more seeds would decide it); one they can resolve is inconclusive (the effect sits at
    the threshold)."""
    half = resolvable(interval)
    if verdict == "inconclusive" and smallest > 0 and (half is None or half > smallest):
        return UNDERPOWERED
    return verdict


@dataclass(frozen=True)
class Verdict:
    claim: Claim
    measured: list[str]  # one line per condition: metric, interval, condition
    verdict: str


def judge_claim(claim: Claim, groups: dict[str, dict[str, Spread]], untuned: frozenset[str] = frozenset()) -> Verdict:
    """Judge a claim on the groups' spreads (arm -> metric -> Spread); a claim on an arm in
    ``untuned`` (a tuned study's arm whose search is not finished or not bracketed, or whose
    winner an anchor beat) is not tuned."""
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
            used, smallest = pair or unpaired, margin(claim, condition, float(threshold))
            half = resolvable(used)
            power = f"resolves ±{half:.3g}" if half is not None else "resolves nothing (one seed)"
            measured.append(f"{metric} {kind} {intervals} (want {symbol} {threshold:g}; n={arm.n}/{baseline.n}; {power},"
                            f" margin {smallest:g})")  # fmt: skip
            verdicts.append(powered(judge(used, condition, float(threshold)), used, smallest))
    not_tuned = sorted({arm_name, baseline_name} & untuned)
    if not_tuned:
        measured.append(f"{', '.join(not_tuned)} not tuned (see the tuning table)")
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

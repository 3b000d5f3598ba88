"""A study preset: its arms x seeds, its search, and the claims it tests, parsed and checked.

A study preset (``conf/sweep/NAME.yaml``) declares, under ``study``:

- ``arms``: named lists of overrides (``constant_16: [+technique=constant_batch, ...]``);
- ``seeds``: the seeds every arm runs with;
- ``columns`` (optional): extra report columns, a final value, ``max(KEY)`` / ``min(KEY)``
  over the run (``max(stability/loss_spike_ratio)``) or ``spikes(KEY>T)``, the number of
  times KEY rose above T;
- ``claims``: what the study tests, each comparing one arm with a baseline arm on the
  final value of a metric through a named test (``study/claim_tests.py``: ``lower_than``
  / ``higher_than``, superiority; ``no_worse_than``, non-inferiority; ``within``,
  equivalence; each also on the ratio, ``ratio_lower_than``, ...), e.g. "``adaptive`` ends no
  more than 0.01 nats above ``constant_16`` with less than 0.7 of its optimizer steps"::

      claims:
        - claim: adaptive is no worse than constant_16 (by 0.01) with < 0.7 of its steps
          arm: adaptive
          baseline: constant_16
          expect:
            val/loss: {no_worse_than: 0.01}
            steps: {ratio_lower_than: 0.7}

``arm`` and ``baseline`` may also list several arms (a tuning grid: ``arm: [muon_lr2e-3,
muon_lr4e-3]``): the claim then compares the best of each list, the arm with the lowest
mean ``select`` metric (``val/loss`` unless given). Picking the best on the same seeds that
judge it favours the winner slightly; the verdict line names the arms that were picked.

A claim may instead place an arm against a front of other arms (``front: [constant_16,
constant_32, ...]``, with ``x: steps`` and ``y: val/loss``): the arm is below the front
(holds) when it ends lower on ``y`` than every front arm that needed no more ``x``; it is
dominated (fails) when one of those ends lower than it; otherwise it lies on the front
within the seed spread (inconclusive).

A **tuned** study also declares a search space (``study/search_space.py``), shared
under ``study.search`` and per arm (an arm is then ``{overrides: [...], search: {...}}``),
and ``tuning_seeds``: each arm is searched on the tuning seeds (``study/tuner.py``) by
``searcher`` (``gp``, the default; ``tpe``, ``random``, ``coordinate``) within its ``budget``
of points (study-wide or per arm), ``round_size`` points a round, the searcher seeded with
``search_seed``; an arm may name ``anchors``, points every search runs in its first round as
controls; in a ladder, ``previous_size_anchor: true`` adds the same arm's winner at the next
smaller size to each size's anchors (that size's search then waits for the smaller one's).
Then each tuned arm's winner runs on ``seeds``, the judging seeds, which must not
repeat a tuning seed; ``seeds: {first: [2, 3, 4], max: 8}`` adds seeds in rounds while a claim
is unresolved (``study/plan.py``), its tests' levels spent over the looks. Claims are judged on the judging runs only, so the
seeds that picked a winner never judge it.

A tuned study crossed with model sizes (a ladder) may hold one size out of the search
(``held_out: ladder_2_1m``, a value of the swept ``model``): its searched settings are not
searched but follow a power law in the parameter count, fitted to the other sizes' winners
(Charles et al. 2025's way to set a large model's hyperparameters from small runs; a list
follows most sizes' winner, ``study/setting_laws.py``), and it
runs on the judging seeds after every other size has been judged
(``++study.phase=held_out``), so a prediction of its loss can be written first.

The study sweeper (``hydra_plugins/study_sweeper``) turns arms x seeds into jobs; the
report groups finished runs by arm (or, in any other sweep, by their overrides less the
seed) and judges each claim here.
Verdicts on the claims: ``study/verdicts.py``.
"""

from dataclasses import dataclass, field
from typing import Any

from analysis.runs import parse_reduction
from common.errors import ConfigError
from common.overrides import override_key
from study.claim_tests import BETTER, CONDITIONS, RETIRED, Condition
from study.search_space import Dimension, SearchSpace, parse_anchors, parse_search
from study.selection import DEFAULT_REGRET_MARGIN
from study.sequential import DEFAULT_SPENDING, SPENDING
from study.tuner import DEFAULT_ROUND_SIZE, DEFAULT_SEARCHER, SEARCHERS, Search

#: What a trend claim's slope is taken against (``study/trend.py``).
TREND_AXES = ("params",)
#: The front claim's test: the arm ends lower than a front arm.
LOWER = Condition("lower_than", 0.0)


@dataclass(frozen=True)
class Claim:
    """A claim of the study: ``arm`` against ``baseline``, one condition per metric; or,
    with ``front``, ``arm`` against the front of those arms in the (``x``, ``y``) plane."""

    claim: str
    arm: str | list[str]
    baseline: str | list[str] | None = None
    #: Each metric's tests (``study/claim_tests.py``).
    expect: dict[str, tuple[Condition, ...]] = field(default_factory=dict)
    front: list[str] = field(default_factory=list)
    x: str = "steps"
    y: str = "val/loss"
    #: The metric that picks the best of a list of arms (lowest mean).
    select: str = "val/loss"
    #: A trend claim: the x its difference's slope is taken against (``params``: log10 N).
    trend: str | None = None
    #: The smallest effect the claim is about, which its seeds must resolve (else it is
    #: underpowered): by default the distance of the test's region from no effect; give it
    #: where that distance is 0 (plain superiority, "ends lower than").
    margin: float | None = None
    #: Which way is better on the claim's metrics (what "no worse" means): lower or higher.
    better: str = "lower"

    @property
    def arms(self) -> list[str]:
        return [*arm_names(self.arm), *arm_names(self.baseline), *self.front]

    @property
    def metrics(self) -> list[str]:
        if self.front:
            return [self.x, self.y]
        return list(dict.fromkeys([*self.expect, self.select]))


def arm_names(arms: str | list[str] | None) -> list[str]:
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
    #: How the tests' levels are spent over the looks when seeds are added (``study/sequential.py``).
    error_control: str = DEFAULT_SPENDING
    #: The number of judging seeds at each planned look (the first seeds', ..., ``max_seeds``).
    looks: tuple[int, ...] = ()
    #: A tuned study's token budget rule: this many tokens per model parameter (a ladder's).
    tokens_per_parameter: float | None = None
    #: A ladder's size (``model`` preset) whose searched settings are extrapolated, not searched.
    held_out: str | None = None
    #: Where the searches' record is kept (``study/search_record.py``): None, the sweep folder's journal.
    storage: str | None = None

    @property
    def tuned(self) -> bool:
        return bool(self.searches)

    @property
    def other_seeds(self) -> set[int]:
        """The seeds that are not judging seeds: tuning and finalist seeds."""
        return {*self.tuning_seeds, *(seed for search in self.searches.values() for seed in search.finalist_seeds)}

    @property
    def spaces(self) -> dict[str, SearchSpace]:
        return {name: search.space for name, search in self.searches.items()}

    @classmethod
    def from_config(cls, node: Any) -> "StudySpec":
        """Check and convert a ``study`` block (a plain dict); mistakes name the key and the fix."""
        node = dict(node or {})
        arms, seeds = node.get("arms"), node.get("seeds")
        if not isinstance(arms, dict) or not arms:
            raise ConfigError(
                "study.arms must map each arm's name to its list of overrides, e.g. {small: [batch.global_batch_size=16]}."
            )
        shared = parse_search(node.get("search"), "study.search")
        overrides, dimensions, extras = {}, {}, {}
        for name, entry in arms.items():
            overrides[name], own, extras[name] = _arm(name, entry)
            dimensions[name] = {**shared, **own}
        seeds, max_seeds, error_control, looks = _judging_seeds(seeds)
        tuning_seeds = (
            _seeds(node.get("tuning_seeds"), "study.tuning_seeds") if node.get("tuning_seeds") is not None else []
        )
        searches = {}
        if any(dimensions.values()):
            reserved = {*tuning_seeds, *seeds}
            searches = {
                name: _search(name, node, dimensions[name], overrides[name], extras[name], reserved) for name in arms
            }
            if not tuning_seeds:
                raise ConfigError(
                    "study.tuning_seeds is missing: a study with a search needs the seeds it tunes on, e.g. [1], apart from study.seeds."
                )
            repeated = sorted(set(tuning_seeds) & set(seeds))
            if repeated:
                raise ConfigError(
                    f"study.seeds repeats the tuning seeds {repeated}: winners are judged on other seeds; e.g. tuning_seeds [1], seeds [2, 3, 4]."
                )
            finalist_seeds = {seed for search in searches.values() for seed in search.finalist_seeds}
            repeated = sorted(finalist_seeds & set(seeds + tuning_seeds))
            if repeated:
                raise ConfigError(
                    f"study.finalists.seeds repeats {repeated}, a tuning or judging seed: finalists run again on seeds of their own,"
                    " e.g. [21, 22]."
                )
        elif tuning_seeds:
            raise ConfigError(
                "study.tuning_seeds is set but nothing is searched: add study.search (or an arm's search), or drop tuning_seeds."
            )
        else:
            _no_search_settings(node, extras)
            if max_seeds is not None:
                raise ConfigError(
                    f"study.seeds.max: only a tuned study adds judging seeds in rounds; give study.seeds as a list, e.g. {seeds}."
                )
        claims = [_claim(index, entry, arms) for index, entry in enumerate(node.get("claims") or [])]
        columns = list(node.get("columns") or [])
        for column in columns:
            try:
                parse_reduction(str(column))
            except ValueError as error:
                raise ConfigError(f"study.columns: {error}.") from None
        per_parameter = node.get("tokens_per_parameter")
        if per_parameter is not None and (
            isinstance(per_parameter, bool) or not isinstance(per_parameter, int | float) or per_parameter <= 0
        ):
            raise ConfigError(
                f"study.tokens_per_parameter={per_parameter!r} must be a number > 0 (or null: the config's token_budget)."
            )
        held_out = _held_out(node.get("held_out"), {name: search.space for name, search in searches.items()})
        storage = node.get("storage")
        if storage is not None and (not isinstance(storage, str) or not storage or not searches):
            raise ConfigError(
                f"study.storage={storage!r} must be a journal file path or a storage URL (sqlite:///study.db), in a study"
                " with a search; or null for the sweep folder's journal."
            )
        return cls(
            arms=overrides,
            seeds=seeds,
            claims=claims,
            columns=columns,
            tuning_seeds=tuning_seeds,
            searches=searches,
            tokens_per_parameter=per_parameter,
            held_out=held_out,
            max_seeds=max_seeds,
            error_control=error_control,
            looks=looks,
            storage=storage,
        )


#: Settings of an arm's search, given for the whole study or per arm (the arm's wins).
SEARCH_SETTINGS = ("searcher", "budget", "round_size", "search_seed", "finalists", "previous_size_anchor")


def _search(
    name: str,
    node: dict,
    dimensions: dict[str, Dimension],
    overrides: list[str],
    own: dict[str, Any],
    reserved: set[int] = frozenset(),
) -> Search:
    """An arm's search from the study's settings and its own (``budget``, ``anchors``, ...)."""
    space = _space(name, dimensions, overrides)
    settings = {key: own[key] if key in own else node.get(key) for key in SEARCH_SETTINGS}
    where = {key: f"study.arms.{name}.{key}" if key in own else f"study.{key}" for key in SEARCH_SETTINGS}
    searcher = settings["searcher"] if settings["searcher"] is not None else DEFAULT_SEARCHER
    if searcher not in SEARCHERS:
        raise ConfigError(
            f"{where['searcher']}={searcher!r} is not a searcher; use one of {', '.join(SEARCHERS)} (gp is the default)."
        )
    anchors = parse_anchors(own.get("anchors"), space, f"study.arms.{name}.anchors") if space.dimensions else ()
    budget, round_size, seed = settings["budget"], settings["round_size"], settings["search_seed"]
    for key, value in (("budget", budget), ("round_size", round_size), ("search_seed", seed)):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < (0 if key == "search_seed" else 1)
        ):
            raise ConfigError(
                f"{where[key]}={value!r} must be a whole number{' >= 0' if key == 'search_seed' else ' >= 1'}."
            )
    if space.dimensions and budget is None and searcher != "coordinate":
        raise ConfigError(
            f"study.arms.{name}: the {searcher} searcher needs a budget of tuning points (study.budget or"
            f" study.arms.{name}.budget), e.g. budget: {max(8, len(anchors) + 4)}."
        )
    if space.dimensions and budget is not None and budget < len(anchors) + 1:
        raise ConfigError(
            f"{where['budget']}={budget} leaves no point to search beside the arm's {len(anchors)} anchor(s);"
            f" give at least {len(anchors) + 1}."
        )
    finalists = _finalists(settings["finalists"], where["finalists"], reserved)
    previous = settings["previous_size_anchor"]
    if previous is not None and not isinstance(previous, bool):
        raise ConfigError(
            f"{where['previous_size_anchor']}={previous!r} must be true or false: whether each size's search"
            " anchors on the same arm's winner at the next smaller size."
        )
    return Search(
        space,
        searcher,
        budget,
        round_size or DEFAULT_ROUND_SIZE,
        seed or 0,
        anchors,
        finalists.count,
        finalists.seeds,
        bool(previous),
        finalists.first,
        finalists.margin,
    )


@dataclass(frozen=True)
class Finalists:
    """How an arm's winner is picked (``study/selection.py``): ``count`` best points by the
    surrogate, run with the anchors on ``seeds``, the first ``first`` of them always (None: all)."""

    count: int = 0
    seeds: tuple[int, ...] = ()
    first: int | None = None
    margin: float = DEFAULT_REGRET_MARGIN


FINALIST_EXAMPLE = "{count: 3, seeds: {first: [21, 22], max: 6}, margin: 0.005}"


def _finalists(node: Any, key: str, reserved: set[int]) -> Finalists:
    """``finalists: {count: 3, seeds: {first: [21, 22], max: 6}, margin: 0.005}``: how many of the
    best points (by the surrogate) run again with the anchors; on the first seeds, then on as many
    more (numbered on from the last, skipping tuning and judging seeds) as order two candidates
    ``margin`` apart, up to ``max`` in all. ``seeds: [21, 22]`` runs those, no more. None by default."""
    if node is None:
        return Finalists()
    if not isinstance(node, dict) or not {"count", "seeds"} <= set(node) <= {"count", "seeds", "margin"}:
        raise ConfigError(f"{key} must be {FINALIST_EXAMPLE} (margin optional); got {node!r}.")
    count, margin = node["count"], node.get("margin", DEFAULT_REGRET_MARGIN)
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ConfigError(f"{key}.count={count!r} must be a whole number >= 1: the best points that run again.")
    if isinstance(margin, bool) or not isinstance(margin, int | float) or not margin > 0:
        raise ConfigError(
            f"{key}.margin={margin!r} must be a number > 0: the regret (nats) the pick is sized to resolve."
        )
    seeds = node["seeds"]
    if not isinstance(seeds, dict):
        return Finalists(count, tuple(_seeds(seeds, f"{key}.seeds")), None, float(margin))
    if set(seeds) != {"first", "max"}:
        raise ConfigError(
            f"{key}.seeds must be a list or {{first: [...], max: N}}, e.g. {FINALIST_EXAMPLE}; got {seeds!r}."
        )
    first, most = _seeds(seeds["first"], f"{key}.seeds.first"), seeds["max"]
    if isinstance(most, bool) or not isinstance(most, int) or most < len(first):
        raise ConfigError(f"{key}.seeds.max={most!r} must be a whole number >= the {len(first)} first seeds.")
    taken = reserved | set(first)
    more = [s for s in range(max(first) + 1, max(first) + 1 + most + len(taken)) if s not in taken]
    return Finalists(count, (*first, *more[: most - len(first)]), len(first), float(margin))


def _no_search_settings(node: dict, extras: dict[str, dict[str, Any]]) -> None:
    """A study without a search must not set how one would run (a sign of a missing search)."""
    given = [f"study.{key}" for key in SEARCH_SETTINGS if node.get(key) is not None]
    given += [f"study.arms.{name}.{key}" for name, own in extras.items() for key in own]
    if given:
        raise ConfigError(
            f"{', '.join(given)} set, but nothing is searched: add study.search (or an arm's search), or drop them."
        )


def _judging_seeds(node: Any) -> tuple[list[int], int | None, str, tuple[int, ...]]:
    """``seeds: [2, 3, 4]``, or ``seeds: {first: [2, 3, 4], max: 8}`` to add seeds while a claim
    is unresolved, at planned looks (``looks``: the seed counts, by default the first seeds' and
    the cap) with the tests' levels spent over them (``error_control``, ``study/sequential.py``)."""
    if not isinstance(node, dict):
        seeds = _seeds(node, "study.seeds")
        return seeds, None, DEFAULT_SPENDING, (len(seeds),)
    unknown = set(node) - {"first", "max", "looks", "error_control"}
    if unknown or "first" not in node:
        raise ConfigError(f"study.seeds is a list of seeds or {{first: [2, 3, 4], max: 8}}; got {node!r}.")
    first, cap = _seeds(node["first"], "study.seeds.first"), node.get("max")
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < len(first):
        raise ConfigError(
            f"study.seeds.max={cap!r} must be a whole number of judging seeds, at least the {len(first)} of study.seeds.first."
        )
    spending = node.get("error_control", DEFAULT_SPENDING)
    if spending not in SPENDING:
        raise ConfigError(
            f"study.seeds.error_control={spending!r} is not an error control; use one of {', '.join(SPENDING)}"
            f" (alpha spending over the looks; {DEFAULT_SPENDING} is the default)."
        )
    looks = node.get("looks", sorted({len(first), cap}))
    valid = isinstance(looks, list) and all(isinstance(n, int) and not isinstance(n, bool) for n in looks)
    if not valid or looks[0] != len(first) or looks[-1] != cap or any(b <= a for a, b in zip(looks, looks[1:])):
        raise ConfigError(
            f"study.seeds.looks={looks!r} must be increasing seed counts from the {len(first)} first seeds to max"
            f" {cap}, e.g. [{len(first)}, {cap}]: the looks are planned, never sized from the data."
        )
    return first, cap, spending, tuple(looks)


def _held_out(name: Any, spaces: dict[str, SearchSpace]) -> str | None:
    """The held-out size: a model preset's name, in a study with a search (its settings follow
    laws fitted to the searched sizes' winners, ``study/setting_laws.py``)."""
    if name is None:
        return None
    if not isinstance(name, str) or not name:
        raise ConfigError(f"study.held_out={name!r} must name one of the ladder's model presets, e.g. ladder_2_1m.")
    if not spaces:
        raise ConfigError(
            "study.held_out needs a search (study.search): the held-out size's settings are fitted to the others' winners."
        )
    return name


def _seeds(seeds: Any, key: str) -> list[int]:
    if (
        not isinstance(seeds, list)
        or not seeds
        or not all(isinstance(s, int) for s in seeds)
        or len(set(seeds)) < len(seeds)
    ):
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
            raise ConfigError(
                f"{key}: unknown fields {sorted(unknown)}; an arm is a list of overrides or a mapping of {', '.join(ARM_FIELDS)}."
            )
        search = parse_search(entry.get("search"), f"{key}.search")
        settings = {field: entry[field] for field in ("anchors", *SEARCH_SETTINGS) if entry.get(field) is not None}
        entry = entry.get("overrides") or []
    if not isinstance(entry, list) or not all(isinstance(o, str) and "=" in o for o in entry):
        raise ConfigError(f"{key} must be a list of overrides such as 'optimizer.lr=1e-3', got {entry!r}.")
    return list(entry), search, settings


def _space(name: str, search: dict[str, Dimension], overrides: list[str]) -> SearchSpace:
    fixed = {override_key(o) for o in overrides}
    space = SearchSpace(tuple(search.values()))
    clash = sorted(fixed & set(space.keys))
    if clash:
        raise ConfigError(f"study.arms.{name} fixes {clash}, which its search also tunes: drop one of them.")
    return space


def _one_or_list(arms: Any) -> str | list[str]:
    return arms if isinstance(arms, str) else list(arms)


def _expect(key: str, expect: Any, better: str, trend: str | None) -> dict[str, tuple[Condition, ...]]:
    """A claim's tests by metric, each named for what it tests, its threshold of the right sign."""
    if not isinstance(expect, dict) or not expect:
        raise ConfigError(f"{key}.expect must map metrics to tests, e.g. {{val/loss: {{no_worse_than: 0.01}}}}.")
    parsed = {}
    for metric, conditions in expect.items():
        if not isinstance(conditions, dict) or not conditions:
            raise ConfigError(
                f"{key}.expect.{metric} must map tests to thresholds, e.g. {{lower_than: 0}}; the tests are {', '.join(CONDITIONS)}."
            )
        tests = []
        for name, threshold in conditions.items():
            if name in RETIRED:
                raise ConfigError(
                    f"{key}.expect.{metric}.{name} is ambiguous and retired: name the test, {RETIRED[name]}."
                )
            if name not in CONDITIONS:
                raise ConfigError(f"{key}.expect.{metric}.{name} is not a test; use one of {', '.join(CONDITIONS)}.")
            if isinstance(threshold, bool) or not isinstance(threshold, int | float):
                raise ConfigError(f"{key}.expect.{metric}.{name}={threshold!r} must be a number.")
            if trend is not None and name.startswith("ratio_"):
                raise ConfigError(f"{key}.expect.{metric}.{name}: a trend claim tests a slope; drop the ratio_ prefix.")
            condition = Condition(name, float(threshold), better)
            try:
                condition.check(f"{key}.expect.{metric}")
            except ValueError as error:
                raise ConfigError(f"{error}.") from None
            tests.append(condition)
        parsed[metric] = tuple(tests)
    return parsed


def _claim(index: int, entry: Any, arms: dict[str, Any]) -> Claim:
    key = f"study.claims[{index}]"
    if (
        not isinstance(entry, dict)
        or "arm" not in entry
        or not ({"baseline", "expect"} <= set(entry) or "front" in entry)
    ):
        raise ConfigError(
            f"{key} needs arm, and baseline with expect (metric: {{condition: value}}) or front (a list of arms), got {entry!r}."
        )
    text = entry.get("claim") or f"{entry['arm']} vs {entry.get('baseline') or 'the front'}"
    if "front" in entry:
        claim = Claim(
            claim=text,
            arm=entry["arm"],
            front=list(entry["front"] or []),
            x=entry.get("x", "steps"),
            y=entry.get("y", "val/loss"),
        )
        if not claim.front or not isinstance(claim.arm, str):
            raise ConfigError(f"{key}: a front claim needs one arm and front, the list of arms that make the front.")
    else:
        trend = entry.get("trend")
        if trend is not None and (
            trend not in TREND_AXES or not isinstance(entry["arm"], str) or not isinstance(entry["baseline"], str)
        ):
            raise ConfigError(f"{key}.trend={trend!r}: a trend claim takes one arm, one baseline and trend: params.")
        better = entry.get("better", "lower")
        if better not in BETTER:
            raise ConfigError(
                f"{key}.better={better!r} must be lower or higher: which way is better on the claim's metrics."
            )
        expect = _expect(key, entry["expect"], better, trend)
        margin = entry.get("margin")
        if margin is not None and (isinstance(margin, bool) or not isinstance(margin, int | float) or margin <= 0):
            raise ConfigError(f"{key}.margin={margin!r} must be a number > 0: the smallest effect the claim is about.")
        claim = Claim(
            claim=text,
            arm=_one_or_list(entry["arm"]),
            baseline=_one_or_list(entry["baseline"]),
            expect=expect,
            select=entry.get("select", "val/loss"),
            trend=trend,
            margin=margin,
            better=better,
        )
    for arm in claim.arms:
        if arm not in arms:
            raise ConfigError(f"{key} names {arm!r}, which is not an arm; the arms are {sorted(arms)}.")
    return claim

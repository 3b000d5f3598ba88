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

from dataclasses import dataclass, field, fields
from typing import Any

from analysis.runs import parse_reduction
from common.errors import ConfigError
from common.overrides import override_key
from settings.typed import settings_from_config
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
        if not isinstance((node or {}).get("arms"), dict) or not node["arms"]:
            raise ConfigError(
                "study.arms must map each arm's name to its list of overrides, e.g. {small: [batch.global_batch_size=16]}."
            )
        block = settings_from_config(StudyBlock, node, "study")
        shared = parse_search(block.search, "study.search")
        arms = {name: _arm(name, entry) for name, entry in block.arms.items()}
        seeds, max_seeds, error_control, looks = _judging_seeds(block.seeds)
        tuning_seeds = _seeds(block.tuning_seeds, "study.tuning_seeds") if block.tuning_seeds is not None else []
        searches = {}
        if shared or any(arm.search for arm in arms.values()):
            reserved = {*tuning_seeds, *seeds}
            searches = {name: _search(name, block, arm, shared, reserved) for name, arm in arms.items()}
            _check_tuning_seeds(tuning_seeds, seeds, searches)
        elif tuning_seeds:
            raise ConfigError(
                "study.tuning_seeds is set but nothing is searched: add study.search (or an arm's search), or drop tuning_seeds."
            )
        else:
            _no_search_settings(block, arms)
            if max_seeds is not None:
                raise ConfigError(
                    f"study.seeds.max: only a tuned study adds judging seeds in rounds; give study.seeds as a list, e.g. {seeds}."
                )
        claims = [_claim(index, entry, arms) for index, entry in enumerate(block.claims or [])]
        for column in block.columns or []:
            try:
                parse_reduction(column)
            except ValueError as error:
                raise ConfigError(f"study.columns: {error}.") from None
        if block.tokens_per_parameter is not None and block.tokens_per_parameter <= 0:
            raise ConfigError(
                f"study.tokens_per_parameter={block.tokens_per_parameter!r} must be a number > 0 (or null: the config's token_budget)."
            )
        if block.storage is not None and (not block.storage or not searches):
            raise ConfigError(
                f"study.storage={block.storage!r} must be a journal file path or a storage URL (sqlite:///study.db), in a study"
                " with a search; or null for the sweep folder's journal."
            )
        return cls(
            arms={name: arm.overrides for name, arm in arms.items()},
            seeds=seeds,
            claims=claims,
            columns=list(block.columns or []),
            tuning_seeds=tuning_seeds,
            searches=searches,
            tokens_per_parameter=block.tokens_per_parameter,
            held_out=_held_out(block.held_out, searches),
            max_seeds=max_seeds,
            error_control=error_control,
            looks=looks,
            storage=block.storage,
        )


def _check_tuning_seeds(tuning_seeds: list[int], seeds: list[int], searches: dict[str, "Search"]) -> None:
    """A tuned study tunes, picks finalists and judges on three disjoint sets of seeds."""
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


@dataclass(frozen=True, kw_only=True)
class SearchSettings:
    """How an arm is searched, given for the whole study (``study.budget``) or per arm
    (``study.arms.NAME.budget``, which wins); None where not given (the defaults are the
    searcher's own, ``study/tuner.py``)."""

    searcher: str | None = None
    budget: int | None = None
    round_size: int | None = None
    search_seed: int | None = None
    finalists: dict | None = None
    previous_size_anchor: bool | None = None


@dataclass(frozen=True, kw_only=True)
class StudyBlock(SearchSettings):
    """The ``study`` block's keys, typed by the run's own reader (``settings/typed.py``): an
    unknown key or a value of the wrong type is one ``error:`` line naming it. The parts with a
    structure of their own (arms, seeds, claims, search, finalists) are parsed below."""

    arms: dict
    seeds: list[int] | dict
    #: The arm and phase of one job (the sweeper sets them; a saved run's config holds them).
    arm: str | None = None
    phase: str | None = None
    claims: list | None = None
    columns: list[str] | None = None
    tuning_seeds: list[int] | None = None
    search: dict | None = None
    tokens_per_parameter: float | None = None
    held_out: str | None = None
    storage: str | None = None


@dataclass(frozen=True, kw_only=True)
class ArmBlock(SearchSettings):
    """An arm given as a mapping: its fixed overrides, its own search and anchors, and its own
    search settings."""

    overrides: list[str] | None = None
    search: dict | None = None
    anchors: list | None = None


@dataclass(frozen=True)
class Arm:
    """An arm as the study uses it."""

    overrides: list[str]
    search: dict[str, Dimension]
    settings: SearchSettings
    anchors: list | None = None


#: Settings of an arm's search, given for the whole study or per arm (the arm's wins).
SEARCH_SETTINGS = tuple(field.name for field in fields(SearchSettings))


def _search(
    name: str, block: StudyBlock, arm: Arm, shared: dict[str, Dimension], reserved: set[int] = frozenset()
) -> Search:
    """An arm's search from the study's settings and its own (``budget``, ``anchors``, ...)."""
    space = _space(name, {**shared, **arm.search}, arm.overrides)
    own = {key for key in SEARCH_SETTINGS if getattr(arm.settings, key) is not None}
    settings = {key: getattr(arm.settings if key in own else block, key) for key in SEARCH_SETTINGS}
    where = {key: f"study.arms.{name}.{key}" if key in own else f"study.{key}" for key in SEARCH_SETTINGS}
    searcher = settings["searcher"] if settings["searcher"] is not None else DEFAULT_SEARCHER
    if searcher not in SEARCHERS:
        raise ConfigError(
            f"{where['searcher']}={searcher!r} is not a searcher; use one of {', '.join(SEARCHERS)} (gp is the default)."
        )
    anchors = parse_anchors(arm.anchors, space, f"study.arms.{name}.anchors") if space.dimensions else ()
    budget, round_size, seed = settings["budget"], settings["round_size"], settings["search_seed"]
    for key, value, least in (("budget", budget, 1), ("round_size", round_size, 1), ("search_seed", seed, 0)):
        if value is not None and value < least:
            raise ConfigError(f"{where[key]}={value!r} must be a whole number >= {least}.")
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
    return Search(
        space,
        searcher,
        budget,
        round_size or DEFAULT_ROUND_SIZE,
        seed or 0,
        anchors,
        finalists.count,
        finalists.seeds,
        bool(settings["previous_size_anchor"]),
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


def _no_search_settings(block: StudyBlock, arms: dict[str, Arm]) -> None:
    """A study without a search must not set how one would run (a sign of a missing search)."""
    given = [f"study.{key}" for key in SEARCH_SETTINGS if getattr(block, key) is not None]
    given += [
        f"study.arms.{name}.{key}"
        for name, arm in arms.items()
        for key in ("anchors", *SEARCH_SETTINGS)
        if getattr(arm.settings if key != "anchors" else arm, key) is not None
    ]
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


def _held_out(name: Any, searches: dict[str, Search]) -> str | None:
    """The held-out size: a model preset's name, in a study with a search (its settings follow
    laws fitted to the searched sizes' winners, ``study/setting_laws.py``)."""
    if name is None:
        return None
    if not isinstance(name, str) or not name:
        raise ConfigError(f"study.held_out={name!r} must name one of the ladder's model presets, e.g. ladder_2_1m.")
    if not searches:
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


def _arm(name: str, entry: Any) -> Arm:
    """An arm: a list of overrides, or a mapping ``{overrides: [...], search: {...}, anchors:
    [...], budget: N}`` (``ArmBlock``)."""
    key = f"study.arms.{name}"
    if isinstance(entry, dict):
        block = settings_from_config(ArmBlock, entry, key)
        arm = Arm(block.overrides or [], parse_search(block.search, f"{key}.search"), block, block.anchors)
    else:
        arm = Arm(entry, {}, SearchSettings())
    if not isinstance(arm.overrides, list) or not all(isinstance(o, str) and "=" in o for o in arm.overrides):
        raise ConfigError(f"{key} must be a list of overrides such as 'optimizer.lr=1e-3', got {arm.overrides!r}.")
    return arm


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

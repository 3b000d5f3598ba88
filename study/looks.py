"""Judging in looks: which judging seeds each look saw, and each claim's verdict at the look that decided it.

A tuned study with ``study.seeds: {first: [2, 3, 4], max: 8}`` judges its claims on the first
seeds, then, while a claim is unresolved, adds seeds (numbered on from the largest seed the
study uses) up to the next planned look: the cap, or each size of ``study.seeds.looks``. Each
look judges at its share of every test's level (``study/sequential.py``), so the looks do
not inflate the error rate; a claim that holds or fails at a look is decided there, and later
seeds do not judge it again. The looks' sizes are planned, never read from the data: sizing
the next look from the interim spread (as many seeds as the margin then seems to need) let a
false superiority claim hold in 2.60% of 100,000 simulated studies at a 2.5% level. The plan (which
seeds to run next, ``study/plan.py``) and the report replay the same looks from the
same finished runs, so they cannot disagree on a verdict.

A study with a fixed list of judging seeds has one look, at the full level, over every
judging seed its arms ran.
"""

from dataclasses import dataclass, field

from study.claim_tests import Spread
from study.preset import Claim, StudySpec
from study.sequential import nominal_levels
from study.trend import judge_trend, points_of
from study.verdicts import FEW_SIZES, UNRESOLVED, Verdict, judge_claim

Groups = dict[str, dict[str, Spread]]  # arm -> metric -> its final values over seeds


@dataclass(frozen=True)
class Judgement:
    """The looks replayed so far over one or more base jobs' judging runs."""

    #: Per base job, each claim's verdict (None for a trend claim, judged across them).
    verdicts: list[list[Verdict | None]]
    #: The number of judging seeds at each look so far.
    sizes: tuple[int, ...]
    #: The seeds the next look needs (all of them, in order), or None when judging is over.
    next_seeds: list[int] | None
    #: Each trend claim's verdict (by its index) over the base jobs, where their model sizes were given.
    trends: dict[int, Verdict] = field(default_factory=dict)


def judging_order(spec: StudySpec) -> list[int]:
    """The judging seeds in the order looks add them: the first ones, then the numbers after the
    largest tuning or first judging seed, skipping the finalist seeds."""
    if spec.max_seeds is None:
        return list(spec.seeds)
    start, others = max([*spec.tuning_seeds, *spec.seeds]) + 1, spec.other_seeds
    added = [seed for seed in range(start, start + spec.max_seeds + len(others)) if seed not in others]
    return [*spec.seeds, *added[: spec.max_seeds - len(spec.seeds)]]


def judge_in_looks(
    spec: StudySpec, bases: list[Groups], untuned: frozenset[str] = frozenset(), sizes: list[float] | None = None
) -> Judgement:
    """Replay the looks over each base job's groups (every judging seed they ran). With the
    base jobs' model sizes (``sizes``, a ladder's parameter counts) the trend claims are judged
    across them at each look too, and seeds are added while one is unresolved."""
    claims = [(i, claim) for i, claim in enumerate(spec.claims) if not claim.trend]
    trends = [(i, claim) for i, claim in enumerate(spec.claims) if claim.trend] if sizes is not None else []
    if spec.max_seeds is None:  # one look, every seed that ran
        verdicts = [_judge_all(spec, groups, claims, untuned, None) for groups in bases]
        return Judgement(verdicts, (len(spec.seeds),), None, _trends(trends, sizes, bases, untuned, None, spec))
    order = judging_order(spec)
    decided: list[dict[int, Verdict]] = [{} for _ in bases]
    trended: dict[int, Verdict] = {}
    looks = [spec.looks[0]]
    while True:
        seeds = order[: looks[-1]]
        complete = all(_ran(groups, seeds) for groups in bases)
        fractions = tuple(n / spec.max_seeds for n in looks)
        latest, on_seeds = [], []
        for groups, done in zip(bases, decided):
            on_seeds.append({arm: {m: s.on(seeds) for m, s in metrics.items()} for arm, metrics in groups.items()})
            look = _judge_all(spec, on_seeds[-1], [(i, c) for i, c in claims if i not in done], untuned, fractions)
            latest.append(look)
            if complete:
                done.update({i: v for i, v in enumerate(look) if v is not None and v.verdict not in UNRESOLVED})
        open_trends = [(i, c) for i, c in trends if i not in trended]
        trend_look = _trends(open_trends, sizes, on_seeds, untuned, fractions, spec)
        if complete:
            trended.update({i: v for i, v in trend_look.items() if v.verdict not in (*UNRESOLVED, FEW_SIZES)})
        verdicts = [[done.get(i, look[i]) for i in range(len(spec.claims))] for done, look in zip(decided, latest)]
        found = {**trend_look, **trended}
        if not complete:
            return Judgement(verdicts, tuple(looks), seeds, found)
        unresolved = any(i not in done and not claim.front for done in decided for i, claim in claims)
        # A trend over too few sizes is shown on every look's seeds but asks for none: seeds add no size.
        unresolved = unresolved or any(i not in trended and trend_look[i].verdict != FEW_SIZES for i, _ in trends)
        if not unresolved or len(looks) == len(spec.looks):
            return Judgement(verdicts, tuple(looks), None, found)
        looks.append(spec.looks[len(looks)])


def _trends(
    claims: list[tuple[int, Claim]],
    sizes: list[float] | None,
    bases: list[Groups],
    untuned: frozenset[str],
    fractions: tuple[float, ...] | None,
    spec: StudySpec,
) -> dict[int, Verdict]:
    """Each listed trend claim's verdict over the base jobs at the last of these looks."""
    found = {}
    for i, claim in claims:
        verdict = judge_trend(claim, points_of(claim, sizes, bases), untuned, _level(fractions, spec.error_control))
        found[i] = _at_look(verdict, fractions, spec)
    return found


def _ran(groups: Groups, seeds: list[int]) -> bool:
    """Every arm's every metric has a value on each of these seeds."""
    return all(set(seeds) <= set(spread.by_seed() or {}) for metrics in groups.values() for spread in metrics.values())


def _judge_all(
    spec: StudySpec,
    groups: Groups,
    claims: list[tuple[int, Claim]],
    untuned: frozenset[str],
    fractions: tuple[float, ...] | None,
) -> list[Verdict | None]:
    """Each listed claim's verdict at the last of these looks (None for the others)."""
    found: list[Verdict | None] = [None] * len(spec.claims)
    level = _level(fractions, spec.error_control)
    for i, claim in claims:
        found[i] = _at_look(judge_claim(claim, groups, untuned, level), fractions, spec)
    return found


def _at_look(verdict: Verdict, fractions: tuple[float, ...] | None, spec: StudySpec) -> Verdict:
    """The verdict with the look it was made at, when seeds are added in looks."""
    if fractions is None:
        return verdict
    look = (
        f"look {len(fractions)} at {round(fractions[-1] * spec.max_seeds)} of at most"
        f" {spec.max_seeds} seeds ({spec.error_control} spending)"
    )
    return Verdict(verdict.claim, [*verdict.measured, look], verdict.verdict)


def _level(fractions: tuple[float, ...] | None, spending: str):
    """A test's nominal level at the last of these looks."""
    if fractions is None:
        return lambda alpha: alpha
    return lambda alpha: nominal_levels(alpha, fractions, spending)[-1]

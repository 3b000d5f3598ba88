"""Verdicts on a study's claims, from the seed spread of each arm's finished runs.

Each test is judged on the interval at its level (``study/claim_tests.py``): it **holds**
when the whole interval lies inside the claim's region, **fails** when none of it does, and
is **inconclusive** when the interval straddles the region's edge. Where both arms ran the
same seeds (two or more), they started from the same weights and saw the same data order, so
the **paired** estimate decides: the per-seed differences (or ratios), their mean and
Student's t with n - 1 degrees of freedom on the seeds both ran; otherwise the unpaired one,
with Welch's standard error and ``min(n_arm, n_baseline) - 1`` degrees of freedom. With a
single seed in either arm there is no spread to judge against, and every test is
underpowered (inconclusive where it has no margin).

Each test also reports the difference its seeds resolve at 80% power beside the claim's
**margin**, the smallest effect it is about (the claim's ``margin``, else the region's
distance from no effect): an inconclusive test whose seeds cannot resolve the margin is
**underpowered** (more seeds would decide it); one that resolves it but straddles the edge
stays **inconclusive**. Judging seeds added in rounds spend each test's level over the looks
(``study.seeds.error_control``, ``study/sequential.py``): a claim is decided at the first
look where it holds or fails, at that look's share of the level. A claim whose arm (or
baseline) has no finished run is **not run**; in a tuned study, a claim on an arm that is
not tuned (search unfinished, a dimension not bracketed, or an anchor better than the
winner) is **not tuned**, never holds or fails.
"""

from collections.abc import Callable
from dataclasses import dataclass

from study.claim_tests import ONE_SIDED_ALPHA, Condition, Estimate, Spread, paired, resolvable, unpaired, verdict
from study.preset import LOWER, Claim, arm_names

NOT_RUN, NOT_TUNED, UNDERPOWERED = "not run", "not tuned", "underpowered"
#: A trend claim over fewer sizes than a slope's interval needs (``study/trend.py``).
FEW_SIZES = "too few sizes"
#: Verdicts that more judging seeds could still change.
UNRESOLVED = ("inconclusive", UNDERPOWERED)
#: A look's nominal level for a test of the given overall level (the full level at a single look).
Level = Callable[[float], float]


def full_level(alpha: float) -> float:
    return alpha


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


def margin(claim: Claim, condition: Condition) -> float:
    """The smallest effect a condition is about: the claim's ``margin``, else the distance of
    the condition's region from no effect (0 for plain superiority)."""
    return claim.margin if claim.margin is not None else condition.margin()


def judged(estimate: Estimate, condition: Condition, smallest: float, alpha: float) -> str:
    """The condition's verdict; an unresolved one whose seeds cannot resolve the claim's margin
    at 80% power is underpowered (more seeds would decide it), one they can resolve stays
    inconclusive (the effect sits at the region's edge)."""
    found = verdict(estimate, condition, alpha)
    power = resolvable(estimate, condition, alpha)
    if found == "inconclusive" and smallest > 0 and (power is None or power > smallest):
        return UNDERPOWERED
    return found


def describe(
    estimates: str, estimate: Estimate, condition: Condition, alpha: float, smallest: float, of: str | None = None
) -> str:
    """One measured condition in words: the estimates with the intervals at the test's level,
    the test, and what the seeds resolve (``estimates``: how to print them, ``{}`` for the one
    judged)."""
    power = resolvable(estimate, condition, alpha)
    resolves = (
        f"resolves ±{power:.3g} at 80% power"
        if power is not None
        else "resolves nothing (no spread: 0 degrees of freedom)"
    )
    return f"{estimates} ({100 * (1 - 2 * alpha):.3g}% interval); {condition.words(alpha, of)}; {resolves}, margin {smallest:g}"


@dataclass(frozen=True)
class Verdict:
    claim: Claim
    measured: list[str]  # one line per condition: metric, test, interval
    verdict: str


def judge_claim(
    claim: Claim, groups: dict[str, dict[str, Spread]], untuned: frozenset[str] = frozenset(), level: Level = full_level
) -> Verdict:
    """Judge a claim on the groups' spreads (arm -> metric -> Spread), each test at ``level``
    of its own (a sequential look's share, ``study/sequential.py``); a claim on an arm in
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
        for condition in conditions:
            if arm is None or baseline is None:
                measured.append(f"{metric}: no finished run of {arm_name if arm is None else baseline_name} logged it")
                verdicts.append("inconclusive")
                continue
            pair, apart = paired(arm, baseline, condition.kind), unpaired(arm, baseline, condition.kind)
            alpha, smallest = level(condition.alpha), margin(claim, condition)
            shown = f"paired {pair.text(alpha)}, unpaired {apart.text(alpha)}" if pair else apart.text(alpha)
            measured.append(
                f"{metric} {condition.kind} {describe(shown, pair or apart, condition, alpha, smallest)}; n={arm.n}/{baseline.n}"
            )
            verdicts.append(judged(pair or apart, condition, smallest, alpha))
    not_tuned = sorted({arm_name, baseline_name} & untuned)
    if not_tuned:
        measured.append(f"{', '.join(not_tuned)} not tuned (see the tuning table)")
        return Verdict(claim, measured, NOT_TUNED)
    return Verdict(claim, measured, combine(verdicts))


def best(arms: str | list[str] | None, metric: str, groups: dict[str, dict[str, Spread]]) -> str:
    """The arm itself, or of a list the one with the lowest mean ``metric`` (the first if none
    finished)."""
    names = arm_names(arms)
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
            estimate = unpaired(arm[claim.y], other[claim.y], "difference")
            measured.append(
                f"vs {name} ({arm[claim.x].mean / other[claim.x].mean:.2f}x its {claim.x}): {claim.y} {estimate.text(ONE_SIDED_ALPHA)}"
            )
            verdicts.append(verdict(estimate, LOWER, ONE_SIDED_ALPHA))
    if not measured:
        measured.append(f"fewer {claim.x} than every front arm")
    return Verdict(claim, measured, combine(verdicts))

"""A tuned study's plan: the same rounds from the same finished jobs whoever asks, arms whose
search is not tuned are not judged (in a held-out ladder: run, but left out of the claims), judging seeds are added until the claims are resolved,
and an underpowered claim is reported as such (intervals against scipy's)."""

import math
import re

import numpy as np
import pytest
from scipy import stats

from common.errors import ConfigError
from study.claim_tests import Spread
from study.plan import JUDGE, TUNE, StudyPlan, TunedJob
from study.preset import StudySpec
from study.selection import UNDECIDED
from study.verdicts import UNDERPOWERED, judge_claim

LR_SEARCH = {"optimizer.lr": {"low": 1e-3, "high": 4e-3, "scale": "log", "step": 2, "min": 2.5e-4, "max": 3.2e-2}}


def spec(**study) -> StudySpec:
    node = {
        "searcher": "gp",
        "budget": 4,
        "round_size": 2,
        "tuning_seeds": [1],
        "seeds": {"first": [2, 3], "max": 6},
        "search": LR_SEARCH,
        "arms": {"base": [], "other": {"overrides": ["optimizer.beta2=0.95"], "anchors": [{"optimizer.lr": 1e-3}]}},
        "claims": [{"arm": "other", "baseline": "base", "expect": {"val/loss": {"no_worse_than": 0.01}}}],
    }
    return StudySpec.from_config({**node, **study})


def tune_loss(job: TunedJob) -> float:
    lr = 1e-3 * 2.0 ** job.point[0]
    return 2.0 + 0.05 * math.log2(lr / 4e-3) ** 2 + (0.02 if job.arm == "other" else 0.0)


def play(plan: StudyPlan, judge_loss, rounds: int = 50) -> list[list[TunedJob]]:
    """The study to its end: each round's jobs, each finished with its loss."""
    played = []
    for _ in range(rounds):
        jobs = plan.next_round()
        if not jobs:
            return played
        played.append(jobs)
        for job in jobs:
            plan.record(job, {"val/loss": tune_loss(job) if job.phase == TUNE else judge_loss(job)})
    raise AssertionError("the plan did not end")


def test_two_workers_plan_the_same_rounds_from_the_same_finished_jobs() -> None:
    first = StudyPlan(spec(), [([], ["base", "other"])])
    rounds = play(first, lambda job: 2.0 + 0.001 * job.seed)
    assert [job.phase for job in rounds[0]] == [TUNE] * 4 and rounds[0][2].point == (0,)  # other's anchor (1e-3) first
    # A second worker that starts late reads the same finished jobs in another order.
    for cut in range(len(rounds)):
        done = [job for r in rounds[:cut] for job in r]
        late = StudyPlan(spec(), [([], ["base", "other"])])
        for job in reversed(done):
            late.record(job, first.finished[job])
        assert late.next_round() == rounds[cut]


def test_seeds_are_added_at_the_planned_looks_while_a_claim_is_unresolved_and_stop_once_resolved() -> None:
    # A gap of 0.05 behind with a seed spread of 0.03: the first 2 seeds cannot resolve the 0.01 margin.
    noise = {2: 0.03, 3: -0.03, 4: 0.01, 5: -0.01, 6: 0.0, 7: 0.02}
    looks = {"first": [2, 3], "max": 6, "looks": [2, 4, 6]}
    plan = StudyPlan(spec(seeds=looks), [([], ["base", "other"])])
    rounds = play(plan, lambda job: 2.0 + (0.05 + noise[job.seed] if job.arm == "other" else 0.0))
    judged = [sorted({job.seed for job in r}) for r in rounds if r[0].phase == JUDGE]
    assert judged == [
        [2, 3],
        [4, 5],
        [6, 7],
    ]  # one round per planned look: 4 noisy seeds at the second look's 0.5% do not decide
    # A consistent gap resolves at the second look too: the first, at 2 of at most 6 seeds, spends
    # almost none of the level (O'Brien-Fleming). Without looks between, the seeds go to the cap.
    for seeds, expected in ((looks, [2, 3, 4, 5]), ({"first": [2, 3], "max": 6}, [2, 3, 4, 5, 6, 7])):
        steady = StudyPlan(spec(seeds=seeds), [([], ["base", "other"])])
        rounds = play(steady, lambda job: 2.0 + (0.05 + 0.001 * job.seed if job.arm == "other" else 0.0))
        assert sorted({job.seed for r in rounds for job in r if job.phase == JUDGE}) == expected


def test_an_arm_whose_anchor_beats_its_winner_is_not_judged() -> None:
    plan = StudyPlan(spec(), [([], ["base", "other"])])
    for _ in range(10):
        jobs = [job for job in plan.next_round() if job.phase == TUNE]
        if not jobs:
            break
        for job in jobs:  # other's anchor (1e-3, point 0) is far better than anything else
            plan.record(job, {"val/loss": 1.0 if (job.arm, job.point) == ("other", (0,)) else tune_loss(job)})
    tuning = plan.tuning(0, "other")
    assert [lead.verdict for lead in tuning.anchor_leads] == [UNDECIDED] and not tuning.tuned
    assert {job.arm for job in plan.next_round()} == {"base"}


def test_an_underpowered_claim_is_told_from_an_inconclusive_one() -> None:
    claim = spec().claims[0]
    wide = {
        "other": {"val/loss": Spread((2.04, 2.00, 2.07), (2, 3, 4))},
        "base": {"val/loss": Spread((2.0, 2.0, 2.0), (2, 3, 4))},
    }
    verdict = judge_claim(claim, wide)
    d = np.array([0.04, 0.0, 0.07])
    power = (stats.t.ppf(0.975, 2) + stats.t.ppf(0.8, 2)) * stats.sem(d)  # the distance resolved at 80% power
    assert verdict.verdict == UNDERPOWERED and f"resolves ±{power:.3g} at 80% power, margin 0.01" in verdict.measured[0]
    # Tight seeds whose gap sits on the threshold: resolved well enough, still inconclusive.
    tight = {"other": {"val/loss": Spread((2.0100, 2.0095, 2.0105), (2, 3, 4))}, "base": wide["base"]}
    assert judge_claim(claim, tight).verdict == "inconclusive"


@pytest.mark.parametrize(
    ("study", "message"),
    [
        ({"searcher": "bayes"}, "study.searcher='bayes' is not a searcher; use one of gp, tpe, random, coordinate"),
        ({"budget": 1}, "study.budget=1 leaves no point to search beside the arm's 1 anchor(s); give at least 2."),
        ({"budget": None}, "study.arms.base: the gp searcher needs a budget of tuning points"),
        (
            {"seeds": {"first": [2, 3, 4], "max": 2}},
            "study.seeds.max=2 must be a whole number of judging seeds, at least the 3",
        ),
        ({"seeds": {"first": [2], "auto": True}}, "study.seeds is a list of seeds or {first: [2, 3, 4], max: 8}"),
        (
            {"seeds": {"first": [2, 3], "max": 6, "looks": [2, 5, 4, 6]}},
            "study.seeds.looks=[2, 5, 4, 6] must be increasing seed counts from the 2 first seeds to max 6",
        ),
        (
            {"search": None, "tuning_seeds": None},
            "study.searcher, study.budget, study.round_size, study.arms.other.anchors set, but nothing is searched",
        ),
    ],
)
def test_bad_search_settings_name_the_key_and_the_fix(study, message) -> None:
    with pytest.raises(ConfigError) as error:
        spec(**study)
    assert message in str(error.value)


def ladder_spec(**study) -> StudySpec:
    trend = {"arm": "other", "baseline": "base", "trend": "params", "margin": 0.02}
    return spec(claims=[{**trend, "expect": {"val/loss": {"lower_than": 0.0}}}], **study)


LADDER_SIZES = [100_000, 300_000, 650_000, 1_200_000]


def play_trend(gap_per_decade: float, noise: dict[int, float]) -> list[list[int]]:
    """A 4-size ladder whose only claim is a trend: each round of judging seeds."""
    plan = StudyPlan(ladder_spec(), [([f"model=m{i}"], ["base", "other"]) for i in range(4)], sizes=LADDER_SIZES)

    def judge_loss(job: TunedJob) -> float:
        bend = (1, -1, -1, 1)[job.base]  # scatter about the line, not a tilt of it
        gap = 0.1 + gap_per_decade * math.log10(LADDER_SIZES[job.base]) + noise.get(job.seed, 0.0) * bend
        return 2.0 + (gap if job.arm == "other" else 0.0)

    return [sorted({job.seed for job in r}) for r in play(plan, judge_loss) if r[0].phase == JUDGE]


def test_a_ladder_adds_judging_seeds_while_a_trend_claim_is_unresolved() -> None:
    # A gap that falls 0.05 nats per decade, the same at every seed: decided at the first look.
    assert play_trend(-0.05, {}) == [[2, 3]]
    # No trend and the sizes scattered about the line: unresolved, so seeds go to the cap.
    assert play_trend(0.0, {seed: 0.02 for seed in range(2, 8)}) == [[2, 3], [4, 5, 6, 7]]


def test_a_trend_over_two_sizes_shows_each_size_s_mean_gap_and_asks_for_no_seeds() -> None:
    """Two sizes leave no scatter about a line: the trend gives each size's mean difference on
    the latest look's seeds and never adds seeds (they could not add a size); a plain claim
    left unresolved still does, and the trend is then shown on them."""
    from study.looks import judge_in_looks

    trend = {
        "arm": "other",
        "baseline": "base",
        "trend": "params",
        "margin": 0.02,
        "expect": {"val/loss": {"lower_than": 0.0}},
    }
    plain = {"arm": "other", "baseline": "base", "margin": 0.01, "expect": {"val/loss": {"lower_than": 0.0}}}
    sizes = LADDER_SIZES[:2]
    losses = {2: (2.0, 2.03), 3: (2.1, 2.08), 4: (1.9, 1.96), 5: (2.05, 2.04)}  # seed: (base, other)
    for claims, seeds, asked in (
        ([trend], [2, 3], None),
        ([trend, plain], [2, 3], [2, 3, 4, 5]),
        ([trend, plain], [2, 3, 4, 5], None),
    ):
        bases = [
            {
                "base": {"val/loss": Spread(tuple(losses[s][0] + k for s in seeds), tuple(seeds))},
                "other": {"val/loss": Spread(tuple(losses[s][1] + 2 * k for s in seeds), tuple(seeds))},
            }
            for k in (0.0, 0.1)
        ]
        judgement = judge_in_looks(spec(claims=claims, seeds={"first": [2, 3], "max": 4}), bases, sizes=sizes)
        assert judgement.next_seeds == asked
        verdict = judgement.trends[0]
        assert verdict.verdict == "too few sizes"
        for n, k in zip(sizes, (0.0, 0.1)):
            gap = np.mean([losses[s][1] - losses[s][0] + k for s in seeds])
            assert f"N = {n:,}: {gap:+.4g} ({len(seeds)} seeds)" in verdict.measured[0], verdict.measured


def test_a_held_out_ladder_judges_a_winner_that_is_not_tuned_but_leaves_it_out_of_the_claims() -> None:
    # Five sizes, the largest held out; at the second size other's anchor (1e-3) beats every
    # point its search runs, so that search is not tuned there.
    sizes = [*LADDER_SIZES, 2_100_000]
    bases = [([f"model=m{i}"], ["base", "other"]) for i in range(5)]
    plan = StudyPlan(ladder_spec(), bases, held_out=4, sizes=sizes)

    def tune_loss_here(job: TunedJob) -> float:
        return 1.0 if (job.base, job.arm, job.point) == (1, "other", (0,)) else tune_loss(job)

    def judge_loss(job: TunedJob) -> float:
        # A gap falling 0.05 per decade at the tuned sizes; the untuned one's is far above the
        # line, which would leave the trend unresolved (and add seeds) if it counted.
        gap = 0.1 - 0.05 * math.log10(sizes[job.base]) + (0.3 if job.base == 1 else 0.0)
        return 2.0 + (gap if job.arm == "other" else 0.0)

    rounds = []
    for _ in range(50):
        jobs = plan.next_round()
        if not jobs:
            break
        rounds.append(jobs)
        for job in jobs:
            plan.record(job, {"val/loss": tune_loss_here(job) if job.phase == TUNE else judge_loss(job)})
    tunings = plan.tunings()
    assert [b for b in range(4) if not tunings[(b, "other")].tuned] == [1]
    judged = [job for r in rounds for job in r if job.phase == JUDGE]
    # Every size's winner runs on the judging seeds, the untuned one's too, and only the first
    # look's: without that size the trend is resolved there.
    assert {(job.base, job.arm) for job in judged} == {(b, a) for b in range(4) for a in ("base", "other")}
    assert {job.seed for job in judged} == {2, 3}
    assert (1, "other", tunings[(1, "other")].winner) in {(job.base, job.arm, job.point) for job in judged}
    held_out = [job for job in rounds[-1] if job.base == 4]
    assert held_out and {job.arm for job in held_out} == {"base", "other"} and all(job.settings for job in held_out)


def test_a_trend_verdict_at_a_look_is_scipys_regression_at_that_look_s_level() -> None:
    from study.looks import judge_in_looks
    from study.sequential import nominal_levels

    ladder = ladder_spec(seeds={"first": [2, 3], "max": 4})
    gaps = {n: 0.1 - 0.01 * math.log10(n) + scatter for n, scatter in zip(LADDER_SIZES, (0.004, -0.003, 0.0, 0.002))}
    bases = [
        {
            "base": {"val/loss": Spread((2.0, 2.01), (2, 3))},
            "other": {"val/loss": Spread((2.0 + gaps[n], 2.01 + gaps[n]), (2, 3))},
        }
        for n in LADDER_SIZES
    ]
    judgement = judge_in_looks(ladder, bases, sizes=LADDER_SIZES)
    assert judgement.next_seeds == [2, 3, 4, 5]  # unresolved at 2 of at most 4 seeds: the next look's
    fit = stats.linregress(np.log10(LADDER_SIZES), [gaps[n] for n in LADDER_SIZES])
    alpha = nominal_levels(0.025, (0.5, 1.0), "obrien_fleming")[-1]
    half = stats.t.ppf(1 - alpha, len(LADDER_SIZES) - 2) * fit.stderr
    (line, look) = judgement.trends[0].measured
    shown = re.search(r"slope per decade of N (\S+) \[(\S+), (\S+)\]", line).groups()
    assert [float(x) for x in shown] == pytest.approx([fit.slope, fit.slope - half, fit.slope + half], rel=1e-3)
    assert "look 2 at 4 of at most 4 seeds" in look

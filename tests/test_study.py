"""Study specs, seed statistics and verdicts, against scipy and formulas written out here."""

import math

import numpy as np
import pytest
from scipy import stats

from analysis.student_t import t_quantile
from common.errors import ConfigError
from study.claim_tests import Condition, Spread, paired, resolvable, unpaired, verdict
from study.jobs import study_jobs
from study.preset import StudySpec
from study.verdicts import judge_claim

ARMS = {"small": ["batch.global_batch_size=16"], "large": ["batch.global_batch_size=64", "optimizer.lr=8e-3"]}


def test_t_quantiles_are_scipys() -> None:
    assert t_quantile(7) == pytest.approx(2.3646, abs=1e-4) and t_quantile(7, 0.95) == pytest.approx(1.8946, abs=1e-4)


def test_spread_and_difference_interval_equal_the_textbook_formulas() -> None:
    a, b = [2.10, 2.14, 2.12], [2.00, 2.03, 2.01, 2.05]
    spread_a, spread_b = Spread(tuple(a)), Spread(tuple(b))
    assert (spread_a.mean, spread_a.std) == pytest.approx((np.mean(a), np.std(a, ddof=1)))
    estimate = unpaired(spread_a, spread_b, "difference")
    error = math.sqrt(np.var(a, ddof=1) / 3 + np.var(b, ddof=1) / 4)
    half = stats.t.ppf(0.975, 2) * error  # min(n) - 1 degrees of freedom
    difference = np.mean(a) - np.mean(b)
    assert (estimate.value, *estimate.bounds(0.025)) == pytest.approx(
        (difference, difference - half, difference + half), rel=1e-3
    )


def test_spreads_print_at_their_precision_and_a_small_counts_fraction_is_kept() -> None:
    assert str(Spread((245.0, 245.0, 245.0))) == "245 ± 0" and str(Spread((2.1, 2.3))) == "2.2000 ± 0.1414"
    assert str(Spread((0.0, 1.0, 0.0))) == "0.3 ± 0.6"  # one spike in three seeds is not "0 ± 1"
    assert str(Spread((1.0, 1.0, 1.0))) == "1 ± 0" and str(Spread((200.0, 203.0))) == "202 ± 2"


def test_ratio_interval_follows_the_delta_method() -> None:
    a, b = [70.0, 74.0], [100.0, 100.0]
    estimate = unpaired(Spread(tuple(a)), Spread(tuple(b)), "ratio")
    ratio = np.mean(a) / np.mean(b)
    error = ratio * math.sqrt((np.std(a, ddof=1) / np.mean(a)) ** 2 / 2)
    assert estimate.value == pytest.approx(0.72)
    assert estimate.bounds(0.025)[1] - estimate.value == pytest.approx(stats.t.ppf(0.975, 1) * error, rel=1e-3)


# Paired per-seed losses (8 seeds) on which each test is checked against scipy's one-sided t-tests.
BASE = np.array([1.5360, 1.5107, 1.5241, 1.5201, 1.5399, 1.5212, 1.5295, 1.5186])
SHIFTS = {
    "clearly lower": -0.03,
    "slightly lower": -0.012,
    "equal": 0.0,
    "slightly higher": 0.012,
    "clearly higher": 0.03,
}
NOISE = np.array([0.004, -0.011, 0.006, 0.013, -0.009, 0.002, -0.007, 0.001])


def scipy_verdict(name: str, threshold: float, d: np.ndarray, better: str = "lower") -> str:
    """The verdict from scipy's one-sided t-tests on the per-seed differences, written out per test:
    a one-sided test passes at p < alpha; holds when the claim's tests pass, fails when the
    opposite one-sided test passes at the same level."""
    less = lambda edge, alpha: stats.ttest_1samp(d, edge, alternative="less").pvalue < alpha  # noqa: E731  mean < edge
    greater = lambda edge, alpha: stats.ttest_1samp(d, edge, alternative="greater").pvalue < alpha  # noqa: E731
    if name == "lower_than":
        return "holds" if less(threshold, 0.025) else "fails" if greater(threshold, 0.025) else "inconclusive"
    if name == "higher_than":
        return "holds" if greater(threshold, 0.025) else "fails" if less(threshold, 0.025) else "inconclusive"
    if name == "no_worse_than" and better == "lower":
        return "holds" if less(threshold, 0.025) else "fails" if greater(threshold, 0.025) else "inconclusive"
    if name == "no_worse_than":
        return "holds" if greater(-threshold, 0.025) else "fails" if less(-threshold, 0.025) else "inconclusive"
    # within: two one-sided tests at 5% each (TOST); fails when one 5% test puts the mean outside
    if greater(-threshold, 0.05) and less(threshold, 0.05):
        return "holds"
    return "fails" if greater(threshold, 0.05) or less(-threshold, 0.05) else "inconclusive"


@pytest.mark.parametrize("shift", list(SHIFTS))
@pytest.mark.parametrize(
    ("name", "threshold", "better"),
    [
        ("lower_than", 0.0, "lower"),
        ("lower_than", -0.01, "lower"),
        ("higher_than", 0.0, "lower"),
        ("no_worse_than", 0.01, "lower"),
        ("no_worse_than", 0.01, "higher"),
        ("within", 0.02, "lower"),
        ("within", 0.01, "lower"),
    ],
)
def test_each_test_is_scipys_t_test_on_the_per_seed_differences(
    shift: str, name: str, threshold: float, better: str
) -> None:
    arm = BASE + SHIFTS[shift] + NOISE
    seeds = tuple(range(2, 10))
    estimate = paired(Spread(tuple(arm), seeds), Spread(tuple(BASE), seeds), "difference")
    assert verdict(estimate, Condition(name, threshold, better)) == scipy_verdict(name, threshold, arm - BASE, better)


def test_the_resolvable_difference_is_the_80_percent_power_distance() -> None:
    """At that distance from the edge a one-sided 2.5% test passes in 80% of repeats (noncentral t)."""
    d = NOISE
    estimate = paired(Spread(tuple(BASE + d), tuple(range(8))), Spread(tuple(BASE), tuple(range(8))), "difference")
    distance = resolvable(estimate, Condition("lower_than", 0.0))
    se, df = np.std(d, ddof=1) / math.sqrt(8), 7
    power = stats.nct.sf(stats.t.ppf(0.975, df), df, distance / se)  # the test statistic's law at that true effect
    assert power == pytest.approx(0.8, abs=0.01)


@pytest.mark.parametrize(
    ("arm", "baseline", "name", "threshold", "expected"),
    [
        ((2.00, 2.01, 2.00), (2.10, 2.11, 2.10), "lower_than", 0.0, "holds"),  # clearly lower
        ((2.20, 2.21, 2.20), (2.10, 2.11, 2.10), "lower_than", 0.0, "fails"),  # clearly higher
        ((2.00, 2.20, 2.10), (2.05, 2.15, 2.10), "lower_than", 0.0, "inconclusive"),  # within the spread
        ((2.00,), (2.10,), "lower_than", 0.0, "inconclusive"),  # one seed: no spread known
        ((60.0, 60.0), (100.0, 100.0), "ratio_lower_than", 0.7, "holds"),  # deterministic steps
        ((80.0, 80.0), (100.0, 100.0), "ratio_lower_than", 0.7, "fails"),
        ((2.0, 2.0), (1.0, 1.0), "ratio_higher_than", 1.5, "holds"),
        ((102.0, 102.5, 103.0), (100.0, 100.0, 100.0), "ratio_within", 1.05, "holds"),
    ],
)
def test_unpaired_verdicts(arm, baseline, name, threshold, expected) -> None:
    condition = Condition(name, threshold)
    assert verdict(unpaired(Spread(arm), Spread(baseline), condition.kind), condition) == expected


def claim(**entry) -> StudySpec:
    return StudySpec.from_config({"arms": ARMS, "seeds": [1, 2], "claims": [entry]})


def test_a_claim_with_two_conditions_fails_if_one_fails() -> None:
    spec = claim(
        arm="large", baseline="small", expect={"val/loss": {"no_worse_than": 0.01}, "steps": {"ratio_lower_than": 0.7}}
    )
    groups = {
        "large": {"val/loss": Spread((2.0000, 2.0002)), "steps": Spread((25.0, 25.0))},
        "small": {"val/loss": Spread((2.0000, 2.0001)), "steps": Spread((100.0, 100.0))},
    }
    assert judge_claim(spec.claims[0], groups).verdict == "holds"
    groups["large"]["steps"] = Spread((90.0, 90.0))
    verdict = judge_claim(spec.claims[0], groups)
    assert verdict.verdict == "fails" and "ratio 0.9" in verdict.measured[1]


def test_a_claim_on_lists_of_arms_compares_the_best_of_each() -> None:
    arms = {name: [f"x={i}"] for i, name in enumerate(["a1", "a2", "b1", "b2"])}
    entry = {"arm": ["a1", "a2"], "baseline": ["b1", "b2"], "expect": {"val/loss": {"lower_than": 0.0}}}
    spec = StudySpec.from_config({"arms": arms, "seeds": [1, 2, 3], "claims": [entry]})
    groups = {
        "a1": {"val/loss": Spread((2.100, 2.101, 2.102))},
        "a2": {"val/loss": Spread((2.000, 2.001, 2.002))},
        "b1": {"val/loss": Spread((2.050, 2.051, 2.052))},
        "b2": {"val/loss": Spread((2.300, 2.301, 2.302))},
    }
    verdict = judge_claim(spec.claims[0], groups)
    # a2 (mean 2.001) against b1 (2.051): -0.05, interval +-0.0035 (t 4.303 x 0.00082)
    assert verdict.measured[0] == "best by val/loss: a2 against b1" and "difference -0.05 " in verdict.measured[1]
    assert verdict.verdict == "holds"
    groups["b2"] = {"val/loss": Spread((1.900, 1.901, 1.902))}  # now b2 is the baseline's best, and lower than a2
    assert judge_claim(spec.claims[0], groups).verdict == "fails"


def test_a_front_claim_is_below_on_or_above_the_front() -> None:
    spec = StudySpec.from_config(
        {
            "arms": {**ARMS, "adaptive": ["+technique=adaptive_batch"]},
            "seeds": [1, 2],
            "claims": [{"arm": "adaptive", "front": ["small", "large"]}],
        }
    )
    front = {
        "small": {"steps": Spread((100.0, 100.0)), "val/loss": Spread((2.00, 2.01))},
        "large": {"steps": Spread((25.0, 25.0)), "val/loss": Spread((2.30, 2.31))},
    }

    def verdict(steps: float, losses: tuple[float, float]) -> str:
        groups = {**front, "adaptive": {"steps": Spread((steps, steps)), "val/loss": Spread(losses)}}
        return judge_claim(spec.claims[0], groups).verdict

    assert verdict(50.0, (2.10, 2.11)) == "holds"  # fewer steps than small, lower loss than large
    assert verdict(50.0, (2.40, 2.41)) == "fails"  # large took fewer steps and ended lower
    assert verdict(50.0, (2.29, 2.32)) == "inconclusive"  # on the front within the seeds' spread
    assert verdict(10.0, (3.00, 3.01)) == "holds"  # fewer steps than any constant: not dominated


@pytest.mark.parametrize(
    ("study", "message"),
    [
        ({"arms": ARMS, "seeds": [1, 1]}, "distinct integers"),
        ({"arms": {"a": "optimizer.lr=1"}, "seeds": [1]}, "study.arms.a must be a list of overrides"),
        (
            {
                "arms": ARMS,
                "seeds": [1],
                "claims": [{"arm": "huge", "baseline": "small", "expect": {"val/loss": {"lower_than": 0}}}],
            },
            r"study.claims\[0\] names 'huge', which is not an arm",
        ),
        (
            {
                "arms": ARMS,
                "seeds": [1],
                "claims": [{"arm": "large", "baseline": "small", "expect": {"val/loss": {"below": 0}}}],
            },
            r"study.claims\[0\].expect.val/loss.below is not a test; use one of lower_than, higher_than, no_worse_than, within, ratio_lower_than",
        ),
        (
            {
                "arms": ARMS,
                "seeds": [1],
                "claims": [{"arm": "large", "baseline": "small", "expect": {"val/loss": {"difference_at_most": 0.01}}}],
            },
            "difference_at_most is ambiguous and retired: name the test, lower_than .* or no_worse_than",
        ),
        (
            {
                "arms": ARMS,
                "seeds": [1],
                "claims": [{"arm": "large", "baseline": "small", "expect": {"val/loss": {"lower_than": 0.01}}}],
            },
            r"lower_than=0.01 claims superiority, so it must be <= 0 .* use no_worse_than",
        ),
        (
            {
                "arms": ARMS,
                "seeds": [1],
                "claims": [{"arm": "large", "baseline": "small", "expect": {"val/loss": {"within": -0.01}}}],
            },
            r"within=-0.01 is a margin and must be > 0, e.g. within: 0.01",
        ),
        (
            {
                "arms": ARMS,
                "seeds": [1],
                "claims": [{"arm": "large", "baseline": "small", "expect": {"steps": {"ratio_no_worse_than": 0.9}}}],
            },
            r"ratio_no_worse_than=0.9 is a margin and must be > 1, e.g. ratio_no_worse_than: 1.05",
        ),
        (
            {
                "arms": ARMS,
                "seeds": [1],
                "claims": [
                    {"arm": "large", "baseline": "small", "better": "up", "expect": {"val/loss": {"within": 0.01}}}
                ],
            },
            r"study.claims\[0\].better='up' must be lower or higher",
        ),
        (
            {"arms": ARMS, "seeds": {"first": [1, 2], "max": 4}},
            "study.seeds.max: only a tuned study adds judging seeds in rounds",
        ),
        # Read by the run's typed reader: a misspelt key is refused, not ignored; types are checked.
        (
            {"arms": ARMS, "seeds": [2], "tuning_seed": [1]},
            r"unknown key\(s\) study.tuning_seed; valid keys of `study`",
        ),
        (
            {"arms": {"a": {"overrides": ["optimizer.lr=1"], "budgett": 4}}, "seeds": [1]},
            r"unknown key\(s\) study.arms.a.budgett",
        ),
        ({"arms": ARMS, "seeds": [1], "budget": True}, "study.budget=True must be an integer or null"),
        (
            {"arms": ARMS, "seeds": [1], "tokens_per_parameter": "many"},
            "study.tokens_per_parameter='many' must be a number",
        ),
    ],
)
def test_study_mistakes_name_the_key(study, message) -> None:
    with pytest.raises(ConfigError, match=message):
        StudySpec.from_config(study)


def test_jobs_are_arms_times_seeds_and_the_command_line_wins() -> None:
    spec = StudySpec.from_config({"arms": ARMS, "seeds": [1, 2]})
    assert study_jobs(spec, [["token_budget=1000"]]) == [
        ["token_budget=1000", "batch.global_batch_size=16", "study.arm=small", "seed=1"],
        ["token_budget=1000", "batch.global_batch_size=16", "study.arm=small", "seed=2"],
        ["token_budget=1000", "batch.global_batch_size=64", "optimizer.lr=8e-3", "study.arm=large", "seed=1"],
        ["token_budget=1000", "batch.global_batch_size=64", "optimizer.lr=8e-3", "study.arm=large", "seed=2"],
    ]
    # A key the command line sets is not overridden by an arm; a seed there replaces the study's seeds.
    jobs = study_jobs(spec, [["optimizer.lr=1e-3", "seed=7"]])
    assert jobs == [
        ["optimizer.lr=1e-3", "seed=7", "batch.global_batch_size=16", "study.arm=small"],
        ["optimizer.lr=1e-3", "seed=7", "batch.global_batch_size=64", "study.arm=large"],
    ]


def test_arms_named_on_the_command_line_run_alone_and_group_with_the_whole_studys_runs() -> None:
    spec = StudySpec.from_config({"arms": ARMS, "seeds": [1, 2]})
    whole = study_jobs(spec, [["token_budget=1000"]])
    # `study.arm=large seed=3,4`: the basic sweeper's base jobs
    chosen = study_jobs(
        spec, [["token_budget=1000", "study.arm=large", "seed=3"], ["token_budget=1000", "study.arm=large", "seed=4"]]
    )
    assert chosen == [
        ["token_budget=1000", "seed=3", "batch.global_batch_size=64", "optimizer.lr=8e-3", "study.arm=large"],
        ["token_budget=1000", "seed=4", "batch.global_batch_size=64", "optimizer.lr=8e-3", "study.arm=large"],
    ]
    without_seed = {tuple(o for o in job if not o.startswith("seed=")) for job in chosen}
    assert without_seed == {tuple(o for o in job if not o.startswith("seed=")) for job in whole[2:]}
    with pytest.raises(ConfigError, match="study.arm=larg is not an arm of this study; its arms: small, large"):
        study_jobs(spec, [["study.arm=larg"]])


def test_an_arm_that_sets_its_seed_runs_once_with_it() -> None:
    """Branches of one seed's base run (the critical-batch study) carry that seed in the arm."""
    arms = {"branch": ["seed=3", "batch.global_batch_size=64"], "plain": ["batch.global_batch_size=16"]}
    jobs = study_jobs(StudySpec.from_config({"arms": arms, "seeds": [1, 2]}), [[]])
    assert jobs == [
        ["seed=3", "batch.global_batch_size=64", "study.arm=branch"],
        ["batch.global_batch_size=16", "study.arm=plain", "seed=1"],
        ["batch.global_batch_size=16", "study.arm=plain", "seed=2"],
    ]

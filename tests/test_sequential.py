"""Seeds added in looks keep their error rate: the spending boundaries against published values and
a Monte Carlo of the Brownian motion, and the study rule's false-claim rate by simulation."""

from unittest import mock

import numpy as np
import pytest
from scipy import stats

import study.looks as looks
from common.errors import ConfigError
from study.claim_tests import Spread
from study.looks import judge_in_looks
from study.preset import StudySpec
from study.sequential import nominal_levels, spent

FIVE_LOOKS = (0.2, 0.4, 0.6, 0.8, 1.0)


@pytest.mark.parametrize(
    ("spending", "published"),
    [
        ("obrien_fleming", (4.877, 3.357, 2.680, 2.290, 2.031)),  # Lan-DeMets O'Brien-Fleming-type, one-sided 2.5%
        ("pocock", (2.438, 2.427, 2.410, 2.397, 2.386)),  # Lan-DeMets Pocock-type
    ],
)
def test_boundaries_equal_the_published_five_look_designs(spending: str, published: tuple[float, ...]) -> None:
    z = stats.norm.isf(np.array(nominal_levels(0.025, FIVE_LOOKS, spending)))
    assert z == pytest.approx(published, abs=2e-3)


def test_crossing_chances_equal_the_spent_level_in_a_monte_carlo_of_the_motion() -> None:
    fractions = (3 / 8, 5 / 8, 1.0)
    z = stats.norm.isf(np.array(nominal_levels(0.025, fractions)))
    rng = np.random.default_rng(0)
    steps = rng.standard_normal((400_000, 3)) * np.sqrt(np.diff((0.0, *fractions)))
    crossed = np.cumsum(steps, axis=1) / np.sqrt(fractions) >= z
    by_look = np.logical_or.accumulate(crossed, axis=1).mean(axis=0)
    expected = [spent(0.025, t, "obrien_fleming") for t in fractions]
    assert by_look == pytest.approx(expected, abs=4 * np.sqrt(0.025 / 400_000))


SPEC = {
    "arms": {"arm": [], "base": []},
    "tuning_seeds": [1],
    "budget": 4,
    "search": {"optimizer.lr": {"low": 1e-3, "high": 4e-3}},
    "seeds": {"first": [2, 3, 4], "max": 8},
    "claims": [{"arm": "arm", "baseline": "base", "margin": 0.01, "expect": {"val/loss": {"lower_than": 0.0}}}],
}
STUDIES = 3000


def false_claims(full_level_at_every_look: bool) -> float:
    """The share of simulated studies, with no true difference, whose superiority claim holds:
    paired seeds (seed noise 0.01, arm-baseline noise 0.02, as in the DiLoCo study) judged by
    the study's looks (first 3 seeds, at most 8)."""
    spec, rng, seeds, held = StudySpec.from_config(SPEC), np.random.default_rng(11), tuple(range(2, 10)), 0
    for _ in range(STUDIES):
        base = 1.5 + 0.01 * rng.standard_normal(8)
        arm = base + 0.02 * rng.standard_normal(8)
        groups = {"arm": {"val/loss": Spread(tuple(arm), seeds)}, "base": {"val/loss": Spread(tuple(base), seeds)}}
        held += judge_in_looks(spec, [groups]).verdicts[0][0].verdict == "holds"
    return held / STUDIES


def test_a_false_superiority_claim_holds_no_more_often_than_the_level() -> None:
    """The spending keeps the rate at 2.5% (Monte Carlo tolerance: 2 standard errors); judging
    every look at the full level, the rule before, passes it about twice as often."""
    tolerance = 2 * np.sqrt(0.025 * 0.975 / STUDIES)
    assert false_claims(False) <= 0.025 + tolerance
    with mock.patch.object(looks, "nominal_levels", lambda alpha, fractions, spending: (alpha,) * len(fractions)):
        assert false_claims(True) > 0.025 + 2 * tolerance


def test_an_unknown_error_control_names_the_choices() -> None:
    with pytest.raises(
        ConfigError,
        match="study.seeds.error_control='bonferroni' is not an error control; use one of obrien_fleming, pocock",
    ):
        StudySpec.from_config({**SPEC, "seeds": {"first": [2, 3, 4], "max": 8, "error_control": "bonferroni"}})

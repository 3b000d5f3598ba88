"""The coordinate rule and its search spaces, against brute force over the grid, and the
paired interval and the tuned study's verdicts against formulas written out here (scipy)."""

import itertools
import math

import numpy as np
import pytest
from scipy import stats

from common.errors import ConfigError
from study.claim_tests import Spread, paired
from study.coordinate_search import AT_LIMIT, BRACKETED, NOT_BRACKETED, first_design
from study.preset import StudySpec
from study.search_space import Choice, Range, SearchSpace, parse_search
from study.tuner import Search, Tuning
from study.verdicts import NOT_RUN, NOT_TUNED, judge_claim


def search(space: SearchSpace, loss) -> Tuning:
    """Run the tuner to the end against a loss function of the point's values."""
    results = {}
    for _ in range(100):
        wanted = Tuning(Search(space, "coordinate"), results).pending
        if not wanted:
            return Tuning(Search(space, "coordinate"), results)
        for point in wanted:
            results[point] = loss(space.labels(point))
    raise AssertionError("the tuner did not stop")


LR = Range("optimizer.lr", 1e-3, 4e-3, "log", 2, 1.25e-4, 6.4e-2)


def bowl(best_lr: float):
    return lambda labels: (math.log2(float(labels["optimizer.lr"]) / best_lr)) ** 2


def test_a_best_on_the_edge_is_extended_until_it_is_interior() -> None:
    space = SearchSpace((LR,))
    assert [LR.value(i) for i in LR.first_grid] == [1e-3, 2e-3, 4e-3]
    tuning = search(space, bowl(1.6e-2))  # two grid steps above the first grid's top
    tried = sorted(LR.value(p[0]) for p in tuning.results)
    assert tried == [1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2, 3.2e-2]  # extended one step past the optimum, no further
    assert LR.value(tuning.winner[0]) == 1.6e-2 and tuning.statuses == {"optimizer.lr": BRACKETED} and tuning.tuned
    downward = search(space, bowl(2.5e-4))
    assert LR.value(downward.winner[0]) == 2.5e-4 and min(LR.value(p[0]) for p in downward.results) == 1.25e-4


def test_a_hard_limit_stops_the_extension_and_the_grid_lands_on_it() -> None:
    space = SearchSpace((LR,))
    tuning = search(space, bowl(1.0))  # far above the limit 6.4e-2
    assert LR.value(tuning.winner[0]) == 6.4e-2 and tuning.statuses == {"optimizer.lr": AT_LIMIT} and tuning.tuned
    clamped = Range("optimizer.lr", 1e-3, 4e-3, "log", 2, None, 5e-3)  # 8e-3 would cross the limit
    assert [clamped.value(i) for i in (2, 3)] == [4e-3, 5e-3] and clamped.neighbour(3, 1) is None


def test_an_integer_grid_rounds_and_stops_at_its_limit() -> None:
    h = Range("technique.diloco.sync_every", 10, 90, "log", 3, 1, 300)
    assert [h.value(i) for i in range(-3, 4)] == [1, 1, 3, 10, 30, 90, 270]
    assert h.neighbour(-2, -1) is None and h.neighbour(3, 1) == 4 and h.value(4) == 300 and h.neighbour(4, 1) is None


def test_the_winner_equals_brute_force_over_the_grid_on_a_separable_bowl() -> None:
    """Two ranges and a list: the coordinate search ends where brute force over the product does."""
    outer = Range("technique.diloco.outer_lr", 0.2, 0.8, "log", 2, 0.025, 3.2)
    momentum = Choice(
        "technique.diloco.outer_optimizer", ({"momentum": 0.0, "nesterov": False}, {"momentum": 0.9, "nesterov": True})
    )
    space = SearchSpace((LR, outer, momentum))

    def loss(labels: dict[str, str]) -> float:
        nesterov = labels["technique.diloco.outer_optimizer"].endswith("true")
        best_outer = 0.2 if nesterov else 1.6
        return (
            (math.log2(float(labels["optimizer.lr"]) / 8e-3)) ** 2
            + (math.log2(float(labels["technique.diloco.outer_lr"]) / best_outer)) ** 2
            - nesterov * 0.1
        )

    tuning = search(space, loss)
    grid = itertools.product(range(-3, 7), range(-3, 5), range(2))
    brute = min(grid, key=lambda p: loss(space.labels(p)))
    assert tuning.winner == brute and tuning.tuned
    assert set(tuning.statuses.values()) <= {BRACKETED, "all tried"}
    assert len(tuning.results) < 20  # against 80 for the product of the grids searched


def test_the_first_design_is_the_centre_and_one_line_per_dimension() -> None:
    outer = Range("technique.diloco.outer_lr", 0.2, 0.8, "log", 2)
    design = first_design(SearchSpace((LR, outer)))
    assert design == [(1, 1), (0, 1), (2, 1), (1, 0), (1, 2)]
    assert SearchSpace((LR, outer)).overrides((1, 2)) == ["optimizer.lr=0.002", "technique.diloco.outer_lr=0.8"]


def test_a_run_s_overrides_map_back_to_its_point() -> None:
    choice = Choice(
        "technique.diloco.outer_optimizer", ({"momentum": 0.0, "nesterov": False}, {"momentum": 0.9, "nesterov": True})
    )
    space = SearchSpace((LR, choice))
    for point in [(0, 0), (-3, 1), (6, 1)]:
        assert space.point_of(["seed=1", *space.overrides(point), "study.arm=x"]) == point
    assert space.point_of(["optimizer.lr=0.0015"]) is None


def test_an_unfinished_search_is_not_bracketed() -> None:
    space = SearchSpace((LR,))
    tuning = Tuning(
        Search(space, "coordinate"), {(1,): 1.0, (0,): 2.0, (2,): 0.5}
    )  # best on the edge, 8e-3 not run yet
    assert tuning.statuses == {"optimizer.lr": NOT_BRACKETED} and not tuning.tuned


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"lr": {"low": 4e-3, "high": 1e-3}}, "inverted (low 0.004 > high 0.001)"),
        ({"lr": []}, "empty list"),
        ({"lr": {"low": 1e-3, "high": 4e-3, "max": 2e-3}}, "high=0.004 lies outside the hard limits"),
        ({"lr": {"low": 1e-3, "high": 4e-3, "min": 2e-3}}, "low=0.001 lies outside the hard limits"),
        ({"lr": {"low": 1e-3, "high": 4e-3, "scale": "cubic"}}, "scale='cubic' must be one of"),
        ({"lr": {"low": 1e-3}}, "needs low and high"),
        ({"lr": {"low": 1e-3, "high": 4e-3, "stepp": 2}}, "unknown fields ['stepp']"),
    ],
)
def test_bad_search_spaces_name_the_key_and_the_fix(spec, message) -> None:
    with pytest.raises(ConfigError, match="study.search.lr") as error:
        parse_search(spec, "study.search")
    assert message in str(error.value)


def tuned_spec(**study) -> StudySpec:
    node = {
        "searcher": "coordinate",
        "arms": {
            "dp": [],
            "diloco": {
                "overrides": ["+technique=diloco"],
                "search": {"technique.diloco.outer_lr": {"low": 0.2, "high": 0.8}},
            },
        },
        "search": {"optimizer.lr": {"low": 1e-3, "high": 4e-3}},
        "tuning_seeds": [1],
        "seeds": [2, 3],
        "claims": [{"arm": "diloco", "baseline": "dp", "expect": {"val/loss": {"lower_than": 0.0}}}],
    }
    return StudySpec.from_config({**node, **study})


def test_a_study_with_a_search_composes_shared_and_own_dimensions() -> None:
    spec = tuned_spec()
    assert spec.tuned and spec.arms["diloco"] == ["+technique=diloco"]
    assert spec.spaces["dp"].keys == ["optimizer.lr"] and spec.spaces["diloco"].keys == [
        "optimizer.lr",
        "technique.diloco.outer_lr",
    ]


@pytest.mark.parametrize(
    ("study", "message"),
    [
        ({"seeds": [1, 2]}, "study.seeds repeats the tuning seeds [1]"),
        ({"tuning_seeds": None}, "study.tuning_seeds is missing"),
        ({"arms": {"dp": ["optimizer.lr=1e-3"]}, "claims": []}, "study.arms.dp fixes ['optimizer.lr']"),
    ],
)
def test_bad_tuned_studies_name_the_key_and_the_fix(study, message) -> None:
    with pytest.raises(ConfigError) as error:
        tuned_spec(**study)
    assert message in str(error.value)


def test_the_paired_interval_equals_scipys_on_the_per_seed_differences() -> None:
    arm, base = (2.10, 2.17, 2.12, 2.30), (2.05, 2.15, 2.04, 2.22)
    interval = paired(Spread(arm, (1, 2, 3, 4)), Spread(base, (4, 3, 2, 1)[::-1]), "difference")
    d = np.subtract(arm, base)
    low, high = stats.t.interval(0.95, len(d) - 1, loc=d.mean(), scale=stats.sem(d))
    assert (interval.value, *interval.bounds(0.025)) == pytest.approx((d.mean(), low, high), rel=1e-3)
    # Pairing takes the seeds both sides ran (an arm may have more for another claim).
    shared = paired(Spread(arm, (1, 2, 3, 4)), Spread(base, (1, 2, 3, 5)), "difference")
    d3 = d[:3]
    low, high = stats.t.interval(0.95, 2, loc=d3.mean(), scale=stats.sem(d3))
    assert (shared.value, *shared.bounds(0.025)) == pytest.approx((d3.mean(), low, high), rel=1e-3)
    assert paired(Spread(arm, (1, 2, 3, 4)), Spread(base, (1, 5, 6, 7)), "difference") is None
    assert paired(Spread(arm), Spread(base), "difference") is None


def test_pairing_decides_where_the_seed_spread_hides_a_consistent_gap() -> None:
    spec = tuned_spec()
    groups = {
        "diloco": {"val/loss": Spread((2.00, 2.30, 2.60), (2, 3, 4))},
        "dp": {"val/loss": Spread((2.05, 2.35, 2.65), (2, 3, 4))},
    }
    verdict = judge_claim(spec.claims[0], groups)
    assert verdict.verdict == "holds" and "paired -0.05 [-0.05, -0.05], unpaired -0.05 [" in verdict.measured[0]
    unpaired = {arm: {"val/loss": Spread(s["val/loss"].values)} for arm, s in groups.items()}
    assert judge_claim(spec.claims[0], unpaired).verdict == "inconclusive"


def test_a_claim_on_an_untuned_arm_is_not_tuned_and_one_without_runs_is_not_run() -> None:
    spec = tuned_spec()
    groups = {"diloco": {"val/loss": Spread((2.0, 2.1), (2, 3))}, "dp": {"val/loss": Spread((2.5, 2.6), (2, 3))}}
    assert judge_claim(spec.claims[0], groups).verdict == "holds"
    assert judge_claim(spec.claims[0], groups, frozenset({"diloco"})).verdict == NOT_TUNED
    assert judge_claim(spec.claims[0], {"dp": groups["dp"]}).verdict == NOT_RUN


def test_the_tuning_figure_draws_every_point_and_the_best_at_each_value_of_the_setting() -> None:
    """The figure's line is, at each value of the setting, the lowest loss over every other
    setting (found here by brute force over the results); its dots are every finite point."""
    import matplotlib.pyplot as plt

    from study.tuning_report import draw_setting

    space = SearchSpace(
        tuple(
            parse_search(
                {
                    "optimizer.lr": {"low": 1e-3, "high": 4e-3, "scale": "log", "step": 2},
                    "technique.diloco.sync_every": [3, 10, 30],
                },
                "study.search",
            ).values()
        )
    )
    rng = np.random.default_rng(0)
    grid = list(itertools.product(range(3), range(3)))
    results = {point: float(rng.uniform(1.5, 2.0)) for point in grid}
    results[(2, 2)] = math.nan  # a diverged run: neither a dot nor the line's
    tuning = Tuning(Search(space, "coordinate"), results)
    figure, axis = plt.subplots()
    low, high = draw_setting(axis, "m1", tuning, "optimizer.lr")
    line, dots, star = axis.lines
    expected = {
        lr: min(v for p, v in results.items() if p[0] == i and math.isfinite(v))
        for i, lr in enumerate((1e-3, 2e-3, 4e-3))
    }
    assert np.allclose(line.get_xydata(), sorted(expected.items()))
    assert len(dots.get_xdata()) == len(grid) - 1
    best = results[tuning.winner]
    assert star.get_ydata()[0] == best and math.isclose(low, best - 0.01) and high <= best + 0.31
    plt.close(figure)

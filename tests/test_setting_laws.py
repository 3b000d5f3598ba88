"""A held-out size's settings from laws over the searched sizes' winners: a power law where the
exponent's 95% interval excludes 0 (against scipy's regression), a constant where it holds 0,
a list's value by majority, and a ladder's previous-size anchor in the plan and in the report
of a study midway."""

import math
from dataclasses import replace

import pytest
from scipy import stats

from analysis.runs import FINISHED, Run
from common.errors import ConfigError
from study.plan import TUNE, StudyPlan, TunedJob
from study.preset import StudySpec
from study.search_space import Choice, Range, SearchSpace
from study.setting_laws import CONSTANT, MAJORITY, POWER_LAW, setting_laws
from study.tuner import Tuning, anchored_on
from study.tuning_report import tunings

SIZES = [104_688, 295_416, 652_128, 1_230_120]
HELD_OUT = 2_084_688
LR = Range("optimizer.lr", low=1e-3, high=4e-3, step=2.0, min=1e-4, max=3e-2)
SYNC = Range("technique.diloco.sync_every", low=10, high=30, step=3, min=1, max=90)
OUTER = Choice(
    "technique.diloco.outer_optimizer", ({"momentum": 0.0, "nesterov": False}, {"momentum": 0.9, "nesterov": True})
)


def regression(values: list[float]):
    """scipy's line through (log N, log value), and its slope's 95% interval (t, n - 2 df)."""
    fit = stats.linregress([math.log(n) for n in SIZES], [math.log(v) for v in values])
    half = stats.t.ppf(0.975, len(SIZES) - 2) * fit.stderr
    return fit, (fit.slope - half, fit.slope + half)


def test_a_setting_that_moves_with_n_follows_its_power_law() -> None:
    # The LR halves per size but for one step of two: a clear fall, the interval below 0
    # (indices count grid steps from the range's low).
    points = [(n, (index, 0, 0)) for n, index in zip(SIZES, [3, 2, 1, -1])]
    space = SearchSpace((LR, SYNC, OUTER))
    law = setting_laws(space, points, HELD_OUT)[0]
    values = [LR.value(index) for index in [3, 2, 1, -1]]
    fit, interval = regression(values)
    expected = math.exp(fit.intercept + fit.slope * math.log(HELD_OUT))
    assert law.form == POWER_LAW and interval[1] < 0
    assert law.exponent == pytest.approx(fit.slope, rel=1e-9)
    assert law.exponent_interval == pytest.approx(interval, rel=1e-9)
    assert law.overrides == (f"optimizer.lr={float(f'{expected:.3g}'):g}",)
    # Far beyond the ladder the law meets the range's hard limit.
    assert setting_laws(space, points, 10**12)[0].overrides == ("optimizer.lr=0.0001",)


def test_a_setting_whose_exponent_interval_holds_zero_is_a_constant_at_the_winners_geometric_mean() -> None:
    # H = 10, 30, 10, 30: no trend the four sizes can show.
    points = [(n, (0, index, 0)) for n, index in zip(SIZES, [0, 1, 0, 1])]
    law = setting_laws(SearchSpace((LR, SYNC, OUTER)), points, HELD_OUT)[1]
    fit, interval = regression([10, 30, 10, 30])
    assert interval[0] < 0 < interval[1]
    assert law.form == CONSTANT and law.overrides == (f"technique.diloco.sync_every={round(math.sqrt(300))}",)
    assert "constant" in law.describe() and law.as_dict()["exponent"] == pytest.approx(fit.slope, rel=1e-9)


def test_a_law_names_the_sizes_whose_winner_sits_at_the_ranges_hard_limit() -> None:
    # H's grid runs 10, 3, then 1, its hard limit: the two smallest sizes won at that edge,
    # where the loss might still fall, the others inside the range.
    points = [(n, (0, index, 0)) for n, index in zip(SIZES, [-2, -2, -1, 0])]
    sync, lr = setting_laws(SearchSpace((LR, SYNC, OUTER)), points, HELD_OUT)[1::-1]
    assert [SYNC.value(index) for index in (-2, -1, 0)] == [1, 3, 10] and SYNC.min == 1
    assert sync.at_limit == tuple(SIZES[:2]) and sync.as_dict()["winners_at_limit"] == SIZES[:2]
    assert "2 of 4 sizes' winners at the range's hard limit" in sync.describe()
    assert lr.at_limit == () and "limit" not in lr.describe()


def test_a_list_takes_most_sizes_winner_and_a_tie_goes_to_the_largest_size() -> None:
    space = SearchSpace((LR, SYNC, OUTER))
    most = [(n, (0, 0, choice)) for n, choice in zip(SIZES, [1, 0, 1, 1])]
    law = setting_laws(space, most, HELD_OUT)[2]
    assert law.form == MAJORITY and law.overrides == (
        "technique.diloco.outer_optimizer.momentum=0.9",
        "technique.diloco.outer_optimizer.nesterov=true",
    )
    tied = [(n, (0, 0, choice)) for n, choice in zip(SIZES, [1, 1, 0, 0])]
    assert setting_laws(space, tied, HELD_OUT)[2].value == "momentum=0,nesterov=false"  # the largest size's


def test_laws_need_three_searched_sizes() -> None:
    with pytest.raises(ConfigError, match="2 searched size"):
        setting_laws(SearchSpace((LR,)), [(SIZES[0], (1,)), (SIZES[1], (2,))], HELD_OUT)


LR_SEARCH = {"optimizer.lr": {"low": 1e-3, "high": 4e-3, "scale": "log", "step": 2, "min": 2.5e-4, "max": 3.2e-2}}


def ladder_spec(previous: bool, **arms: dict) -> StudySpec:
    """A ladder's study: arm m1 anchored on the preset's LR (and on the previous size's winner
    where ``previous``), and any ``arms`` beside it."""
    m1 = {"overrides": [], "anchors": [{"optimizer.lr": 4e-3}], "previous_size_anchor": previous}
    return StudySpec.from_config(
        {
            "searcher": "gp",
            "budget": 3,
            "round_size": 2,
            "tuning_seeds": [1],
            "seeds": [2],
            "search": LR_SEARCH,
            "arms": {**arms, "m1": m1},
        }
    )


def best_lr(n_params: int) -> float:
    """Each size's best LR (the grid is 1e-3 x 2^index): it falls with N."""
    return {SIZES[0]: 1.6e-2, SIZES[1]: 4e-3, SIZES[2]: 1e-3}[n_params]


def play_ladder(previous: bool) -> tuple[StudyPlan, list[list[TunedJob]], list[int]]:
    sizes = [SIZES[2], SIZES[0], SIZES[1]]  # given out of order: the plan orders them by size
    plan = StudyPlan(ladder_spec(previous), [([f"model=size{i}"], ["m1"]) for i in range(3)], sizes=sizes)
    rounds = []
    while jobs := plan.next_round():
        rounds.append(jobs)
        for job in jobs:
            lr = 1e-3 * 2.0 ** job.point[0]
            plan.record(job, {"val/loss": 2.0 + 0.05 * math.log2(lr / best_lr(sizes[job.base])) ** 2})
    return plan, rounds, sizes


def test_each_size_anchors_on_the_next_smaller_sizes_winner_once_that_search_is_over() -> None:
    plan, rounds, sizes = play_ladder(True)
    searched = [sizes[r[0].base] for r in rounds if r[0].phase == TUNE]
    assert searched == sorted(searched) and len(set(searched)) == 3  # one size at a time, smallest first
    tunings = {sizes[base]: tuning for (base, _), tuning in plan.tunings().items()}
    preset = (2,)  # the preset's anchor, 4e-3 = 1e-3 x 2^2
    for smaller, larger in zip(SIZES[:2], SIZES[1:3]):
        winner = tunings[smaller].winner
        expected = (preset,) if winner == preset else (preset, winner)
        assert tunings[larger].search.anchors == expected
        first = next(r for r in rounds if r[0].phase == TUNE and sizes[r[0].base] == larger)
        assert set(expected) <= {job.point for job in first}  # run in the larger size's first round
    assert tunings[SIZES[0]].search.anchors == (preset,)
    # Without the setting every size searches at once, with the preset's anchor only.
    plain, rounds, sizes = play_ladder(False)
    assert {sizes[job.base] for job in rounds[0]} == set(SIZES[:3])
    assert all(t.search.anchors == (preset,) for t in plain.tunings().values())


def test_a_previous_winner_that_is_a_preset_anchor_is_not_added_twice() -> None:
    search = ladder_spec(True).searches["m1"]
    previous = Tuning(search, {(2,): 2.0, (1,): 2.1, (3,): 2.2})  # the anchor (2,) is the lowest, not a winner
    assert previous.winner == (1,) and anchored_on(search, previous).anchors == ((2,), (1,))
    assert anchored_on(search, replace(previous, results={(2,): 2.0})).anchors == ((2,),)  # no own point: no winner
    assert anchored_on(replace(search, previous_size_anchor=False), previous).anchors == ((2,),)


def test_a_previous_size_anchor_needs_true_or_false() -> None:
    node = {
        "searcher": "gp",
        "budget": 3,
        "tuning_seeds": [1],
        "seeds": [2],
        "search": LR_SEARCH,
        "arms": {"m1": {"overrides": [], "previous_size_anchor": "yes"}},
    }
    with pytest.raises(ConfigError, match=r"study.arms.m1.previous_size_anchor='yes' must be true or false"):
        StudySpec.from_config(node)


def test_a_ladder_report_mid_study_reads_a_size_that_only_some_arms_reached(tmp_path) -> None:
    """The largest size has run data parallelism's points, but its anchored arm waits for the
    next smaller size's winner: the report reads every size as it stands."""
    spec = ladder_spec(True, dp={"overrides": []})
    model = {"vocab_size": 64, "n_layers": 1, "d_model": 16, "n_heads": 2, "n_kv_heads": 1, "mlp_hidden": 32}
    runs = []
    for size, arms in ((1, ("dp", "m1")), (2, ("dp", "m1")), (3, ("dp",))):
        for arm in arms:
            for index, (lr, loss) in enumerate(((1e-3, 2.2), (2e-3, 2.0 + size / 100), (4e-3, 2.1))):
                path = tmp_path / f"{size}{arm}{index}"
                path.mkdir()
                (path / FINISHED).write_text("{}\n")
                config = {
                    "model": {**model, "n_layers": size},
                    "study": {"arm": arm, "phase": "tune"},
                    "seed": 1,
                    "optimizer": {"lr": lr},
                }
                overrides = [
                    f"model=size{size}",
                    f"study.arm={arm}",
                    "++study.phase=tune",
                    f"optimizer.lr={lr}",
                    "seed=1",
                ]
                runs.append(Run(path, config, overrides, [{"val/loss": loss}]))
    found = tunings(spec, runs)
    assert set(found) == {(arm, f"model=size{size}") for arm in ("dp", "m1") for size in (1, 2)} | {
        ("dp", "model=size3")
    }
    assert found[("dp", "model=size3")].results == {(0,): 2.2, (1,): pytest.approx(2.03), (2,): 2.1}
    assert found[("m1", "model=size2")].results[(1,)] == pytest.approx(2.02)

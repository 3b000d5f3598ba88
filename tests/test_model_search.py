"""The joint search and the rules every searcher is judged by: a replayed plan depends only on
the finished results and the seed, anchors run first and stay controls, the budget is spent
exactly, and an anchor that beats the winner makes the arm not tuned."""

import math
import random
from dataclasses import replace

import pytest

from common.errors import ConfigError
from study.coordinate_search import AT_LIMIT, BRACKETED, NOT_BRACKETED
from study.joint_search import forget_asked_rounds
from study.search_space import MAX_EXTENSION, Choice, Range, SearchSpace, parse_anchors
from study.selection import TUNED, UNDECIDED
from study.tuner import Search, Tuning, rises_on_both_sides

LR = Range("optimizer.lr", 1e-3, 4e-3, "log", 2, 2.5e-4, 3.2e-2)
H = Range("technique.diloco.sync_every", 10, 90, "log", 3, 1, 300)
OPTIMIZER = Choice(
    "technique.diloco.outer_optimizer", ({"momentum": 0.0, "nesterov": False}, {"momentum": 0.9, "nesterov": True})
)
SPACE = SearchSpace((LR, H, OPTIMIZER))


def loss(point: tuple[int, ...]) -> float:
    labels = SPACE.labels(point)
    nesterov = labels[OPTIMIZER.key].endswith("true")
    return (
        1.5
        + 0.02 * math.log2(float(labels[LR.key]) / 8e-3) ** 2
        + 0.03 * math.log(float(labels[H.key]) / 30, 3) ** 2
        + 0.02 * nesterov
    )


def run(search: Search, noise_seed: int = 0) -> tuple[dict, list[list[tuple[int, ...]]]]:
    """The search to its end against ``loss`` with noise; the results and each round's points."""
    noise, results, rounds = random.Random(noise_seed), {}, []
    while pending := Tuning(search, dict(results)).pending:
        rounds.append(pending)
        for point in pending:
            results[point] = loss(point) + noise.gauss(0, 0.005)
    return results, rounds


@pytest.fixture(scope="module")
def gp_search() -> tuple[Search, dict, list]:
    search = Search(SPACE, "gp", budget=10, round_size=4, seed=3, anchors=((1, 0, 0),))
    results, rounds = run(search)
    return search, results, rounds


def test_the_first_round_is_the_anchors_and_the_budget_is_spent_exactly(gp_search) -> None:
    search, results, rounds = gp_search
    assert rounds[0][0] == (1, 0, 0) and len(rounds[0]) == 4
    assert [len(r) for r in rounds] == [4, 4, 2] and len(results) == 10 == len({p for r in rounds for p in r})
    assert all(p[0] in LR.span and p[1] in H.span and p[2] in OPTIMIZER.span for p in results)


def test_a_replay_proposes_the_same_rounds_from_the_same_results_in_any_order(gp_search) -> None:
    search, results, rounds = gp_search
    first = {p: results[p] for p in rounds[0]}
    assert Tuning(search, first).pending == rounds[1]
    shuffled = dict(sorted(first.items(), reverse=True))  # another worker read them in another order
    assert Tuning(search, shuffled).pending == rounds[1]
    # Mid-round (a point of round 2 finished, the others running): the same round's rest.
    partial = {**first, rounds[1][0]: results[rounds[1][0]]}
    assert Tuning(search, partial).pending == rounds[1][1:]
    assert Tuning(search, results).pending == []
    # A new process (nothing kept as asked) replays from scratch to the same rounds.
    forget_asked_rounds()
    before_last = {p: results[p] for r in rounds[:-1] for p in r}
    assert Tuning(search, before_last).pending == rounds[-1]
    # Another searcher seed gives another search.
    other = Search(SPACE, "gp", budget=10, round_size=4, seed=4, anchors=((1, 0, 0),))
    assert Tuning(other, first).pending != rounds[1]


def test_the_winner_is_the_searchers_own_best_and_anchors_stay_controls(gp_search) -> None:
    search, results, _ = gp_search
    tuning = Tuning(search, results)
    own = [p for p in results if p != (1, 0, 0)]
    assert tuning.winner == min(own, key=lambda p: (results[p], p))


def test_a_run_the_search_never_asked_is_not_its_point(gp_search) -> None:
    """A run left in the space by an earlier search (a preset edited mid-study) is not this
    search's: the table, finalists and brackets equal the search's without it."""
    search, results, _ = gp_search
    search = replace(search, finalists=2, finalist_seeds=(21,))
    stray = (3, 1, 0)  # next to the winner along the LR, far better than anything asked
    assert stray not in results and Tuning(search, results).winner == (2, 1, 0)
    left = Tuning(search, {**results, stray: 1.0})
    alone = Tuning(search, results)
    assert left.pending == [] and left.searched == results
    assert (left.finalists, left.winner, left.statuses) == (alone.finalists, alone.winner, alone.statuses)
    # Read as this search's point, the stray would have left the LR unbracketed: it lies
    # below the winner on the winner's own line.
    assert not rises_on_both_sides(SPACE, {**results, stray: 1.0}, (2, 1, 0), 0, (1, 3))
    assert alone.statuses[LR.key] == BRACKETED


def test_an_anchor_that_beats_the_winner_makes_the_arm_not_tuned() -> None:
    space = SearchSpace((LR,))
    anchor = (4,)  # 1.6e-2: off the first design (1e-3, 2e-3, 4e-3)
    search = Search(space, "coordinate", budget=4, anchors=(anchor,))
    results = {(0,): 2.0, (1,): 1.9, (2,): 1.8, anchor: 1.7}
    tuning = Tuning(search, results)
    # The budget is spent (4 points); the rule's own best is 4e-3, bracketed on one side only.
    assert tuning.pending == [] and tuning.winner == (2,)
    # One tuning seed: a lead of 0.1 with no spread to test it, more than the margin: undecided.
    (lead,) = tuning.anchor_leads
    assert lead.lead.value == pytest.approx(0.1) and lead.verdict == UNDECIDED and not tuning.tuned
    fair = Tuning(search, {**results, anchor: 1.85})
    assert [lead.verdict for lead in fair.anchor_leads] == [TUNED] and fair.winner == (2,)


def test_a_winner_at_the_extension_guard_is_not_bracketed_but_one_at_a_hard_limit_is_at_limit() -> None:
    free = Range("x", 1.0, 4.0, "log", 2)  # no hard limits: the guard stops it MAX_EXTENSION steps out
    top = 2 + MAX_EXTENSION
    results = {(i,): -float(i) for i in range(0, top + 1)}
    assert free.neighbour(top, 1) is None and not free.at_hard_limit(top, 1)
    assert Tuning(Search(SearchSpace((free,)), "coordinate"), results).statuses == {"x": NOT_BRACKETED}
    limited = Range("x", 1.0, 4.0, "log", 2, None, 16.0)
    assert limited.at_hard_limit(4, 1)
    assert Tuning(Search(SearchSpace((limited,)), "coordinate"), {(i,): -float(i) for i in range(5)}).statuses == {
        "x": AT_LIMIT
    }


def full_search(dimension: Range, best: float) -> Tuning:
    """A random search whose budget is the whole span, against a bowl around ``best``."""
    search = Search(SearchSpace((dimension,)), "random", budget=len(dimension.span), seed=0)
    results: dict = {}
    while pending := Tuning(search, dict(results)).pending:
        results.update({p: math.log2(dimension.value(p[0]) / best) ** 2 for p in pending})
    return Tuning(search, results)


def test_joint_statuses_read_the_points_run_on_each_side() -> None:
    assert LR.span == range(-2, 6)  # 2.5e-4 .. 3.2e-2: the hard limits
    assert full_search(LR, 2e-3).statuses == {LR.key: BRACKETED}
    assert full_search(LR, 1.0).statuses == {LR.key: AT_LIMIT}
    free = Range("optimizer.lr", 1e-3, 4e-3, "log", 2)  # no limits: SEARCH_MARGIN steps past the grid
    assert free.span == range(-2, 5)
    assert full_search(free, 1.0).statuses == {LR.key: NOT_BRACKETED}


def test_a_diverged_run_is_told_as_the_worst_and_never_wins() -> None:
    search = Search(SearchSpace((LR,)), "gp", budget=6, round_size=3, seed=0)
    first = Tuning(search, {}).pending
    results = {p: (math.nan if i == 0 else 1.0 + 0.01 * i) for i, p in enumerate(first)}
    tuning = Tuning(search, results)
    assert tuning.winner == first[1] and len(tuning.pending) == 3 and first[0] not in tuning.pending


@pytest.mark.parametrize("blown_up", [1e3, math.inf])
def test_a_loss_in_the_thousands_is_told_as_a_diverged_run_not_as_itself(blown_up) -> None:
    """A diverged DiLoCo run ended at a validation loss of about 1e3: told as itself it would
    dwarf the surface the model fits; it must plan exactly as a NaN does."""
    search = Search(SearchSpace((LR,)), "gp", budget=9, round_size=3, seed=0)
    first = Tuning(search, {}).pending
    forget_asked_rounds()
    as_nan = Tuning(search, {p: (math.nan if i == 0 else 1.0 + 0.01 * i) for i, p in enumerate(first)}).pending
    forget_asked_rounds()
    as_loss = Tuning(search, {p: (blown_up if i == 0 else 1.0 + 0.01 * i) for i, p in enumerate(first)}).pending
    assert as_loss == as_nan


def test_a_joint_search_needs_no_duplicate_runs_in_a_tiny_space() -> None:
    tiny = SearchSpace((Choice("x", (1, 2, 3)),))
    results, rounds = {}, []
    search = Search(tiny, "gp", budget=3, round_size=2, seed=0)
    while pending := Tuning(search, dict(results)).pending:
        rounds.append(pending)
        results.update({p: float(p[0]) for p in pending})
    assert sorted(results) == [(0,), (1,), (2,)] and [len(r) for r in rounds] == [2, 1]


@pytest.mark.parametrize(
    ("anchors", "message"),
    [
        (
            [{"optimizer.lr": 3e-3}],
            "optimizer.lr=0.003 is not a point of the search space; use a grid value within the search's span",
        ),
        ([{"optimizer.lr": 6.4e-2}], "optimizer.lr=0.064 is not a point of the search space"),
        ([{"optimizer.beta2": 0.95}], "names ['optimizer.beta2'], which the arm does not search"),
        (
            [{OPTIMIZER.key: {"momentum": 0.5, "nesterov": True}}],
            "use one of the listed values (momentum=0,nesterov=false, momentum=0.9,nesterov=true)",
        ),
        ({"optimizer.lr": 2e-3}, "must be a list of points"),
    ],
)
def test_bad_anchors_name_the_anchor_the_key_and_the_fix(anchors, message) -> None:
    with pytest.raises(ConfigError, match=r"study\.arms\.m1\.anchors") as error:
        parse_anchors(anchors, SPACE, "study.arms.m1.anchors")
    assert message in str(error.value)


def test_an_anchor_names_a_point_and_takes_the_centre_elsewhere() -> None:
    (point,) = parse_anchors([{H.key: 300, OPTIMIZER.key: {"momentum": 0.0, "nesterov": False}}], SPACE, "a")
    assert SPACE.labels(point) == {LR.key: "0.002", H.key: "300", OPTIMIZER.key: "momentum=0,nesterov=false"}

"""The joint search: Optuna's samplers proposing points of a study's space in rounds.

The coordinate rule (``study/coordinate_search.py``) moves one setting at a time, so it
stops on a ridge where settings act together (an outer LR and its momentum: the outer step
scales about as lr / (1 - momentum)) once no single-axis neighbour is better. A model of the
whole surface does not: Optuna's Gaussian-process sampler (``gp``, the default), its
multivariate TPE (``tpe``) or plain random sampling (``random``, the benchmark's floor) propose
points over every dimension at once, through the ask/tell interface, from a fixed span of
each range's grid (``Range.span``: to the hard limits, or ``SEARCH_MARGIN`` steps past the
first grid where none is given).

A search is a pure function of its results and its seed: every call replays the rounds into
a fresh in-memory study (no database), in the same order, telling each point its mean loss
over the tuning seeds, so a resumed study, or a second worker, proposes the same points.

- **Rounds.** The first round is the arm's anchors (points every search runs, as controls)
  and as many sampled points as fill ``round_size``; each later round asks ``round_size``
  points with the earlier ones told (the samplers see the round's open points, so they
  spread). A round is proposed whole, so workers stay busy; the next is planned only when
  every point of this one has finished. The search ends when ``budget`` points have run.
- **Repeats cost nothing.** A sampled point that already has a result is told it again and
  another is asked (it still counts as the searcher's own choice); a point already open in
  the round is refused and re-asked; after ``MAX_REPEATS`` repeats in a row the searcher takes
  a random point not yet run, from its seeded generator.
- **Diverged runs** (a loss that is NaN, infinite or above ``DIVERGED_LOSS``) are told the
  worst loss so far that is not, plus one nat, so the model learns to avoid them without a
  spike that flattens the rest of the surface.
- **Own points.** The winner is picked among the points the sampler chose itself; an anchor
  it never chose stays a control, which is what lets the regret check
  (``study/tuner.py``) say the search fell short of a known point.

The model is fitted in one thread (results then never depend on the machine's thread count,
which would let two workers disagree on a round). A process keeps the study as each round was
asked (``_ASKED``, keyed by the rounds told before it and the size of the round asked), so replaying a long search fits the
model only for the rounds it has not asked yet; a copy continues exactly as the replay from
scratch would, since it is the state that replay reaches.
"""

import contextlib
import copy
import random
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from study.search_record import ANCHOR, OWN, REPEAT, Round, SearchRecord
from study.search_space import Choice, Point, SearchSpace

SAMPLERS = ("gp", "tpe", "random")
#: Sampled repeats of a run (or open) point in a row before a random unrun point is taken.
MAX_REPEATS = 20
#: Tries at drawing an unrun point at random before the search calls the space exhausted.
MAX_DRAWS = 10_000
#: Rounds kept as asked (the newest), to resume a replay from.
CACHED_ROUNDS = 512
_ASKED: "OrderedDict[tuple, Any]" = OrderedDict()


@dataclass(frozen=True)
class Replay:
    """A joint search replayed over its results: the points to run next (empty when the
    budget is spent), the points the sampler chose itself and every point the search asked
    (anchors included; a run elsewhere in the space is not the search's)."""

    pending: list[Point]
    own: frozenset[Point]
    asked: frozenset[Point]


# Nats per token above which a run has diverged: worse than a uniform guess over any
# vocabulary (ln 1e6 = 13.8). A diverged run's validation loss can be in the thousands.
DIVERGED_LOSS = 100.0


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _sampler(name: str, seed: int, startup: int):
    import optuna

    if name == "gp":
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=startup)
    if name == "tpe":
        return optuna.samplers.TPESampler(
            seed=seed, n_startup_trials=startup, multivariate=True, group=True, constant_liar=True
        )
    return optuna.samplers.RandomSampler(seed=seed)


def _distributions(space: SearchSpace) -> dict:
    from optuna.distributions import CategoricalDistribution, IntDistribution

    return {
        f"x{axis}": CategoricalDistribution(tuple(d.span))
        if isinstance(d, Choice)
        else IntDistribution(d.span.start, d.span.stop - 1)
        for axis, d in enumerate(space.dimensions)
    }


def _params(point: Point) -> dict[str, int]:
    return {f"x{axis}": index for axis, index in enumerate(point)}


def replay(
    space: SearchSpace,
    sampler: str,
    seed: int,
    budget: int,
    round_size: int,
    anchors: tuple[Point, ...],
    results: dict[Point, float],
    record: "SearchRecord | None" = None,
) -> Replay:
    """The search's rounds replayed over ``results`` (point -> mean loss over the tuning seeds);
    with a ``record`` (``study/search_record.py``) each round recorded there is taken as it
    was asked, and each round asked here is recorded (unless a worker recorded it first)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    told_rounds: tuple = ()  # the rounds told so far: what the next one was asked after
    with _one_thread():
        state = _start(space, sampler, seed, round_size)
        while state["spent"] < budget:
            k = len(told_rounds)
            recorded = record.round(k) if record is not None else None
            # The budget shapes a round only through its size: searches of other budgets share rounds.
            size = min(max(round_size, len(anchors) if state["spent"] == 0 else 0), budget - state["spent"])
            key = (
                repr(space),
                sampler,
                seed,
                size,
                round_size,
                anchors,
                told_rounds,
                "no record" if record is None else recorded,
            )
            if key not in _ASKED:
                fresh = copy.deepcopy(state)
                _ASKED[key] = (
                    _force_round(fresh, space, recorded)
                    if recorded is not None
                    else _ask_round(fresh, space, budget, round_size, anchors)
                )
                while len(_ASKED) > CACHED_ROUNDS:
                    _ASKED.popitem(last=False)
            asked = copy.deepcopy(_ASKED[key])
            if record is not None and recorded is None and asked["entries"]:
                entries = tuple(asked["entries"])
                if record.add_round(k, entries, _distributions(space), asked["told"]) != entries:
                    continue  # another worker recorded this round first: take theirs
            state, batch = asked, asked["batch"]
            pending = [point for _, point in batch if point not in results]
            if pending or not batch:
                return _replayed(pending, state)
            told = []
            for number, point in batch:
                value = _told_value(results[point], state["told"])
                state["study"].tell(number, value)
                state["told"][point] = results[point]
                told.append((point, value, results[point]))
            if record is not None:
                record.tell(k, told)
            state["spent"] += len(batch)
            told_rounds += (tuple((point, results[point]) for _, point in batch),)
    return _replayed([], state)


def _replayed(pending: list[Point], state: dict[str, Any]) -> Replay:
    """The replay where it stopped: the rounds told and the round open (or the last one told)."""
    asked = frozenset(state["told"]) | {point for _, point in state["batch"]}
    return Replay(pending, frozenset(state["own"]), asked)


def _force_round(state: dict[str, Any], space: SearchSpace, recorded: "Round") -> dict[str, Any]:
    """A recorded round re-asked as it was: each point enqueued in the recorded order, a repeat
    told again at once, the searcher's own points marked as its own."""
    study, distributions, batch = state["study"], _distributions(space), []
    for point, kind in recorded:
        study.enqueue_trial(_params(point))
        trial = study.ask(distributions)
        if kind == REPEAT:
            study.tell(trial, _told_value(state["told"][point], state["told"]))
        else:
            batch.append((trial.number, point))
        if kind != ANCHOR:
            state["own"].add(point)
    state["batch"], state["entries"] = batch, list(recorded)
    return state


def forget_asked_rounds() -> None:
    """Drop the rounds kept as asked: the next replay starts from scratch."""
    _ASKED.clear()


def _start(space: SearchSpace, sampler: str, seed: int, round_size: int) -> dict[str, Any]:
    """A fresh search: its study, told points, own points, points spent, random draws."""
    import optuna

    study = optuna.create_study(direction="minimize", sampler=_sampler(sampler, seed, round_size))
    return {
        "study": study,
        "told": {},
        "own": set(),
        "spent": 0,
        "draws": random.Random(seed),
        "batch": [],
        "entries": [],
    }


def _ask_round(
    state: dict[str, Any], space: SearchSpace, budget: int, round_size: int, anchors: tuple[Point, ...]
) -> dict[str, Any]:
    """The next round asked (the anchors first in the first round): ``state['batch']`` holds
    each point with its trial's number, ``state['entries']`` every point asked with its kind
    (what a record keeps)."""
    study, distributions, batch = state["study"], _distributions(space), []
    state["entries"] = []
    for anchor in anchors if state["spent"] == 0 else ():
        study.enqueue_trial(_params(anchor))
        batch.append((study.ask(distributions), anchor))
        state["entries"].append((anchor, ANCHOR))
    size = min(max(round_size, len(batch)), budget - state["spent"])
    while len(batch) < size:
        found = _ask(study, distributions, state, {p for _, p in batch}, space)
        if found is None:
            break  # every point of the space has run
        batch.append(found)
        state["entries"].append((found[1], OWN))
    state["batch"] = [(trial.number, point) for trial, point in batch]
    return state


def _ask(study, distributions: dict, state: dict[str, Any], open_points: set[Point], space: SearchSpace):
    """The sampler's next new point (repeats told or refused on the way), or a random unrun one."""
    from optuna.trial import TrialState

    told, own = state["told"], state["own"]
    for _ in range(MAX_REPEATS):
        trial = study.ask(distributions)
        point = tuple(trial.params[f"x{axis}"] for axis in range(len(space.dimensions)))
        if point in told:
            study.tell(trial, _told_value(told[point], told))
            own.add(point)
            state["entries"].append((point, REPEAT))
        elif point in open_points:
            study.tell(trial, state=TrialState.FAIL)
        else:
            own.add(point)
            return trial, point
    spans = [d.span for d in space.dimensions]
    for _ in range(MAX_DRAWS):
        point = tuple(state["draws"].choice(span) for span in spans)
        if point not in told and point not in open_points:
            study.enqueue_trial(_params(point))
            own.add(point)
            return study.ask(distributions), point
    return None


def diverged(loss: float) -> bool:
    return not loss <= DIVERGED_LOSS  # NaN compares false


def _told_value(loss: float, told: dict[Point, float]) -> float:
    """The loss as the sampler sees it: a diverged run's as the worst loss so far of a run
    that did not diverge, plus one nat (or ``DIVERGED_LOSS`` before any)."""
    if not diverged(loss):
        return loss
    trained = [v for v in told.values() if not diverged(v)]
    return max(trained) + 1.0 if trained else DIVERGED_LOSS

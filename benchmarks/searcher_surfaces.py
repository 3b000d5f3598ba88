"""Synthetic loss surfaces with the shapes tuned studies meet, and a search run against one.

Each surface is a noise-free loss over a study's search space plus seeded Gaussian noise of
``NOISE`` nats (the seed spread measured between runs of the default model: about 0.01), so
a searcher sees what it would see in a study and the benchmark can still score the point it
picks by its true loss:

- ``bowl``: separable, every setting with its own optimum (the coordinate rule's best case);
- ``outer ridge``: DiLoCo's outer step scales about as lr / (1 - momentum), so the loss
  depends on that ratio and the best momentum is 0 (the identity outer step won the last
  study), while a search started at Nesterov 0.9 finds a ridge point first;
  both at the curvature measured in the DiLoCo study and at a flatter one (``Curvature``);
- ``outer ridge at the identity anchor``: the ridge, at either curvature,
  moved so that its optimum is the presets' identity anchor (inner LR 2e-3, outer LR 1, no momentum, H 10):
  the searcher's own points must compete with an anchor it did not choose (only on searches
  with that anchor);
- ``lr x batch``: the best LR grows linearly with the batch (the linear scaling rule) and the
  loss prefers small batches at a fixed token budget: a diagonal valley;
- ``plateau``: where DiLoCo without outer momentum reduces to AdamW (H = 1; one replica at
  outer LR 1), a plateau along inner LR x outer LR just above a narrow valley of DiLoCo
  proper, as the tuned ladder measured; only for searches that fix the outer optimizer.

The DiLoCo surfaces use an arm's search of a study preset (by default the ``m2`` arm of
``conf/sweep/diloco_tuned.yaml``: its space, budget, round size, finalists and anchors); a
setting the arm does not search is read at the surface's optimum (data parallelism's arm sees
each surface along the inner LR). The LR x batch surface has a two-setting space of its own
with ``LR_BATCH_BUDGET`` points.
"""

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from launch.from_config import config_file
from study.preset import StudySpec
from study.search_space import Point, SearchSpace, parse_search
from study.tuner import Search, Tuning

REPO = Path(__file__).resolve().parents[1]
#: The study whose DiLoCo search the surfaces use unless told another (``--preset``, ``--arm``).
PRESET_NAME = "diloco_tuned"
#: The seed spread of a final val/loss (nats), the noise each evaluation gets.
NOISE = 0.01
#: Within this much of the grid optimum's loss (nats), a searcher has found it.
TOLERANCE = 0.005
LR_BATCH_BUDGET = 16


@dataclass(frozen=True)
class Surface:
    name: str
    search: Search
    loss: Callable[[dict[str, str]], float]  # the search's labels of a point -> noise-free loss

    def true_loss(self, point: Point) -> float:
        return self.loss(self.search.space.labels(point))

    def optimum_point(self) -> Point:
        """The grid optimum over the whole span (brute force)."""
        return min(_product([d.span for d in self.search.space.dimensions]), key=self.true_loss)

    def optimum(self) -> float:
        return self.true_loss(self.optimum_point())


def _product(spans: list[range]):
    if not spans:
        yield ()
        return
    for index in spans[0]:
        for rest in _product(spans[1:]):
            yield (index, *rest)


def diloco_search(preset: str = PRESET_NAME, arm: str = "m2") -> Search:
    """A DiLoCo arm's search as a study preset (``conf/sweep/NAME.yaml``) declares it."""
    node = config_file(REPO / "conf" / "sweep" / f"{preset}.yaml")["study"]
    return StudySpec.from_config(node).searches[arm]


#: The outer optimizer of a search that does not search it (the ladder fixes it there).
NO_MOMENTUM = "momentum=0,nesterov=false"
#: H at both surfaces' optimum. A search without a setting (data parallelism searches the
#: inner LR alone) sees each surface along the inner LR at the other settings' optimum.
BEST_H = 30


#: The outer optimizer's setting, where a search has it as a dimension.
OUTER_OPTIMIZER = "technique.diloco.outer_optimizer"


def _outer(labels: dict[str, str], best_outer_lr: float) -> tuple[float, float, bool]:
    optimizer = dict(part.split("=") for part in labels.get(OUTER_OPTIMIZER, NO_MOMENTUM).split(","))
    outer_lr = float(labels.get("technique.diloco.outer_lr", best_outer_lr))
    return outer_lr, float(optimizer["momentum"]), optimizer["nesterov"] == "true"


def _inner(labels: dict[str, str]) -> tuple[float, float]:
    """The inner LR and H; a search without H (data parallelism's) sees the surface at H's optimum."""
    return float(labels["optimizer.lr"]), float(labels.get("technique.diloco.sync_every", BEST_H))


@dataclass(frozen=True)
class Curvature:
    """How much a grid step away from the optimum costs, per setting (nats per squared step)
    and per outer optimizer. ``MEASURED`` takes them from the coordinate-search DiLoCo study
    at its winner (docs/techniques/diloco.md, M = 1): a factor 2 of inner LR about 0.03, a
    factor 3 of H about 0.08, a factor 2 of outer LR 0.03-0.07, momentum 0 / heavy-ball 0.9
    0.08 / 0.14 above Nesterov 0.9, Nesterov 0.5 0.005 above; ``FLAT`` is flatter than any
    of those (a harder surface to locate the optimum on under the same noise)."""

    lr: float
    h: float
    outer_lr: float
    optimizers: tuple[float, float, float, float]  # momentum 0, Nesterov 0.9, heavy-ball 0.9, Nesterov 0.5


MEASURED = Curvature(lr=0.03, h=0.08, outer_lr=0.04, optimizers=(0.08, 0.0, 0.14, 0.005))
FLAT = Curvature(lr=0.02, h=0.03, outer_lr=0.02, optimizers=(0.02, 0.01, 0.0, 0.015))
OPTIMIZERS = ((0.0, False), (0.9, True), (0.9, False), (0.5, True))


def bowl(curvature: Curvature) -> Callable[[dict[str, str]], float]:
    """Separable: inner LR 4e-3, outer LR 0.35, H 30, each optimizer its own offset."""

    best_outer_lr = 0.35

    def loss(labels: dict[str, str]) -> float:
        lr, h = _inner(labels)
        outer_lr, momentum, nesterov = _outer(labels, best_outer_lr)
        optimizer = curvature.optimizers[OPTIMIZERS.index((momentum, nesterov))]
        return (
            1.5
            + curvature.lr * math.log2(lr / 4e-3) ** 2
            + curvature.outer_lr * math.log2(outer_lr / best_outer_lr) ** 2
            + optimizer
            + curvature.h * math.log(h / BEST_H, 3) ** 2
        )

    return loss


def outer_ridge(
    curvature: Curvature, best_lr: float = 1e-3, best_step: float = 1.41, best_h: float = BEST_H
) -> Callable[[dict[str, str]], float]:
    """The outer step acts as lr / (1 - momentum), best at ``best_step`` (1.41); momentum costs
    0.03 per unit, so the best point is momentum 0 at that outer LR (inner LR 1e-3, H 30), while
    Nesterov 0.9 at a tenth of it lies on the ridge 0.027 higher."""

    def loss(labels: dict[str, str]) -> float:
        lr = float(labels["optimizer.lr"])
        h = float(labels.get("technique.diloco.sync_every", best_h))
        outer_lr, momentum, _ = _outer(labels, best_step)
        step = outer_lr / (1 - momentum)
        return (
            1.5
            + curvature.lr * math.log2(lr / best_lr) ** 2
            + 2.5 * curvature.outer_lr * math.log2(step / best_step) ** 2
            + curvature.h * math.log(h / best_h, 3) ** 2
            + 0.03 * momentum
        )

    return loss


#: The identity outer step the DiLoCo presets anchor on (inner LR 2e-3, outer LR 1 without
#: momentum, H 10): the optimum of the "outer ridge (optimum at the identity anchor)" surface,
#: where the searcher's own points must compete with an anchor it has not chosen.
IDENTITY = {"lr": 2e-3, "step": 1.0, "h": 10}


#: Where the plateau surface's DiLoCo-specific valley lies (the nano rerun's M = 1 winner) and
#: how far below the plateau it sits (the tuned ladder at 0.1M: that winner's mean over two
#: seeds, 2.1820, against data parallelism's tuned 2.1979).
VALLEY = {"lr": 4e-3, "outer_lr": 0.707107, "h": 10}
VALLEY_DEPTH = 0.016
#: The plateau's best AdamW LR (data parallelism's tuned LR at 0.1M and 0.3M, 5.66e-3).
PLATEAU_LR = 4e-3 * math.sqrt(2)


def plateau(one_replica: bool, curvature: Curvature = MEASURED) -> Callable[[dict[str, str]], float]:
    """DiLoCo without outer momentum is AdamW at LR inner LR x outer LR wherever it syncs every
    step (H = 1, any M) or, with one replica, steps by the whole pseudo-gradient (outer LR 1),
    as the tuned ladder measured (identical losses to the fourth decimal). Those points form a
    plateau along the LR product, ``VALLEY_DEPTH`` above a valley of DiLoCo proper at the nano
    winner; elsewhere the loss grows with the bowl's curvature. A point without H is data
    parallelism: on the plateau."""

    def loss(labels: dict[str, str]) -> float:
        lr = float(labels["optimizer.lr"])
        h = float(labels.get("technique.diloco.sync_every", 1))
        outer_lr, _, _ = _outer(labels, 1.0)
        if h == 1 or (one_replica and abs(outer_lr - 1.0) < 1e-6):
            return 1.5 + VALLEY_DEPTH + curvature.lr * math.log2(lr * outer_lr / PLATEAU_LR) ** 2
        return (
            1.5
            + curvature.lr * math.log2(lr / VALLEY["lr"]) ** 2
            + curvature.outer_lr * math.log2(outer_lr / VALLEY["outer_lr"]) ** 2
            + curvature.h * math.log(h / VALLEY["h"], 3) ** 2
        )

    return loss


def lr_batch(labels: dict[str, str]) -> float:
    lr, batch = float(labels["optimizer.lr"]), float(labels["batch.global_batch_size"])
    best_lr = 2e-3 * batch / 16
    return 1.5 + 0.05 * math.log2(lr / best_lr) ** 2 + 0.015 * math.log2(batch / 16) ** 2


def lr_batch_search(searcher: str) -> Search:
    dimensions = parse_search(
        {
            "optimizer.lr": {"low": 4e-3, "high": 1.6e-2, "scale": "log", "step": 2, "min": 1e-3, "max": 6.4e-2},
            "batch.global_batch_size": {"low": 32, "high": 128, "scale": "log", "step": 2, "min": 4, "max": 256},
        },
        "lr x batch",
    )
    diloco = diloco_search()  # the same finalists as the DiLoCo study's
    return Search(
        SearchSpace(tuple(dimensions.values())),
        searcher,
        LR_BATCH_BUDGET,
        finalists=diloco.finalists,
        finalist_seeds=diloco.finalist_seeds,
    )


def surfaces(searcher: str, seed: int, preset: str = PRESET_NAME, arm: str = "m2") -> list[Surface]:
    """Every surface on the arm's search; the plateau ones only where the search fixes the
    outer optimizer (their reduction to AdamW holds without outer momentum alone)."""
    diloco = replace(diloco_search(preset, arm), searcher=searcher, seed=seed)
    at_identity = {c: outer_ridge(c, IDENTITY["lr"], IDENTITY["step"], IDENTITY["h"]) for c in (MEASURED, FLAT)}
    found = [
        Surface("bowl (measured)", diloco, bowl(MEASURED)),
        Surface("outer ridge (measured)", diloco, outer_ridge(MEASURED)),
        Surface("outer ridge at the identity anchor (measured)", diloco, at_identity[MEASURED]),
        Surface("outer ridge at the identity anchor (flat)", diloco, at_identity[FLAT]),
        Surface("bowl (flat)", diloco, bowl(FLAT)),
        Surface("outer ridge (flat)", diloco, outer_ridge(FLAT)),
    ]
    if all(d.key != OUTER_OPTIMIZER for d in diloco.space.dimensions):
        found += [
            Surface("plateau (M = 1)", diloco, plateau(one_replica=True)),
            Surface("plateau (M = 2)", diloco, plateau(one_replica=False)),
        ]
    found = [s for s in found if "identity anchor" not in s.name or s.optimum_point() in diloco.anchors]
    return [*found, Surface("lr x batch", replace(lr_batch_search(searcher), seed=seed), lr_batch)]


@dataclass(frozen=True)
class Trace:
    """A search against a surface: after each round, the runs so far, the best true loss
    among the points run, and the true loss of the point the searcher would pick; and every
    point's observed (noisy) loss, in the order they ran."""

    rounds: list[tuple[int, float, float]]
    observed: dict[Point, float]

    def runs_to_reach(self, target: float) -> int | None:
        """The runs after which a point within ``target`` had run (None: never)."""
        return next((runs for runs, best, _ in self.rounds if best <= target + 1e-12), None)

    def winner_at(self, runs: int) -> float:
        """The true loss of the best observed point after the last round that ended within ``runs``."""
        return [winner for done, _, winner in self.rounds if done <= runs][-1]


def run_search(surface: Surface, noise_seed: int) -> Trace:
    """The search to its end, each point evaluated once with seeded noise (no finalists: the
    search's own rounds, whose first ``budget`` points are those of a search with that budget)."""
    noise = random.Random(noise_seed)
    search = replace(surface.search, finalists=0)
    results: dict[Point, float] = {}
    rounds = []
    while pending := Tuning(search, dict(results)).pending:
        for point in pending:
            results[point] = surface.true_loss(point) + noise.gauss(0.0, NOISE)
        winner = Tuning(search, dict(results)).winner  # None while only anchors ran
        rounds.append(
            (
                len(results),
                min(surface.true_loss(p) for p in results),
                math.inf if winner is None else surface.true_loss(winner),
            )
        )
    return Trace(rounds, results)


def finished_at(surface: Surface, trace: Trace, budget: int, noise_seed: int) -> Tuning:
    """The search as it ends with ``budget`` points: its finalists and anchors run again on the
    finalist seeds (each run with fresh seeded noise) where the search has finalists."""
    search = replace(surface.search, budget=budget)
    results = dict(list(trace.observed.items())[:budget])
    noise, reruns = random.Random(noise_seed + 1_000_000), {}
    tuning = Tuning(search, results)
    while tuning.pending_reruns:
        for point, seed in tuning.pending_reruns:
            reruns.setdefault(point, {})[seed] = surface.true_loss(point) + noise.gauss(0.0, NOISE)
        tuning = Tuning(search, results, {p: dict(r) for p, r in reruns.items()})
    return tuning

"""The searcher benchmark's surfaces on another study's search: the tuned ladder's arms, whose
spaces leave settings out (no outer-optimizer dimension; data parallelism's has the inner LR alone)."""

import itertools
import math

from benchmarks.searcher_surfaces import MEASURED, surfaces
from study.search_space import Range


def test_the_ladder_preset_gives_its_arm_s_space_budget_and_anchor() -> None:
    bowl = next(s for s in surfaces("gp", 0, "scaling_ladder_tuned", "m1") if s.name == "bowl (measured)")
    search = bowl.search
    assert [d.key for d in search.space.dimensions] == [
        "optimizer.lr",
        "technique.diloco.outer_lr",
        "technique.diloco.sync_every",
    ]
    assert search.budget == 24 and search.finalists == 2 and search.finalist_seeds == (21, 22, 23, 24)
    assert search.finalist_first == 2 and search.regret_margin == 0.005
    assert search.previous_size_anchor and search.space.labels(search.anchors[0]) == {
        "optimizer.lr": "0.004",
        "technique.diloco.outer_lr": "0.707107",
        "technique.diloco.sync_every": "10",
    }
    # The grid optimum, by brute force over the grid values with the bowl's formula at no
    # momentum (its offset there: MEASURED's first), written out independently.
    grids = [[d.value(i) for i in d.span] for d in search.space.dimensions]
    assert all(isinstance(d, Range) for d in search.space.dimensions)

    def formula(lr: float, outer: float, h: float) -> float:
        return (
            1.5
            + MEASURED.lr * math.log2(lr / 4e-3) ** 2
            + MEASURED.outer_lr * math.log2(outer / 0.35) ** 2
            + MEASURED.optimizers[0]
            + MEASURED.h * math.log(h / 30, 3) ** 2
        )

    assert bowl.optimum() == min(formula(*values) for values in itertools.product(*grids))


def test_data_parallelism_s_arm_sees_the_surfaces_along_the_inner_lr_at_half_steps() -> None:
    """Data parallelism searches the inner LR alone, at steps of sqrt 2 from 2.5e-4 to 3.2e-2
    (15 values); the surfaces read its other settings at their optimum, so the bowl's optimum
    is its inner LR's (4e-3) and the outer ridge's is 1e-3, each at the surface's floor."""
    by_name = {s.name: s for s in surfaces("gp", 0, "scaling_ladder_tuned", "dp")}
    search = by_name["bowl (measured)"].search
    (lr,) = search.space.dimensions
    values = [lr.value(i) for i in lr.span]
    assert len(values) == 15 and math.isclose(values[0], 2.5e-4) and math.isclose(values[-1], 3.2e-2)
    assert all(math.isclose(b / a, math.sqrt(2), rel_tol=1e-5) for a, b in itertools.pairwise(values))
    assert search.budget == 8 and search.anchors == ()
    for name, best_lr in (("bowl (measured)", 4e-3), ("outer ridge (measured)", 1e-3)):
        surface = by_name[name]
        best = surface.optimum_point()
        assert math.isclose(float(surface.search.space.labels(best)["optimizer.lr"]), best_lr, rel_tol=1e-5)
        offset = MEASURED.optimizers[0] if name.startswith("bowl") else 0.0  # the bowl's no-momentum offset
        assert math.isclose(surface.optimum(), 1.5 + offset, abs_tol=1e-9)


def test_the_plateau_surface_is_adamw_wherever_diloco_reduces_to_it_and_its_valley_lies_below() -> None:
    """One replica at outer LR 1 without outer momentum is AdamW at the inner LR whatever H is
    (and H = 1 is AdamW at inner x outer LR for any M): those points equal data parallelism's
    surface at that LR. The ladder's DiLoCo space starts at H 3, so H = 1 is data parallelism's
    alone; on M = 1's grid the plateau's best point lies 0.016 + half an LR step's cost above
    the valley (written out here from the surface's description)."""
    m1 = {s.name: s for s in surfaces("gp", 0, "scaling_ladder_tuned", "m1")}["plateau (M = 1)"]
    dp = {s.name: s for s in surfaces("gp", 0, "scaling_ladder_tuned", "dp")}["plateau (M = 1)"]
    dimensions = m1.search.space.dimensions
    lr_values, _, h_values = ([d.value(i) for i in d.span] for d in dimensions)
    assert min(h_values) == 3
    for lr, h in itertools.product(lr_values, h_values):
        labels = {"optimizer.lr": str(lr), "technique.diloco.outer_lr": "1.0", "technique.diloco.sync_every": str(h)}
        assert m1.loss(labels) == dp.loss({"optimizer.lr": str(lr)})
    two = {s.name: s for s in surfaces("gp", 0, "scaling_ladder_tuned", "m2")}["plateau (M = 2)"]
    synced_every_step = two.loss(
        {"optimizer.lr": "0.008", "technique.diloco.outer_lr": "0.5", "technique.diloco.sync_every": "1"}
    )
    assert math.isclose(synced_every_step, dp.loss({"optimizer.lr": "0.004"}))
    assert m1.optimum() == 1.5 and m1.search.space.labels(m1.optimum_point()) == {
        "optimizer.lr": "0.004",
        "technique.diloco.outer_lr": "0.707107",
        "technique.diloco.sync_every": "10",
    }
    assert not any(s.name.startswith("plateau") for s in surfaces("gp", 0))  # momentum searched there
    plateau_best = min(m1.loss({"optimizer.lr": str(lr), "technique.diloco.outer_lr": "1"}) for lr in lr_values)
    assert math.isclose(plateau_best, 1.5 + 0.016 + MEASURED.lr * math.log2(math.sqrt(2)) ** 2)


def test_the_identity_ridge_has_its_optimum_at_the_presets_identity_anchor() -> None:
    """The ridge moved onto the identity outer step (inner LR 2e-3, outer LR 1, no momentum,
    H 10), written out here: its grid optimum, by brute force, is the DiLoCo study's first
    anchor, which the searcher did not choose; searches without that anchor do not get it."""
    surface = next(
        s for s in surfaces("gp", 0, "diloco_tuned", "m1") if s.name == "outer ridge at the identity anchor (measured)"
    )

    def formula(labels: dict[str, str]) -> float:
        parts = dict(part.split("=") for part in labels["technique.diloco.outer_optimizer"].split(","))
        momentum = float(parts["momentum"])
        step = float(labels["technique.diloco.outer_lr"]) / (1 - momentum)
        return (
            1.5
            + MEASURED.lr * math.log2(float(labels["optimizer.lr"]) / 2e-3) ** 2
            + 2.5 * MEASURED.outer_lr * math.log2(step) ** 2
            + MEASURED.h * math.log(float(labels["technique.diloco.sync_every"]) / 10, 3) ** 2
            + 0.03 * momentum
        )

    space = surface.search.space
    points = list(itertools.product(*(d.span for d in space.dimensions)))
    best = min(points, key=lambda p: formula(space.labels(p)))
    assert best == surface.search.anchors[0] == surface.optimum_point() and math.isclose(surface.optimum(), 1.5)
    assert all(math.isclose(surface.true_loss(p), formula(space.labels(p))) for p in points[::97])
    assert not any("identity anchor" in s.name for s in surfaces("gp", 0, "scaling_ladder_tuned", "m1"))

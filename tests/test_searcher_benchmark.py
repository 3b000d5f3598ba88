"""The searcher benchmark's surfaces on another study's search: the tuned ladder's arm, whose
space has no outer-optimizer dimension (the surfaces then read no momentum)."""

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
    assert search.budget == 20 and search.finalists == 2 and search.finalist_seeds == (21,)
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

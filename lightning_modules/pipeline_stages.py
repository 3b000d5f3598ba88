"""Which blocks each pipeline stage holds, and which stages each pipeline rank: shared by the
pipeline itself (``pipeline_parallel.py``) and the memory plan, which counts a rank's
weights and activations without building anything."""

import itertools


def stage_blocks(n_layers: int, stages: int) -> list[range]:
    """The blocks of each of ``stages`` stages, in order, as even as they can be."""
    base, extra = divmod(n_layers, stages)
    bounds = [0]
    for stage in range(stages):
        bounds.append(bounds[-1] + base + (1 if stage < extra else 0))
    return [range(start, end) for start, end in itertools.pairwise(bounds)]


def rank_stages(rank: int, ranks: int, stages_per_rank: int) -> list[int]:
    """The stages a pipeline rank holds: rank r holds r, r + ranks, r + 2 ranks and so on
    (the looped order the interleaved schedule expects)."""
    return [rank + ranks * loop for loop in range(stages_per_rank)]

"""The layouts paper's space (Hagemann et al. 2023) for one model on a number of devices:
data x tensor x pipeline parallel sizes, micro-batch, activation checkpointing, sequence
parallelism and the pipeline schedule, each with its memory plan per device.

A layout is a set of ``train.py`` overrides on top of the user's. The run's own checks
decide whether it can run at all (T must divide the heads, P the blocks, and so on: such a
layout is left out with the check's line), and the memory plan (``memory_plan.py``, the
plan the run itself logs) whether it fits the device memory given.
"""

import itertools
from dataclasses import dataclass, field

from benchmarks.loops import benchmark_settings
from common.errors import ConfigError
from launch.builders import build_datamodule
from lightning_modules.memory_plan import GIB


@dataclass(frozen=True)
class Layout:
    data: int
    tensor: int
    pipeline: int
    micro_batch: int
    checkpointing: str
    sequence_parallel: bool
    schedule: str  # "-" without a pipeline

    def overrides(self, global_batch: int) -> list[str]:
        devices = self.data * self.tensor * self.pipeline
        return [
            "strategy=fsdp2",
            f"trainer.devices={devices}",
            f"batch.global_batch_size={global_batch}",
            f"batch.micro_batch_size={self.micro_batch}",
            f"layout.activation_checkpointing={self.checkpointing}",
            f"strategy.tensor_parallel_size={self.tensor}",
            f"layout.sequence_parallel={str(self.sequence_parallel).lower()}",
            f"strategy.pipeline_parallel_size={self.pipeline}",
            f"layout.pipeline_schedule={'1f1b' if self.schedule == '-' else self.schedule}",
            f"layout.stages_per_rank={2 if self.schedule == 'interleaved_1f1b' else 1}",
            "strategy.save_distributed_checkpoint=true",
        ]

    def micro_batches(self, global_batch: int) -> int:
        """Micro-batches per step on each pipeline (the global batch over D data-parallel ranks)."""
        return global_batch // (self.data * self.micro_batch)

    def bubble(self, global_batch: int) -> float:
        """The share of a step a pipeline rank idles, (P - 1) / (m + P - 1), shorter by the
        stages per rank when interleaved; 0 without a pipeline."""
        if self.pipeline == 1:
            return 0.0
        stages = 2 if self.schedule == "interleaved_1f1b" else 1
        m = self.micro_batches(global_batch)
        return (self.pipeline - 1) / stages / (m + (self.pipeline - 1) / stages)


@dataclass
class Planned:
    layout: Layout
    overrides: list[str]
    plan_gib: float = 0.0
    states_gib: float = 0.0
    refused: str | None = None  # the run's own check, or the plan, says it cannot run
    measured: dict = field(default_factory=dict)


def splits(devices: int) -> list[tuple[int, int, int]]:
    """Every (D, T, P) with D x T x P = devices."""
    return [
        (devices // (t * p), t, p)
        for t in range(1, devices + 1)
        for p in range(1, devices + 1)
        if devices % (t * p) == 0
    ]


def enumerate_layouts(
    devices: int, micro_batches: list[int], global_batch: int, checkpointing_modes: tuple[str, ...] = ("none", "full")
) -> list[Layout]:
    """The space: every split, micro-batch and checkpointing mode; sequence parallelism on and
    off where T > 1; 1F1B and interleaved 1F1B (2 stages per rank) where P > 1."""
    layouts = []
    for (d, t, p), micro, checkpointing in itertools.product(splits(devices), micro_batches, checkpointing_modes):
        if global_batch % (d * micro):
            continue
        for sequence_parallel in (False, True) if t > 1 else (False,):
            for schedule in ("1f1b", "interleaved_1f1b") if p > 1 else ("-",):
                layouts.append(Layout(d, t, p, micro, checkpointing, sequence_parallel, schedule))
    return layouts


def plan_layouts(layouts: list[Layout], base: list[str], global_batch: int, device_gib: float) -> list[Planned]:
    """Each layout's plan per device; refused where the run's checks say no or the plan
    exceeds ``device_gib``."""
    vocab: list[int] = []
    planned = []
    for layout in layouts:
        overrides = [*base, *layout.overrides(global_batch)]
        entry = Planned(layout, overrides)
        try:
            settings = benchmark_settings(overrides, 1, 0)
            if not vocab:
                vocab.append(build_datamodule(settings).vocab_size)
            plan = settings.layout.memory_plan(settings.services_run(lambda: vocab[0]))
        except ConfigError as error:
            entry.refused = f"refused: {error}"
            planned.append(entry)
            continue
        entry.plan_gib, entry.states_gib = plan.total / GIB, plan.states / GIB
        if entry.plan_gib > device_gib:
            entry.refused = f"does not fit: plan {entry.plan_gib:.3g} GiB > {device_gib:g} GiB"
        planned.append(entry)
    return planned

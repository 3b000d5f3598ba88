"""Batch-size baselines for the adaptive schedule: sizes fixed in advance by training progress.

- ``ConstantBatch``: one size throughout.
- ``StagewiseBatchWarmup``: a list of sizes, each trained for an equal number of tokens
  (by default the token budget split evenly).
- ``LinearBatchRampup``: Megatron-LM's ``--rampup-batch-size start increment samples``:
  the size grows by ``increment`` every ``samples / ((target - start) / increment)``
  sequences until it reaches the target.

The size is a function of the clock alone, set before each optimizer step, so resuming is
exact. Every size must already be a multiple of micro_batch x data-parallel ranks: a
baseline that silently trained on rounded sizes would not be the baseline asked for.
"""

from abc import ABC, abstractmethod
from typing import Any

import lightning as L

from lightning_modules.clock import TrainingClock
from lightning_modules.global_batch import BatchConfigError, GlobalBatch, check_single_controller


class BatchSchedule(L.Callback, ABC):
    """Sets the global batch from the clock before every optimizer step."""

    controls_global_batch = True
    key = "callbacks.batch_schedule"

    @abstractmethod
    def size_at(self, clock: TrainingClock) -> int:
        """The global batch for the optimizer step after this clock reading."""

    @abstractmethod
    def sizes(self) -> dict[str, int]:
        """Every size the schedule can ask for, by setting name (checked in setup)."""

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        check_single_controller(trainer.callbacks)
        self.prepare(pl_module)
        batch = GlobalBatch(pl_module.batch_config, trainer.world_size)
        for name, size in self.sizes().items():
            if batch.valid_size(size) != size:
                raise BatchConfigError(
                    f"{self.key}.{name}={size} is not a multiple of micro_batch x ranks = {batch.granularity}"
                    f" (or exceeds batch.max_global_batch_size); use {batch.valid_size(size)}."
                )

    def prepare(self, pl_module: L.LightningModule) -> None:
        """Fill in settings that come from the run (token budget, target batch)."""

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int) -> None:
        if pl_module.at_step_boundary:
            size = self.size_at(pl_module.clock)
            if size != pl_module.global_batch.size:
                pl_module.global_batch.request(size)


class ConstantBatch(BatchSchedule):
    """The same global batch at every step."""

    key = "callbacks.constant_batch"

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"{self.key}.size={size} must be >= 1.")
        self.size = size

    def size_at(self, clock: TrainingClock) -> int:
        return self.size

    def sizes(self) -> dict[str, int]:
        return {"size": self.size}


class StagewiseBatchWarmup(BatchSchedule):
    """``sizes[k]`` while tokens seen are in [k * stage_tokens, (k + 1) * stage_tokens); the last size after.

    ``stage_tokens`` null: the token budget divided by the number of stages.
    """

    key = "callbacks.batch_warmup"

    def __init__(self, sizes: list[int], stage_tokens: int | None = None) -> None:
        if not sizes or any(size < 1 for size in sizes):
            raise ValueError(f"{self.key}.sizes={sizes} must be a non-empty list of positive sizes.")
        if stage_tokens is not None and stage_tokens < 1:
            raise ValueError(f"{self.key}.stage_tokens={stage_tokens} must be >= 1 (or null).")
        self.stage_sizes, self.stage_tokens = list(sizes), stage_tokens

    def prepare(self, pl_module: L.LightningModule) -> None:
        if self.stage_tokens is None:
            if pl_module.token_budget is None:
                raise BatchConfigError(f"{self.key}.stage_tokens=null splits the token budget, but token_budget is null.")
            self.stage_tokens = pl_module.token_budget // len(self.stage_sizes)

    def size_at(self, clock: TrainingClock) -> int:
        return self.stage_sizes[min(clock.tokens // self.stage_tokens, len(self.stage_sizes) - 1)]

    def sizes(self) -> dict[str, int]:
        return {f"sizes[{i}]": size for i, size in enumerate(self.stage_sizes)}


class LinearBatchRampup(BatchSchedule):
    """Megatron-LM's batch ramp-up, counted in sequences (Megatron's "samples").

    ``target`` null: ``batch.global_batch_size``, as Megatron ramps up to ``--global-batch-size``.
    """

    key = "callbacks.batch_rampup"

    def __init__(self, start: int, increment: int, ramp_samples: int, target: int | None = None) -> None:
        if start < 1 or increment < 1 or ramp_samples < 1:
            raise ValueError(f"{self.key}: start, increment and ramp_samples must be >= 1.")
        self.start, self.increment, self.ramp_samples, self.target = start, increment, ramp_samples, target

    def prepare(self, pl_module: L.LightningModule) -> None:
        self.target = self.target or pl_module.batch_config.global_batch_size
        if self.target < self.start or (self.target - self.start) % self.increment:
            raise BatchConfigError(
                f"{self.key}: target {self.target} - start {self.start} must be a non-negative multiple of"
                f" increment {self.increment} (as Megatron requires)."
            )

    def size_at(self, clock: TrainingClock) -> int:
        increments = (self.target - self.start) // self.increment
        if increments == 0:
            return self.target
        done = int(clock.sequences / (self.ramp_samples / increments))
        return min(self.start + done * self.increment, self.target)

    def sizes(self) -> dict[str, int]:
        return {"start": self.start, "increment": self.increment, "target": self.target}

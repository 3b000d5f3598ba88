"""Batch-size baselines for the adaptive schedule: sizes fixed in advance by training progress.

- ``ConstantBatch``: one size throughout.
- ``StagewiseBatchWarmup``: a list of sizes, each trained for an equal number of tokens
  (by default the token budget split evenly).
- ``LinearBatchRampup``: Megatron-LM's ``--rampup-batch-size start increment samples``:
  the size grows by ``increment`` every ``samples / ((target - start) / increment)``
  sequences until it reaches the target.

A schedule is one class: its settings (the fields, filled from ``conf/technique/NAME.yaml``)
and ``size_at``, a function of the clock alone, so resuming is exact. The one callback in
``schedule_callback.py`` applies any schedule. Every size must already be a multiple of
micro_batch x data-parallel ranks: a baseline that silently trained on rounded sizes would
not be the baseline asked for. Torch-free: checked before the heavy imports.
"""

from abc import abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from callbacks.batch_size.lr_scaling import LRScaling, check_lr_scaling, lr_scaling_for
from callbacks.technique import TechniqueSettings
from common.errors import ConfigError
from lightning_modules.clock import TrainingClock
from settings.run_context import RunContext

if TYPE_CHECKING:
    from callbacks.batch_size.schedule_callback import BatchScheduleCallback


@dataclass(kw_only=True)
class BatchSchedule(TechniqueSettings):
    """A global batch chosen from the clock before every global step."""

    sets_global_batch: ClassVar[bool] = True

    @abstractmethod
    def size_at(self, clock: TrainingClock, run: RunContext) -> int:
        """The global batch for the global step after this clock reading."""

    @abstractmethod
    def sizes(self, run: RunContext) -> dict[str, int]:
        """Every size the schedule can ask for, by setting name."""

    def lr_rule(self, run: RunContext) -> LRScaling | None:
        """How the learning rate follows the batch (None: it does not)."""
        return None

    def check(self, run: RunContext) -> None:
        batch = run.global_batch
        if batch is None:
            return
        for name, size in self.sizes(run).items():
            if batch.valid_size(size) != size:
                raise ConfigError(
                    f"{self.key}.{name}={size} is not a multiple of micro_batch x ranks = {batch.granularity}"
                    f" (or exceeds batch.max_global_batch_size); use {batch.valid_size(size)}."
                )

    def build(self, run: RunContext) -> "BatchScheduleCallback":
        from callbacks.batch_size.schedule_callback import BatchScheduleCallback

        return BatchScheduleCallback(self, run)


@dataclass(kw_only=True)
class ConstantBatch(BatchSchedule):
    """The same global batch at every step."""

    key: ClassVar[str] = "technique.constant_batch"
    size: int

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ConfigError(f"{self.key}.size={self.size} must be >= 1.")

    def size_at(self, clock: TrainingClock, run: RunContext) -> int:
        return self.size

    def sizes(self, run: RunContext) -> dict[str, int]:
        return {"size": self.size}


@dataclass(kw_only=True)
class StagewiseBatchWarmup(BatchSchedule):
    """``sizes[k]`` while tokens seen are in [k * stage_tokens, (k + 1) * stage_tokens); the last size after.

    ``stage_tokens`` null: the token budget divided by the number of stages.
    """

    key: ClassVar[str] = "technique.batch_warmup"
    stage_sizes: list[int]
    stage_tokens: int | None
    lr_scaling: str

    def __post_init__(self) -> None:
        check_lr_scaling(self.key, self.lr_scaling)
        if not self.stage_sizes or any(size < 1 for size in self.stage_sizes):
            raise ConfigError(f"{self.key}.stage_sizes={self.stage_sizes} must be a non-empty list of positive sizes.")
        if self.stage_tokens is not None and self.stage_tokens < 1:
            raise ConfigError(f"{self.key}.stage_tokens={self.stage_tokens} must be >= 1 (or null).")

    def check(self, run: RunContext) -> None:
        if self.stage_tokens is None and run.token_budget is None:
            raise ConfigError(f"{self.key}.stage_tokens=null splits the token budget, but token_budget is null.")
        super().check(run)

    def tokens_per_stage(self, run: RunContext) -> int:
        return self.stage_tokens or run.token_budget // len(self.stage_sizes)

    def size_at(self, clock: TrainingClock, run: RunContext) -> int:
        stage = clock.tokens // self.tokens_per_stage(run)
        return self.stage_sizes[min(stage, len(self.stage_sizes) - 1)]

    def sizes(self, run: RunContext) -> dict[str, int]:
        return {f"stage_sizes[{i}]": size for i, size in enumerate(self.stage_sizes)}

    def lr_rule(self, run: RunContext) -> LRScaling | None:
        return lr_scaling_for(self.lr_scaling, self.stage_sizes[0])


@dataclass(kw_only=True)
class LinearBatchRampup(BatchSchedule):
    """Megatron-LM's batch ramp-up, counted in sequences (Megatron's "samples").

    ``target`` null: ``batch.global_batch_size``, as Megatron ramps up to ``--global-batch-size``.
    """

    key: ClassVar[str] = "technique.batch_rampup"
    start: int
    increment: int
    ramp_samples: int
    target: int | None
    lr_scaling: str

    def __post_init__(self) -> None:
        check_lr_scaling(self.key, self.lr_scaling)
        if self.start < 1 or self.increment < 1 or self.ramp_samples < 1:
            raise ConfigError(f"{self.key}: start, increment and ramp_samples must be >= 1.")

    def final_size(self, run: RunContext) -> int:
        return self.target or run.batch.global_batch_size

    def check(self, run: RunContext) -> None:
        target = self.final_size(run)
        if target < self.start or (target - self.start) % self.increment:
            raise ConfigError(
                f"{self.key}: target {target} - start {self.start} must be a non-negative multiple of"
                f" increment {self.increment} (as Megatron requires)."
            )
        super().check(run)

    def size_at(self, clock: TrainingClock, run: RunContext) -> int:
        target = self.final_size(run)
        increments = (target - self.start) // self.increment
        if increments == 0:
            return target
        done = int(clock.sequences / (self.ramp_samples / increments))
        return min(self.start + done * self.increment, target)

    def sizes(self, run: RunContext) -> dict[str, int]:
        return {"start": self.start, "increment": self.increment, "target": self.final_size(run)}

    def lr_rule(self, run: RunContext) -> LRScaling | None:
        return lr_scaling_for(self.lr_scaling, self.start)

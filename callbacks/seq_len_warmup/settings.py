"""Sequence-length warmup settings and schedule (``conf/technique/seq_len_warmup.yaml``).

The schedule is DeepSpeed's curriculum scheduler (``curriculum_type: seqlen``), with its
setting names, evaluated at t = the training state's ``schedule_step`` (global steps done
+ 1, so simulated DiLoCo replicas' turns count as one step) over T = ``total_curriculum_step``:

- ``fixed_linear``:   d = floor(min + (max - min) * min(t / T, 1)); d -= d % step; d = min(d, max)
- ``fixed_root``:     the same with (t / T) ** (1 / root_degree)
- ``fixed_discrete``: ``difficulty[i]`` for the first i with t <= ``max_step[i]``, else the last

Torch-free, so settings are checked before the heavy imports.
"""

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from callbacks.technique import TechniqueSettings, refuse_pipeline
from common.errors import ConfigError
from settings.run_context import RunContext

if TYPE_CHECKING:
    from callbacks.seq_len_warmup.callback import SequenceLengthWarmup

SCHEDULES = ("fixed_linear", "fixed_root", "fixed_discrete")
MODES = ("truncate", "reshape")


@dataclass(kw_only=True)
class SeqLenWarmupSettings(TechniqueSettings):
    """Args:
    schedule_type, min_difficulty, max_difficulty (null: the packed length ``data.seq_len``),
    total_curriculum_step, difficulty_step, root_degree, difficulty, max_step: DeepSpeed's
    curriculum settings (see the module docstring).
    mode: ``truncate`` (each row keeps its first d tokens) or ``reshape`` (a [b, L] block
        becomes [b * (L // d), d] rows, so tokens per step stay constant).
    preallocate: run one forward/backward at full length before training, so the memory
        allocator reserves full-length blocks first and growing lengths do not fragment it.
    """

    key: ClassVar[str] = "technique.seq_len_warmup"

    schedule_type: str
    min_difficulty: int
    max_difficulty: int | None
    total_curriculum_step: int
    difficulty_step: int
    root_degree: int
    difficulty: list[int] | None
    max_step: list[int] | None
    mode: str
    preallocate: bool

    def __post_init__(self) -> None:
        if self.schedule_type not in SCHEDULES:
            raise ConfigError(f"{self.key}.schedule_type={self.schedule_type!r} is unknown; choose one of {SCHEDULES}.")
        if self.mode not in MODES:
            raise ConfigError(f"{self.key}.mode={self.mode!r} is unknown; choose one of {MODES}.")
        if self.schedule_type == "fixed_discrete":
            self._check_discrete()
            return
        if self.total_curriculum_step <= 0:
            raise ConfigError(f"{self.key}.total_curriculum_step={self.total_curriculum_step} must be > 0.")
        if self.difficulty_step <= 0:
            raise ConfigError(f"{self.key}.difficulty_step={self.difficulty_step} must be > 0.")
        for name in ("min_difficulty", "max_difficulty"):
            value = getattr(self, name)
            if value is not None and (value <= 0 or value % self.difficulty_step):
                raise ConfigError(
                    f"{self.key}.{name}={value} must be a positive multiple of difficulty_step={self.difficulty_step}"
                    f" (it is not rounded for you); try {max(1, round(value / self.difficulty_step)) * self.difficulty_step}."
                )
        if self.max_difficulty is not None and self.min_difficulty > self.max_difficulty:
            raise ConfigError(
                f"{self.key}.min_difficulty={self.min_difficulty} exceeds max_difficulty={self.max_difficulty}."
            )
        if self.schedule_type == "fixed_root" and self.root_degree < 1:
            raise ConfigError(f"{self.key}.root_degree={self.root_degree} must be >= 1.")

    def _check_discrete(self) -> None:
        lengths, last_steps = self.difficulty or [], self.max_step or []
        if not lengths or len(last_steps) != len(lengths) - 1:
            raise ConfigError(
                f"{self.key}: fixed_discrete needs a non-empty `difficulty` list and a `max_step` list one shorter"
                f" (got {len(lengths)} and {len(last_steps)})."
            )
        if any(d <= 0 for d in lengths) or any(b <= a for a, b in zip(last_steps, last_steps[1:])):
            raise ConfigError(f"{self.key}: difficulties must be > 0 and max_step strictly increasing.")

    def check(self, run: RunContext) -> None:
        if self.preallocate:
            refuse_pipeline(
                f"{self.key}.preallocate=true",
                run,
                "its full-length pass before training runs the model whole on each rank",
                f"set {self.key}.preallocate=false",
            )
        """No length may exceed the packed length: rows cannot grow; under sequence parallelism
        every length splits into the tensor-parallel ranks' equal parts."""
        self._check_shards(run.sequence_shards)
        if self.schedule_type == "fixed_discrete":
            longest, name = max(self.difficulty), "difficulty"
        else:
            longest, name = self.longest(run.seq_len), "max_difficulty"
            if self.min_difficulty > longest:
                raise ConfigError(
                    f"{self.key}.min_difficulty={self.min_difficulty} exceeds data.seq_len={run.seq_len}."
                )
        if longest > run.seq_len:
            raise ConfigError(
                f"{self.key}.{name}={longest} is longer than the packed length data.seq_len={run.seq_len};"
                " lower it or raise data.seq_len."
            )

    def _check_shards(self, shards: int) -> None:
        """Every length is a multiple of ``difficulty_step`` or the longest (itself one, checked
        apart), or one of the discrete lengths: those must split into ``shards`` equal parts."""
        if self.schedule_type == "fixed_discrete":
            key, odd = f"difficulty={self.difficulty}", any(d % shards for d in self.difficulty)
        else:
            key, odd = f"difficulty_step={self.difficulty_step}", self.difficulty_step % shards
        if odd:
            raise ConfigError(
                f"{self.key}.{key}: sequence parallelism splits each row into {shards} equal parts"
                f" (strategy.tensor_parallel_size={shards}), so every warmup length must be a multiple of"
                f" {shards}; choose such lengths, or set layout.sequence_parallel=false."
            )

    def longest(self, packed_length: int) -> int:
        return self.max_difficulty or packed_length

    def length_at(self, step: int, packed_length: int) -> int:
        """Training sequence length for global step number ``step`` (1-based)."""
        if self.schedule_type == "fixed_discrete":
            for length, last_step in zip(self.difficulty, self.max_step):
                if step <= last_step:
                    return length
            return self.difficulty[-1]
        longest = self.longest(packed_length)
        progress = min(step / self.total_curriculum_step, 1.0)
        if self.schedule_type == "fixed_root":
            progress = progress ** (1.0 / self.root_degree)
        length = math.floor(self.min_difficulty + (longest - self.min_difficulty) * progress)
        length -= length % self.difficulty_step
        return min(length, longest)

    def build(self, run: RunContext) -> "SequenceLengthWarmup":
        from callbacks.seq_len_warmup.callback import SequenceLengthWarmup

        return SequenceLengthWarmup(self, packed_length=run.seq_len)

"""Sequence-length warmup (Li, Zhang, He 2022): short sequences first, full length later.

The schedule is DeepSpeed's curriculum scheduler (``curriculum_type: seqlen``), with its
setting names, evaluated at t = optimizer steps done + 1 (the module's ``schedule_step``,
which counts simulated DiLoCo replicas' turns as one global step) over
T = ``total_curriculum_step``:

- ``fixed_linear``:   d = floor(min + (max - min) * min(t / T, 1)); d -= d % step; d = min(d, max)
- ``fixed_root``:     the same with (t / T) ** (1 / root_degree)
- ``fixed_discrete``: ``difficulty[i]`` for the first i with t <= ``max_step[i]``, else the last

The callback sets the training module's sequence-length knob before each optimizer step;
the module applies it (``truncate``: each packed row keeps its first d tokens; ``reshape``:
a [b, L] block becomes [b * (L // d), d] rows with positions restarting in each row, so
tokens per step stay constant). Tokens are counted after truncation, so the token-based
LR schedule and the token budget see what was really trained; validation stays at full
length. The schedule is a function of the step count alone, so resuming is exact.
"""

import math
from typing import Any

import lightning as L

SCHEDULES = ("fixed_linear", "fixed_root", "fixed_discrete")
MODES = ("truncate", "reshape")
KEY = "callbacks.seq_len_warmup"


class SequenceLengthWarmup(L.Callback):
    """Args:
    packed_length: the data's packed row length (``${data.seq_len}``): no length may exceed it.
    schedule_type, min_difficulty, max_difficulty, total_curriculum_step, difficulty_step,
    root_degree, difficulty, max_step: DeepSpeed's curriculum settings (see module docstring).
    mode: ``truncate`` or ``reshape``.
    preallocate: run one forward/backward at full length before training, so the memory
        allocator reserves full-length blocks first and growing lengths do not fragment it.
    """

    def __init__(
        self,
        packed_length: int,
        schedule_type: str = "fixed_linear",
        min_difficulty: int = 8,
        max_difficulty: int | None = None,
        total_curriculum_step: int = 1000,
        difficulty_step: int = 8,
        root_degree: int = 2,
        difficulty: list[int] | None = None,
        max_step: list[int] | None = None,
        mode: str = "truncate",
        preallocate: bool = True,
    ) -> None:
        self.packed_length = packed_length
        self.schedule_type, self.mode, self.preallocate = schedule_type, mode, preallocate
        self.min_difficulty, self.max_difficulty = min_difficulty, max_difficulty or packed_length
        self.total_curriculum_step, self.difficulty_step = total_curriculum_step, difficulty_step
        self.root_degree = root_degree
        self.difficulty, self.max_step = list(difficulty or []), list(max_step or [])
        self._check()

    def _check(self) -> None:
        if self.schedule_type not in SCHEDULES:
            raise ValueError(f"{KEY}.schedule_type={self.schedule_type!r} is unknown; choose one of {SCHEDULES}.")
        if self.mode not in MODES:
            raise ValueError(f"{KEY}.mode={self.mode!r} is unknown; choose one of {MODES}.")
        if self.schedule_type == "fixed_discrete":
            self._check_discrete()
            return
        if self.total_curriculum_step <= 0:
            raise ValueError(f"{KEY}.total_curriculum_step={self.total_curriculum_step} must be > 0.")
        if self.difficulty_step <= 0:
            raise ValueError(f"{KEY}.difficulty_step={self.difficulty_step} must be > 0.")
        for name in ("min_difficulty", "max_difficulty"):
            value = getattr(self, name)
            if value <= 0 or value % self.difficulty_step:
                raise ValueError(
                    f"{KEY}.{name}={value} must be a positive multiple of difficulty_step={self.difficulty_step}"
                    f" (it is not rounded for you); try {max(1, round(value / self.difficulty_step)) * self.difficulty_step}."
                )
        if self.min_difficulty > self.max_difficulty:
            raise ValueError(f"{KEY}.min_difficulty={self.min_difficulty} exceeds max_difficulty={self.max_difficulty}.")
        self._check_within_packed(self.max_difficulty, "max_difficulty")
        if self.schedule_type == "fixed_root" and self.root_degree < 1:
            raise ValueError(f"{KEY}.root_degree={self.root_degree} must be >= 1.")

    def _check_discrete(self) -> None:
        if not self.difficulty or len(self.max_step) != len(self.difficulty) - 1:
            raise ValueError(
                f"{KEY}: fixed_discrete needs a non-empty `difficulty` list and a `max_step` list one shorter"
                f" (got {len(self.difficulty)} and {len(self.max_step)})."
            )
        if any(d <= 0 for d in self.difficulty) or any(b <= a for a, b in zip(self.max_step, self.max_step[1:])):
            raise ValueError(f"{KEY}: difficulties must be > 0 and max_step strictly increasing.")
        for value in self.difficulty:
            self._check_within_packed(value, "difficulty")

    def _check_within_packed(self, value: int, name: str) -> None:
        if value > self.packed_length:
            raise ValueError(
                f"{KEY}.{name}={value} is longer than the packed length data.seq_len={self.packed_length};"
                f" lower it or raise data.seq_len."
            )

    def length_at(self, step: int) -> int:
        """Training sequence length for optimizer step number ``step`` (1-based)."""
        if self.schedule_type == "fixed_discrete":
            for length, last_step in zip(self.difficulty, self.max_step):
                if step <= last_step:
                    return length
            return self.difficulty[-1]
        progress = min(step / self.total_curriculum_step, 1.0)
        if self.schedule_type == "fixed_root":
            progress = progress ** (1.0 / self.root_degree)
        length = math.floor(self.min_difficulty + (self.max_difficulty - self.min_difficulty) * progress)
        length -= length % self.difficulty_step
        return min(length, self.max_difficulty)

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Runs before the model is built: compiled blocks must treat the length as dynamic."""
        pl_module.seq_len_varies = True
        pl_module.seq_len_mode = self.mode

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.preallocate:
            pl_module.preallocate(self.packed_length)

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int) -> None:
        if pl_module.at_step_boundary:
            pl_module.train_seq_len = self.length_at(pl_module.schedule_step)

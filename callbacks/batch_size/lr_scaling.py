"""The learning rate when the global batch changes: none, square-root or linear scaling.

A batch technique (adaptive, stagewise warmup, ramp-up) may rescale the learning rate with
the global batch, relative to the batch it starts at::

    lr = schedule(step, tokens) x (B / B_start) ** p,   p = 0 (none), 1/2 (sqrt), 1 (linear)

Linear is Goyal et al.'s rule for SGD; square root is the rule for Adam-type optimizers
that keeps the update's noise constant (Malladi et al. 2022), and the one OLMo-core's
batch-size scheduler applies. The factor depends only on the current global batch, which
checkpoints hold, so a resumed run continues with the same learning rate. It is logged as
``train/lr_scale`` (``train/lr`` is the scaled rate). Torch-free.
"""

from dataclasses import dataclass
from typing import TYPE_CHECKING

from common.errors import ConfigError

if TYPE_CHECKING:
    from lightning_modules.training_state import TrainingState

LR_SCALINGS = {"none": 0.0, "sqrt": 0.5, "linear": 1.0}


def check_lr_scaling(key: str, value: str) -> None:
    if value not in LR_SCALINGS:
        raise ConfigError(f"{key}.lr_scaling={value!r} is unknown; choose one of {tuple(LR_SCALINGS)}.")


@dataclass(frozen=True)
class LRScaling:
    """The factor on the scheduled learning rate at global batch B: (B / reference) ** power."""

    rule: str
    reference: int

    def factor(self, global_batch: int) -> float:
        return (global_batch / self.reference) ** LR_SCALINGS[self.rule]

    def __call__(self, state: "TrainingState") -> float:
        return self.factor(state.global_batch.size)


def lr_scaling_for(rule: str, reference: int) -> LRScaling | None:
    """The scaling of a technique's ``lr_scaling`` setting; None for ``none`` (nothing installed)."""
    return None if rule == "none" else LRScaling(rule, reference)

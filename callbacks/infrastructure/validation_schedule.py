"""Run validation at optimizer-step boundaries, every N steps or every N tokens.

Lightning counts its validation interval in training batches, which are micro-batches
here and change in number per step whenever the global batch grows. This callback decides
from the training clock instead and tells Lightning, step by step, whether the batch that
completes the step is a validation point. Validation also runs when training stops.
"""

from typing import Any

import lightning as L

from callbacks.infrastructure.token_interval import TokenInterval
from lightning_modules.step_callback import StepCallback
from lightning_modules.training_state import TrainingState

NEVER = float("inf")


class ValidationSchedule(StepCallback):
    def __init__(self, every_n_steps: int | None, every_n_tokens: int | None) -> None:
        if (every_n_steps is None) == (every_n_tokens is None):
            raise ValueError(
                "callbacks.validation_schedule: set exactly one of every_n_steps and every_n_tokens (the other null)."
            )
        if (every_n_steps or every_n_tokens) <= 0:
            raise ValueError("callbacks.validation_schedule: the interval must be > 0.")
        self.every_n_steps = every_n_steps
        self.tokens = TokenInterval(every_n_tokens) if every_n_tokens else None
        self._trainer: L.Trainer | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._trainer = trainer

    def _due(self, state: TrainingState) -> bool:
        if self.tokens is not None:
            return self.tokens.due(state.clock.tokens)
        return state.clock.steps % self.every_n_steps == 0

    def on_step_start(self, state: TrainingState) -> None:
        self._trainer.val_check_batch = NEVER  # never inside a step's accumulation

    def on_step_end(self, state: TrainingState) -> None:
        # Lightning validates after batch i when (i + 1) % val_check_batch == 0 (with the default
        # check_val_every_n_epoch=1, i counts batches of the one endless training epoch).
        if self._due(state) or state.stopping:
            self._trainer.val_check_batch = self._trainer.fit_loop.epoch_loop.batch_idx + 1

    def state_dict(self) -> dict[str, Any]:
        return self.tokens.state_dict() if self.tokens else {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if self.tokens:
            self.tokens.load_state_dict(state_dict)

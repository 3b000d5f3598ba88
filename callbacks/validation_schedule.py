"""Run validation at optimizer-step boundaries, every N steps or every N tokens.

Lightning counts its validation interval in training batches, which are micro-batches
here and change in number per step whenever the global batch grows. This callback
decides from the training clock instead and tells Lightning, batch by batch, whether the
batch that just ended is a validation point. Validation also runs when training stops
(at the token budget Lightning does that itself; at max_steps this callback does).
"""

from typing import Any

import lightning as L


class ValidationSchedule(L.Callback):
    def __init__(self, every_n_steps: int | None = None, every_n_tokens: int | None = None) -> None:
        if (every_n_steps is None) == (every_n_tokens is None):
            raise ValueError(
                "callbacks.validation_schedule: set exactly one of every_n_steps and every_n_tokens."
            )
        if (every_n_steps or every_n_tokens) <= 0:
            raise ValueError("callbacks.validation_schedule: the interval must be > 0.")
        self.every_n_steps, self.every_n_tokens = every_n_steps, every_n_tokens
        self._last_tokens_mark = 0

    def _due(self, pl_module: L.LightningModule) -> bool:
        clock = pl_module.clock
        if self.every_n_steps is not None:
            return clock.steps % self.every_n_steps == 0
        mark = clock.tokens // self.every_n_tokens
        due, self._last_tokens_mark = mark > self._last_tokens_mark, max(mark, self._last_tokens_mark)
        return due

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        finished = 0 < trainer.max_steps <= pl_module.clock.steps
        due = pl_module.at_step_boundary and pl_module.clock.steps > 0 and (self._due(pl_module) or finished)
        # Lightning validates after batch i when (i + 1) % val_check_batch == 0 (with the default
        # check_val_every_n_epoch=1, i counts batches of the one endless training epoch).
        trainer.val_check_batch = batch_idx + 1 if due else float("inf")

    def state_dict(self) -> dict[str, Any]:
        return {"last_tokens_mark": self._last_tokens_mark}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._last_tokens_mark = state_dict["last_tokens_mark"]

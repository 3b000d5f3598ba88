"""Training wall time, continued across resumes: the x-axis of time-to-loss comparisons.

``time/train_seconds`` counts the seconds spent training since the run started, summed
over every process start of a resumed run, without validation and the time before the
first step (data preparation, model building); in-loop downstream evaluation, when on, is
counted. Work redone after an
interruption (the steps after the last checkpoint) is counted again, as it was spent again.
It is read at logging steps only; on CUDA it waits for the device there, as the throughput
measurement does.
"""

import time
from typing import Any

import lightning as L
import torch

from lightning_modules.step_callback import StepCallback
from lightning_modules.training_state import TrainingState


class WallClock(StepCallback):
    """Logs ``time/train_seconds`` at logging steps and keeps it in checkpoints."""

    def __init__(self) -> None:
        self._before = 0.0  # seconds of earlier process starts (from the checkpoint)
        self._started: float | None = None  # when this process's training started
        self._paused = 0.0  # seconds of validation in this process
        self._paused_at: float | None = None
        self._device = torch.device("cpu")

    def _now(self) -> float:
        if self._device.type == "cuda":
            torch.cuda.synchronize(self._device)
        return time.perf_counter()

    def seconds(self) -> float:
        if self._started is None:
            return self._before
        return self._before + self._now() - self._started - self._paused

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._device = pl_module.training_state.device
        self._started, self._paused = self._now(), 0.0

    def on_step_end(self, state: TrainingState) -> None:
        if state.is_logging_step:
            state.record_metric("time/train_seconds", self.seconds())

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._started is not None:
            self._paused_at = self._now()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._paused_at is not None:
            self._paused += self._now() - self._paused_at
            self._paused_at = None

    def state_dict(self) -> dict[str, Any]:
        return {"train_seconds": self.seconds()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._before = float(state_dict["train_seconds"])

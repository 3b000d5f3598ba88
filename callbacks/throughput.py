"""Training throughput: tokens per second, measured between optimizer steps.

Counts come from the training clock (tokens after truncation, all ranks), so the number
stays right while the global batch or sequence length changes. Time spent in validation
is excluded, and so are the first ``warmup_steps`` steps (compilation, allocator warm-up).
"""

import time
from collections import deque
from typing import Any

import lightning as L
import torch


class Throughput(L.Callback):
    """Logs ``perf/tokens_per_sec`` (global) and ``perf/tokens_per_sec_per_device``.

    The rate is taken over a sliding window of the last ``window`` optimizer steps.
    """

    def __init__(self, window: int = 20, warmup_steps: int = 2) -> None:
        if window < 1 or warmup_steps < 0:
            raise ValueError("callbacks.throughput: window must be >= 1 and warmup_steps >= 0.")
        self.window, self.warmup_steps = window, warmup_steps
        self._marks: deque[tuple[float, int]] = deque(maxlen=window + 1)
        self._paused_at: float | None = None

    @staticmethod
    def _now(device: torch.device) -> float:
        """Wall time after the device finished its queued work (CUDA runs asynchronously)."""
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter()

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._marks.clear()

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not pl_module.at_step_boundary or pl_module.clock.steps <= self.warmup_steps:
            return
        self._marks.append((self._now(pl_module.device), pl_module.clock.tokens))
        if len(self._marks) < 2:
            return
        (t0, tokens0), (t1, tokens1) = self._marks[0], self._marks[-1]
        rate = (tokens1 - tokens0) / max(t1 - t0, 1e-9)
        pl_module.step_metrics["perf/tokens_per_sec"] = rate
        pl_module.step_metrics["perf/tokens_per_sec_per_device"] = rate / trainer.world_size

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._paused_at = self._now(pl_module.device)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Shift the window's timestamps by the validation time so it is not counted."""
        if self._paused_at is None:
            return
        paused = self._now(pl_module.device) - self._paused_at
        self._marks = deque(((t + paused, n) for t, n in self._marks), maxlen=self.window + 1)
        self._paused_at = None

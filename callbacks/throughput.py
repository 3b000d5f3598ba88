"""Training throughput and FLOPs utilisation, measured between optimizer steps.

Token counts come from the training clock (tokens after truncation, all ranks), and
each step's FLOPs use the sequence length it trained on, so the numbers stay right while
the global batch or the sequence length changes. Time spent in validation is excluded,
and so are the first ``warmup_steps`` steps (compilation, allocator warm-up).

    MFU = tokens/s per device x F / peak,   F = 6 N + 12 L H Q T   (lightning_modules/flops.py)

HFU adds the forward work that activation checkpointing recomputes. The peak comes from
``peak_flops_per_device`` or, on CUDA, from the device table in ``lightning_modules/flops.py``
(Lightning's ThroughputMonitor is not used: it has no H200 entry and counts sparse peaks
for some devices). With no known peak (e.g. on CPU without a configured one), MFU and HFU
are not logged.
"""

import logging
import resource
import time
from collections import deque
from typing import Any, NamedTuple

import lightning as L
import torch

from lightning_modules.flops import model_flops_per_token, peak_flops, recomputed_flops_per_token

log = logging.getLogger(__name__)


class _Mark(NamedTuple):
    """Cumulative counts at the end of an optimizer step."""

    time: float
    tokens: int
    model_flops: float
    hardware_flops: float


class Throughput(L.Callback):
    """Logs ``perf/tokens_per_sec`` (global), ``perf/tokens_per_sec_per_device``,
    ``perf/model_flops_per_token``, ``perf/mfu``, ``perf/hfu`` and ``perf/peak_memory_gb``.

    Rates are taken over a sliding window of the last ``window`` optimizer steps.
    """

    def __init__(
        self,
        window: int = 20,
        warmup_steps: int = 2,
        peak_flops_per_device: float | None = None,
        include_embedding: bool = False,
    ) -> None:
        if window < 1 or warmup_steps < 0:
            raise ValueError("callbacks.throughput: window must be >= 1 and warmup_steps >= 0.")
        if peak_flops_per_device is not None and peak_flops_per_device <= 0:
            raise ValueError("callbacks.throughput.peak_flops_per_device must be > 0 (or null).")
        self.window, self.warmup_steps = window, warmup_steps
        self.peak = peak_flops_per_device
        self.include_embedding = include_embedding
        self._marks: deque[_Mark] = deque(maxlen=window + 1)
        self._totals = _Mark(0.0, 0, 0.0, 0.0)
        self._paused_at: float | None = None

    @staticmethod
    def _now(device: torch.device) -> float:
        """Wall time after the device finished its queued work (CUDA runs asynchronously)."""
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter()

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._marks.clear()
        self._totals = _Mark(0.0, pl_module.clock.tokens, 0.0, 0.0)
        if self.peak is None and pl_module.device.type == "cuda":
            self.peak = peak_flops(torch.cuda.get_device_name(pl_module.device))
        if self.peak is None and trainer.is_global_zero:
            log.info("MFU is not logged: set callbacks.throughput.peak_flops_per_device for this device.")

    def _flops_per_token(self, pl_module: L.LightningModule) -> tuple[int, int]:
        """Model and hardware FLOPs per token at the sequence length of the last step."""
        config, seq_len = pl_module.model_config, pl_module.trained_seq_len
        model = model_flops_per_token(config, seq_len, self.include_embedding)
        recomputed = recomputed_flops_per_token(config, seq_len, pl_module.layout.activation_checkpointing)
        return model, model + recomputed

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not pl_module.at_step_boundary:
            return
        model, hardware = self._flops_per_token(pl_module)
        new_tokens = pl_module.clock.tokens - self._totals.tokens
        self._totals = _Mark(
            self._now(pl_module.device),
            pl_module.clock.tokens,
            self._totals.model_flops + new_tokens * model,
            self._totals.hardware_flops + new_tokens * hardware,
        )
        if pl_module.clock.steps <= self.warmup_steps:
            return
        self._marks.append(self._totals)
        if len(self._marks) >= 2:
            pl_module.step_metrics.update(self._rates(trainer.world_size, model))
        pl_module.step_metrics["perf/peak_memory_gb"] = self._peak_memory_gb(pl_module.device)

    def _rates(self, world_size: int, model_flops_per_token: int) -> dict[str, float]:
        first, last = self._marks[0], self._marks[-1]
        seconds = max(last.time - first.time, 1e-9)
        tokens_per_sec = (last.tokens - first.tokens) / seconds
        rates = {
            "perf/tokens_per_sec": tokens_per_sec,
            "perf/tokens_per_sec_per_device": tokens_per_sec / world_size,
            "perf/model_flops_per_token": float(model_flops_per_token),
        }
        if self.peak is not None:
            per_device = seconds * world_size * self.peak
            rates["perf/mfu"] = (last.model_flops - first.model_flops) / per_device
            rates["perf/hfu"] = (last.hardware_flops - first.hardware_flops) / per_device
        return rates

    @staticmethod
    def _peak_memory_gb(device: torch.device) -> float:
        """Peak allocated device memory (CUDA) or peak resident memory of the process (CPU)."""
        if device.type == "cuda":
            return torch.cuda.max_memory_allocated(device) / 2**30
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux reports KiB

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._paused_at = self._now(pl_module.device)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Shift the recorded timestamps by the validation time so it is not counted."""
        if self._paused_at is None:
            return
        paused = self._now(pl_module.device) - self._paused_at
        self._marks = deque((mark._replace(time=mark.time + paused) for mark in self._marks), maxlen=self.window + 1)
        self._totals = self._totals._replace(time=self._totals.time + paused)
        self._paused_at = None

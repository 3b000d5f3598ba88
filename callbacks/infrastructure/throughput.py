"""Training throughput and FLOPs utilisation, measured between logging steps.

Token counts are those this job's ranks trained on, after truncation (``trained_tokens``:
the clock's, but for a fault-tolerant DiLoCo group, whose clock also counts the other
groups' slices and jumps forward when the group is healed), and each
step's FLOPs use the sequence length it trained on, so the numbers stay right while the
global batch or the sequence length changes. The rate is taken over the optimizer steps
since the previous logging step, with one device synchronisation per logging step and none
in between; validation time is left out, and so are the first ``warmup_steps`` steps
(compilation, allocator warm-up).

    MFU = tokens/s per device x F / peak,   F = 6 N + 12 L H Q T   (lightning_modules/flops.py)

HFU adds the forward work that activation checkpointing recomputes. The peak comes from
``peak_flops_per_device`` or, on CUDA, from the device table in ``lightning_modules/flops.py``
(matched by exact device name). With no known peak, MFU and HFU are not logged, and the
run says so once. A float8 run (``layout.float8``) keeps MFU against the bf16 peak and adds
``perf/mfu_of_float8_peak``, the same FLOPs against the device's float8 peak.
"""

import logging
import resource
import time

import lightning as L
import torch

from lightning_modules.flops import float8_peak_flops, model_flops_per_token, peak_flops, recomputed_flops_per_token
from lightning_modules.step_callback import StepCallback
from lightning_modules.training_state import TrainingState

log = logging.getLogger(__name__)


class Throughput(StepCallback):
    """Logs ``perf/tokens_per_sec`` (global), ``perf/tokens_per_sec_per_device``,
    ``perf/model_flops_per_token``, ``perf/mfu``, ``perf/hfu`` and ``perf/peak_memory_gb``."""

    def __init__(self, warmup_steps: int, peak_flops_per_device: float | None, include_embedding: bool) -> None:
        if warmup_steps < 0:
            raise ValueError(f"callbacks.throughput.warmup_steps={warmup_steps} must be >= 0.")
        if peak_flops_per_device is not None and peak_flops_per_device <= 0:
            raise ValueError("callbacks.throughput.peak_flops_per_device must be > 0 (or null).")
        self.warmup_steps = warmup_steps
        self.peak = peak_flops_per_device
        self.float8_peak: float | None = None
        self.include_embedding = include_embedding
        self._mark: tuple[float, int, float, float] | None = None  # time, tokens, model and hardware FLOPs
        self._tokens = 0
        self._flops = (0.0, 0.0)
        self._paused_at: float | None = None
        self._world_size = 1
        self._steps_here = 0
        self._flops_by_length: dict[int, tuple[int, int]] = {}

    @staticmethod
    def _now(device: torch.device) -> float:
        """Wall time after the device finished its queued work (CUDA runs asynchronously)."""
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter()

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        state: TrainingState = pl_module.training_state
        self._world_size, self._tokens, self._mark, self._steps_here = trainer.world_size, state.trained_tokens, None, 0
        if self.peak is None and state.device.type == "cuda":
            name = torch.cuda.get_device_name(state.device)
            self.peak = peak_flops(name)
            if self.peak is None and trainer.is_global_zero:
                log.info(
                    "MFU is not logged: %r is not in the peak table; set callbacks.throughput.peak_flops_per_device.",
                    name,
                )
        if state.layout.float8 != "none" and state.device.type == "cuda":
            self._find_float8_peak(torch.cuda.get_device_name(state.device), trainer.is_global_zero)
        if self.warmup_steps == 0:
            self._mark = (self._now(state.device), self._tokens, *self._flops)

    def _find_float8_peak(self, name: str, announce: bool) -> None:
        self.float8_peak = float8_peak_flops(name)
        if announce and self.peak is not None and self.float8_peak is not None:
            log.info(
                "float8: perf/mfu is against the bf16 peak (%.0f TFLOP/s); perf/mfu_of_float8_peak against float8's (%.0f TFLOP/s)",
                self.peak / 1e12,
                self.float8_peak / 1e12,
            )

    def on_step_end(self, state: TrainingState) -> None:
        model, hardware = self._flops_per_token(state)
        new_tokens = state.trained_tokens - self._tokens
        self._tokens, self._steps_here = state.trained_tokens, self._steps_here + 1
        self._flops = (self._flops[0] + new_tokens * model, self._flops[1] + new_tokens * hardware)
        if self._steps_here == self.warmup_steps:  # counted from this process's start, resumed or not
            self._mark = (self._now(state.device), self._tokens, *self._flops)
        elif self._mark is not None and state.is_logging_step:
            now = self._now(state.device)
            state.record_metrics(self._rates(now, model))
            state.record_metric("perf/peak_memory_gb", self._peak_memory_gb(state.device))
            self._mark = (now, self._tokens, *self._flops)

    def _flops_per_token(self, state: TrainingState) -> tuple[int, int]:
        """Model and hardware FLOPs per token at the sequence length of the last step (cached:
        counting the parameters builds a meta-device model)."""
        if state.seq_len not in self._flops_by_length:
            config, seq_len = state.model_config, state.seq_len
            model = model_flops_per_token(config, seq_len, self.include_embedding)
            recomputed = recomputed_flops_per_token(config, seq_len, state.layout.activation_checkpointing)
            self._flops_by_length[seq_len] = (model, model + recomputed)
        return self._flops_by_length[state.seq_len]

    def _rates(self, now: float, model_flops_per_token: int) -> dict[str, float]:
        start, tokens, model_flops, hardware_flops = self._mark
        seconds = max(now - start, 1e-9)
        tokens_per_sec = (self._tokens - tokens) / seconds
        rates = {
            "perf/tokens_per_sec": tokens_per_sec,
            "perf/tokens_per_sec_per_device": tokens_per_sec / self._world_size,
            "perf/model_flops_per_token": float(model_flops_per_token),
        }
        if self.peak is not None:
            per_device = seconds * self._world_size * self.peak
            rates["perf/mfu"] = (self._flops[0] - model_flops) / per_device
            rates["perf/hfu"] = (self._flops[1] - hardware_flops) / per_device
            if self.float8_peak is not None:
                rates["perf/mfu_of_float8_peak"] = rates["perf/mfu"] * self.peak / self.float8_peak
        return rates

    @staticmethod
    def _peak_memory_gb(device: torch.device) -> float:
        """Peak allocated device memory (CUDA) or peak resident memory of the process (CPU)."""
        if device.type == "cuda":
            return torch.cuda.max_memory_allocated(device) / 2**30
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux reports KiB

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._paused_at = self._now(pl_module.training_state.device)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Shift the mark by the validation time so it is not counted."""
        if self._paused_at is None:
            return
        paused = self._now(pl_module.training_state.device) - self._paused_at
        if self._mark is not None:
            self._mark = (self._mark[0] + paused, *self._mark[1:])
        self._paused_at = None

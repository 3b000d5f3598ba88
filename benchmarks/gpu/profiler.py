"""torch.profiler over a run's timed steps, added to its config like any callback.

Writes, per operator and per CUDA kernel, the self time on the device (on CPU the host
time) and on the host, summed over the profiled steps, to ``path`` (JSON); an operator's
device time is that of the kernels it launched, which are also listed themselves (marked
``kernel``). The norm-test section reads where a technique's time goes from the difference
of two such profiles.
"""

import json
from pathlib import Path

import lightning as L
import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from lightning_modules.step_callback import StepCallback
from lightning_modules.training_state import TrainingState


class ProfileSteps(StepCallback):
    """Profiles the optimizer steps after the first ``skip`` and writes the totals at the end."""

    def __init__(self, path: str, skip: int) -> None:
        self.path, self.skip = Path(path), skip
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        self.profiler = profile(activities=activities)
        self.steps = 0

    def on_step_end(self, state: TrainingState) -> None:
        if state.clock.steps == self.skip:
            self.profiler.start()
        elif state.clock.steps > self.skip:
            self.steps += 1

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.steps == 0:
            return
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.profiler.stop()
        device = torch.cuda.is_available()
        ops = {
            event.key: {
                "self_device_us": event.self_device_time_total if device else event.self_cpu_time_total,
                "self_host_us": event.self_cpu_time_total,
                "calls": event.count,
                "kernel": event.device_type == DeviceType.CUDA,
            }
            for event in self.profiler.key_averages()
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps({"steps": self.steps, "ops": ops}))

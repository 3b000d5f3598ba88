"""The callback that applies a batch schedule (``schedules.py``) before every global step."""

import lightning as L

from callbacks.batch_size.schedules import BatchSchedule
from lightning_modules.step_callback import StepCallback
from lightning_modules.training_state import TrainingState
from settings.run_context import RunContext


class BatchScheduleCallback(StepCallback):
    """Requests ``schedule.size_at(clock)`` at the start of each global step, where it applies at once."""

    def __init__(self, schedule: BatchSchedule, run: RunContext) -> None:
        self.schedule, self.run = schedule, run

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        rule = self.schedule.lr_rule(self.run)
        if rule is not None:
            pl_module.training_state.set_lr_scaling(rule)

    def on_step_start(self, state: TrainingState) -> None:
        if state.at_global_step_start:
            size = self.schedule.size_at(state.clock, self.run)
            if size != state.global_batch.size:
                state.request_global_batch(size)

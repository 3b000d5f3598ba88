"""Write ``last.ckpt`` whenever training ends: at the token budget, at max_steps, or on SIGTERM.

Lightning's ModelCheckpoint saves on its step interval only, so the final steps of a run
would otherwise be lost. Cluster schedulers send SIGTERM before killing a preempted job.
In one process this callback notices the signal at the end of the micro-batch during which
it arrived, saves, and ends training with a ``SIGTERMException``; with several processes
Lightning itself broadcasts rank 0's signal at the next batch and raises the exception on
every rank, and the checkpoint is saved then (saving is collective). Such a checkpoint may
fall in the middle of gradient accumulation and still resumes exactly (see
``LlamaLightningModule.on_save_checkpoint``).
"""

import logging
import os
from typing import Any

import lightning as L
from lightning.pytorch.utilities.exceptions import SIGTERMException

log = logging.getLogger(__name__)


class LastCheckpoint(L.Callback):
    def __init__(self, filename: str) -> None:
        self.filename = filename
        self._saved = False

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if trainer.world_size == 1 and trainer.received_sigterm:
            self._save(trainer, pl_module, "SIGTERM")
            raise SIGTERMException

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        if isinstance(exception, SIGTERMException) and not self._saved:
            self._save(trainer, pl_module, "SIGTERM")

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._save(trainer, pl_module, "end of training")

    def _save(self, trainer: L.Trainer, pl_module: L.LightningModule, reason: str) -> None:
        dirpath = trainer.checkpoint_callback.dirpath if trainer.checkpoint_callback else trainer.default_root_dir
        path = os.path.join(dirpath, self.filename)
        trainer.save_checkpoint(path)
        self._saved = True
        if trainer.is_global_zero:
            steps = pl_module.training_state.clock.steps
            log.info("%s: saved %s at step %d; resume with ckpt_path=%s", reason, path, steps, path)

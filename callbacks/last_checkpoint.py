"""Write ``last.ckpt`` whenever training ends: at the token budget, at max_steps, or on SIGTERM.

Lightning's ModelCheckpoint saves on its step interval only, so the final steps of a run
would otherwise be lost. Cluster schedulers send SIGTERM before killing a preempted job;
Lightning notes the signal and ends training with a ``SIGTERMException`` after the
current batch (or validation batch). This callback saves before that: at the end of the
batch during which the signal arrived, with all ranks agreeing (saving is collective),
or, if the signal slipped in after that point, when the exception is raised. Such a
checkpoint may fall in the middle of gradient accumulation and still resumes exactly
(see ``LlamaLightningModule.on_save_checkpoint``).
"""

import logging
import os
from typing import Any

import lightning as L
from lightning.pytorch.utilities.exceptions import SIGTERMException

log = logging.getLogger(__name__)


class LastCheckpoint(L.Callback):
    def __init__(self, filename: str = "last.ckpt") -> None:
        self.filename = filename
        self._saved = False

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if trainer.strategy.reduce_boolean_decision(trainer.received_sigterm, all=False):
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
            log.info("%s: saved %s at step %d; resume with ckpt_path=%s", reason, path, pl_module.clock.steps, path)

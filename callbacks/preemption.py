"""Save a checkpoint and exit cleanly when the job is told to stop (SIGTERM).

Cluster schedulers send SIGTERM before killing a preempted job. Lightning notes the
signal; this callback then saves ``last.ckpt`` next to the periodic checkpoints and ends
training on every rank together. The checkpoint may fall in the middle of gradient
accumulation: it still resumes exactly (see ``LlamaLightningModule.on_save_checkpoint``).
"""

import os
from typing import Any

import lightning as L
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.exceptions import SIGTERMException


class PreemptionCheckpoint(L.Callback):
    def __init__(self, filename: str = "last.ckpt") -> None:
        self.filename = filename

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        # Ranks may not all have seen the signal; saving is collective, so they agree first.
        if not trainer.strategy.reduce_boolean_decision(trainer.received_sigterm, all=False):
            return
        dirpath = trainer.checkpoint_callback.dirpath if trainer.checkpoint_callback else trainer.default_root_dir
        path = os.path.join(dirpath, self.filename)
        trainer.save_checkpoint(path)
        rank_zero_info(f"SIGTERM: saved {path} at step {pl_module.clock.steps}; resume with ckpt_path={path}")
        raise SIGTERMException

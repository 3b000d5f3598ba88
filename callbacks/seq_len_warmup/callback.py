"""Sequence-length warmup (Li, Zhang, He 2022): short sequences first, full length later.

Before each optimizer step the callback sets the training length from the schedule
(``settings.py``) and installs its cutter (``cutting.py``) in the training state, which
applies it to every training micro-batch. Tokens are counted after cutting, so the
token-based LR schedule and the token budget see what was really trained; validation stays
at full length. The length is a function of the step count alone, so resuming is exact.
"""

from functools import partial

import lightning as L
import torch

from callbacks.seq_len_warmup.cutting import CUTTERS
from callbacks.seq_len_warmup.settings import SeqLenWarmupSettings
from lightning_modules.step_callback import StepCallback
from lightning_modules.training_state import TrainingState


class SequenceLengthWarmup(StepCallback):
    """Cuts training rows to the scheduled length (settings: ``SeqLenWarmupSettings``)."""

    varies_sequence_length = True  # compiled blocks treat the length as dynamic

    def __init__(self, settings: SeqLenWarmupSettings, packed_length: int) -> None:
        self.settings, self.packed_length = settings, packed_length

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.settings.preallocate:
            self._preallocate(trainer, pl_module.training_state)

    def _preallocate(self, trainer: L.Trainer, state: TrainingState) -> None:
        """One forward/backward at full length, so the allocator reserves full-size blocks
        first and shorter-then-longer sequences do not fragment memory. Changes nothing else."""
        shape = (state.global_batch.micro_batch_size, self.packed_length)
        tokens = torch.zeros(shape, dtype=torch.long, device=state.device)
        with trainer.precision_plugin.forward_context():
            state.model(tokens).float().mean().backward()
        state.model.zero_grad(set_to_none=True)

    def on_step_start(self, state: TrainingState) -> None:
        """Every optimizer step (the length only changes between global steps), so a run
        resumed between simulated replicas' turns cuts like the one that stopped."""
        length = self.settings.length_at(state.schedule_step, self.packed_length)
        state.set_sequence_cutter(partial(CUTTERS[self.settings.mode], length=length))

"""Test-only callback: every training micro-batch takes at least ``seconds``, so that a test
can act while a run is mid-way (kill a DiLoCo replica group, start another)."""

import time

import lightning as L


class Pace(L.Callback):
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        time.sleep(self.seconds)

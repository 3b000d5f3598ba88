"""A callback for tests and benchmarks: a training micro-batch takes at least ``seconds``, so that a test can act
while a run is mid-way (kill a DiLoCo replica group, start another) or make one group slower
than its peers.

``from_step`` / ``to_step``: only while the steps completed are in that window (a straggler for
a while); ``while_exists``: only while that file exists (a driver ends the pacing by deleting it).
"""

import time
from pathlib import Path

import lightning as L


class Pace(L.Callback):
    def __init__(
        self, seconds: float, from_step: int = 0, to_step: int | None = None, while_exists: str | None = None
    ) -> None:
        self.seconds, self.from_step, self.to_step = seconds, from_step, to_step
        self.marker = Path(while_exists) if while_exists else None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        steps = pl_module.training_state.clock.steps
        if steps < self.from_step or (self.to_step is not None and steps > self.to_step):
            return
        if self.marker is not None and not self.marker.exists():
            return
        time.sleep(self.seconds)

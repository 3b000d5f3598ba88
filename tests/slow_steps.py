"""Test-only callback: announces a point inside step 4's accumulation, then slows down.

It gives a SIGTERM sent on that announcement time to arrive mid-accumulation.
"""

import sys
import time

import lightning as L


class SlowSteps(L.Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        state = pl_module.training_state
        if state.clock.steps == 3 and state.micro_batch_index == 2:
            print("SLOW STEP 3", file=sys.stderr, flush=True)
            time.sleep(2.0)

"""Step-level hooks: how techniques and infrastructure callbacks take part in a training step.

Lightning's own batch hooks fire once per *micro-batch*, and the number of micro-batches
per optimizer step changes whenever the global batch does. The training module therefore
calls these hooks itself, at the points of an optimizer step, in this order (the full
anatomy is in ``docs/step_anatomy.md``):

1. ``on_step_start(state)``: before the first micro-batch of an optimizer step. A global
   batch requested here applies to the global step that starts now.
2. per micro-batch: the rows are cut (``state.cut``), forward, backward, then
   ``on_micro_batch_end(state)`` (``state.is_last_micro_batch`` tells the last one).
3. the optimizer step, the clock advance and the stop decision, then
   ``on_step_end(state)`` (``state.step_loss`` and ``state.stopping`` are set).
4. the step's metrics are logged if ``state.is_logging_step``.

Callbacks run in the order of ``trainer.callbacks``: the techniques first, in config
order, then the infrastructure callbacks, so measurements see what the techniques did.

Two build-time hooks shape the model before it exists: ``shard_mesh`` (DiLoCo shards only
within a replica) and ``varies_sequence_length`` (compile with dynamic shapes); one asks how
a step runs: ``needs_micro_step_gradients`` (a pipeline runs such a step's micro-batches one
at a time, so each leaves its own gradient).
"""

import lightning as L
from torch.distributed.device_mesh import DeviceMesh

from lightning_modules.training_state import TrainingState


class StepCallback(L.Callback):
    """A Lightning callback that also receives the training module's step-level hooks."""

    #: True if the callback changes the training sequence length during the run.
    varies_sequence_length = False

    def on_step_start(self, state: TrainingState) -> None:
        """Before the first micro-batch of an optimizer step."""

    def on_micro_batch_end(self, state: TrainingState) -> None:
        """After a micro-batch's backward (its gradient has been accumulated)."""

    def on_step_end(self, state: TrainingState) -> None:
        """After the optimizer step, the clock advance and the stop decision."""

    def needs_micro_step_gradients(self, state: TrainingState) -> bool:
        """Whether this step's micro-batches must each leave their own gradient in ``.grad``
        before the next adds to it (at ``on_micro_batch_end``): a pipeline then runs them one
        at a time instead of together. Asked at every micro-batch, after ``on_step_start``."""
        return False

    def allows_stop(self, state: TrainingState) -> bool:
        """Whether training may stop after this optimizer step (e.g. not in the middle of a global step)."""
        return True

    def shard_mesh(self, mesh: DeviceMesh) -> DeviceMesh:
        """The mesh FSDP2 shards the model over, given the data-parallel one."""
        return mesh

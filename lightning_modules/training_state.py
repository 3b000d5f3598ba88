"""The training state: the one interface between the training module and the techniques.

Techniques (batch-size schedules, sequence-length warmup, DiLoCo) and the infrastructure
callbacks (throughput, validation schedule, ...) read and change training only through
this object, which the training module owns, advances and checkpoints. They reach it as
``pl_module.training_state`` and receive it in the step hooks of
``lightning_modules/step_callback.py``, which the module calls in a documented order
(``docs/step_anatomy.md``).

What it holds:

- **progress**: the ``clock`` (optimizer steps, sequences, tokens over all ranks), the
  global step and the 1-based ``schedule_step`` that step-based schedules read, the
  ``token_budget``; ``move_clock`` sets it to another job's progress (a DiLoCo replica group
  healed by a peer) and the data stream follows it from the next micro-batch on;
  ``trained_tokens``, the tokens this job's own processes trained on (the clock's tokens,
  but for a fault-tolerant DiLoCo group, whose clock counts every group's and moves on a heal);
- **the global batch** (``global_batch``): read its size and accumulation, change it with
  ``request_global_batch``;
- **the training sequence length**: ``set_sequence_cutter`` installs how rows are cut
  (sequence-length warmup does), ``seq_len`` is what the last micro-batch trained on;
- **the learning rate's scaling**: ``set_lr_scaling`` installs a factor on the scheduled
  learning rate, a function of this state (batch techniques scale it with the global
  batch; Seesaw with the token count);
- **the step in progress**: the micro-batch index, the step's loss once it is done,
  whether this is the last step;
- **metrics**: ``record_metric`` (values may stay on the device: they are read once, on
  logging steps), ``log_now`` to log a step off the usual interval;
- **what is trained**: ``model``, ``optimizer``, ``model_config``, ``layout``, ``device``,
  ``gradient_group_size`` (the ranks whose gradients one optimizer step averages) and
  ``pipeline_group`` (the ranks holding the model's other pipeline stages);
- **how the run ended**: ``weights_note``, set by a technique whose job ends on weights
  that are not the run's (a DiLoCo group left behind its peers): the checkpoints record it,
  the scripts that read checkpoints refuse them, and ``train.py`` ends with it in one line.
"""

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from lightning_modules.clock import TrainingClock
from lightning_modules.global_batch import GlobalBatch
from lightning_modules.layout_settings import LayoutSettings
from lightning_modules.llama_settings import LlamaSettings

Batch = dict[str, torch.Tensor]
SequenceCutter = Callable[[Batch], Batch]
#: The checkpoint entry holding ``weights_note`` (what the scripts that read checkpoints check).
WEIGHTS_NOTE = "weights_note"
LRScaling = Callable[["TrainingState"], float]  # the state -> factor on the scheduled learning rate
MetricValue = float | int | torch.Tensor


def keep_rows(batch: Batch) -> Batch:
    """The default cutter: train on the packed rows as they are."""
    return batch


@dataclass
class StepMetrics:
    """Metrics of the optimizer step in progress; values may be device tensors until logged."""

    values: dict[str, MetricValue] = field(default_factory=dict)
    forced: bool = False

    def as_floats(self) -> dict[str, float]:
        """Every value as a float, with one device-to-host transfer for all tensors together."""
        tensors = {k: v for k, v in self.values.items() if torch.is_tensor(v)}
        floats = {k: float(v) for k, v in self.values.items() if not torch.is_tensor(v)}
        if tensors:
            moved = torch.stack([t.detach().double().reshape(()) for t in tensors.values()]).tolist()
            floats.update(zip(tensors, moved))
        return floats

    def clear(self) -> None:
        self.values.clear()
        self.forced = False


class TrainingState:
    """Shared training knobs and the step in progress (see the module docstring)."""

    def __init__(
        self,
        global_batch: GlobalBatch,
        token_budget: int | None,
        model_config: LlamaSettings,
        layout: LayoutSettings,
        log_every_n_steps: int,
    ) -> None:
        self.clock = TrainingClock()
        self.trained_tokens = 0
        self.global_batch = global_batch
        self.token_budget = token_budget
        self.model_config = model_config
        self.layout = layout
        self.log_every_n_steps = log_every_n_steps
        self.model: nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.device = torch.device("cpu")
        #: Ranks whose gradients are averaged into one optimizer step: all of them, or one
        #: DiLoCo replica's (set by the training module once the model is laid out).
        self.gradient_group_size = 1
        #: The ranks holding the other stages of this rank's model (pipeline parallelism): a
        #: total over the whole model's parameters adds over them. None without a pipeline.
        self.pipeline_group: "torch.distributed.ProcessGroup | None" = None
        self.micro_batch_index = 0
        self.seq_len = 0
        self.step_loss: torch.Tensor | None = None  # the step's mean loss over all ranks
        self.local_step_loss: torch.Tensor | None = None  # this rank's
        self.stopping = False
        self.schedule_tokens = 0
        self.metrics = StepMetrics()
        self.weights_note: str | None = None
        self._cut: SequenceCutter = keep_rows
        self._lr_scaling: LRScaling | None = None
        self._seek: Callable[[int], None] | None = None  # the data stream's, from the training module

    # ------------------------------------------------------------------ progress
    def set_data_seek(self, seek: Callable[[int], None]) -> None:
        """Installed by the training module: continue the data stream at a global position."""
        self._seek = seek

    def move_clock(self, clock: dict[str, int]) -> None:
        """Set the clock to another job's progress (a clock's ``state_dict``): the next
        micro-batch is read at its position, so the rows trained are those of the steps the
        clock now counts, as if this job had trained them in order."""
        self.clock.load_state_dict(clock)
        if self._seek is not None:
            self._seek(self.clock.sequences)

    @property
    def steps_per_global_step(self) -> int:
        """Optimizer steps in one global step: the sequential (simulated) replicas."""
        return self.global_batch.sequential_replicas

    @property
    def global_steps(self) -> int:
        """Global steps completed."""
        return self.clock.steps // self.steps_per_global_step

    @property
    def schedule_step(self) -> int:
        """The 1-based global step in progress (or about to start): what step-based schedules read."""
        return self.global_steps + 1

    @property
    def at_global_step_start(self) -> bool:
        """True before the first micro-batch of a global step."""
        return self.micro_batch_index == 0 and self.clock.steps % self.steps_per_global_step == 0

    @property
    def at_global_step_end(self) -> bool:
        """True after the last optimizer step of a global step (in ``on_step_end``)."""
        return self.clock.steps % self.steps_per_global_step == 0

    @property
    def is_last_micro_batch(self) -> bool:
        """True while the micro-batch that completes this optimizer step runs."""
        return self.micro_batch_index == self.global_batch.accumulation - 1

    # ------------------------------------------------------------------ the knobs techniques turn
    def request_global_batch(self, size: int) -> int:
        """Ask for a global batch from the next global step on; returns the (rounded, capped) size."""
        return self.global_batch.request(size)

    def set_sequence_cutter(self, cutter: SequenceCutter) -> None:
        """Install how training rows are cut to the training sequence length (validation never is)."""
        self._cut = cutter

    def cut(self, batch: Batch) -> Batch:
        """The training micro-batch as it is trained on."""
        return self._cut(batch)

    def set_lr_scaling(self, scaling: LRScaling) -> None:
        """Install the factor on the scheduled learning rate, read at every optimizer step.

        It must be a function of what checkpoints restore (the global batch, the clock), so
        that a resumed run continues with the same learning rate."""
        self._lr_scaling = scaling

    @property
    def lr_scale(self) -> float | None:
        """The factor for the step in progress, or None when no scaling is installed."""
        return None if self._lr_scaling is None else self._lr_scaling(self)

    # ------------------------------------------------------------------ metrics
    def record_metric(self, name: str, value: MetricValue) -> None:
        """Add a metric to this step's row; a tensor is only read on the device when logged."""
        self.metrics.values[name] = value

    def record_metrics(self, metrics: dict[str, MetricValue]) -> None:
        self.metrics.values.update(metrics)

    def log_now(self) -> None:
        """Log this step's metrics even if it is not a logging step (e.g. a batch-size test ran)."""
        self.metrics.forced = True

    @property
    def is_logging_step(self) -> bool:
        """Whether this step's metrics are logged: every ``log_every_n_steps``, at the end, or forced."""
        return self.clock.steps % self.log_every_n_steps == 0 or self.stopping or self.metrics.forced

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        return {
            "clock": self.clock.state_dict(),
            "global_batch": self.global_batch.state_dict(),
            "schedule_tokens": self.schedule_tokens,
            "trained_tokens": self.trained_tokens,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.clock.load_state_dict(state["clock"])
        self.global_batch.load_state_dict(state["global_batch"])
        self.schedule_tokens = state["schedule_tokens"]
        # Checkpoints from before it was kept: the clock's count, which it equalled but in DiLoCo groups.
        self.trained_tokens = state.get("trained_tokens", self.clock.tokens)

"""Pipeline parallelism: the Llama's blocks split into stages on successive ranks, each
optimizer step's micro-batches streamed through them by a schedule.

A stage is the model with only its blocks (``keep_stage``): the first also holds the
embedding, the last the final norm and the output head. Blocks keep their indices and
parameters their whole-model names, so a stage's weights are initialised to the whole
model's from the same seed (names seed the draws) and its checkpoints load into any other
split. The blocks are shared out evenly in order, earlier stages taking one more where
they do not divide.

A schedule (PyTorch's ``torch.distributed.pipelining``) runs one optimizer step: the step's
micro-batches go through every stage forward and backward, each stage sending its hidden
states on and receiving their gradients back. ``gpipe`` runs every forward, then every
backward (each stage keeps the activations of all micro-batches); ``1f1b`` starts the
backwards as soon as the last stage has a micro-batch's loss (a stage keeps at most as many
micro-batches as there are stages after it, plus one); ``interleaved_1f1b`` gives each rank
several stages (``stages_per_rank``), which shortens the pipeline's fill and drain, the
bubble, by that factor. The loss of each micro-batch is its mean token cross-entropy, and
the gradients are divided by the number of micro-batches, so the step's gradient is the
mean over its micro-batches, as under gradient accumulation.
"""

import itertools
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed import ProcessGroup
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

from lightning_modules.llama import Llama

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B, "interleaved_1f1b": ScheduleInterleaved1F1B}


def stage_blocks(n_layers: int, stages: int) -> list[range]:
    """The blocks of each of ``stages`` stages, in order, as even as they can be."""
    base, extra = divmod(n_layers, stages)
    bounds = [0]
    for stage in range(stages):
        bounds.append(bounds[-1] + base + (1 if stage < extra else 0))
    return [range(start, end) for start, end in itertools.pairwise(bounds)]


def rank_stages(rank: int, ranks: int, stages_per_rank: int) -> list[int]:
    """The stages a pipeline rank holds: rank r holds r, r + ranks, r + 2 ranks and so on
    (the looped order the interleaved schedule expects)."""
    return [rank + ranks * loop for loop in range(stages_per_rank)]


def keep_stage(model: Llama, blocks: range, first: bool, last: bool) -> None:
    """Reduce ``model`` (on the meta device, before any layout) to one stage, in place."""
    for index in list(model.layers):
        if int(index) not in blocks:
            del model.layers[index]
    if not first:
        model.tok_embeddings = None
    if not last:
        model.norm = None
        model.output = None


def micro_batch_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The mean next-token cross-entropy of one micro-batch, in fp32 (the model's plain loss)."""
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())


class Pipeline:
    """This rank's stages and the schedule that runs an optimizer step through them.

    The schedule is built for a number of micro-batches; when the global batch changes that
    number (a batch schedule, the adaptive batch), the next step builds one for the new count.
    """

    def __init__(
        self, stages: Sequence[nn.Module], indices: Sequence[int], count: int, group: ProcessGroup, schedule: str
    ) -> None:
        device = next(stages[0].parameters()).device
        self.stages = [
            PipelineStage(module, index, count, device, group=group) for module, index in zip(stages, indices)
        ]
        self.first = indices[0] == 0
        self.last = indices[-1] == count - 1
        self.schedule_name = schedule
        self._schedules: dict[int, object] = {}

    def _schedule(self, micro_batches: int):
        if micro_batches not in self._schedules:
            kind = SCHEDULES[self.schedule_name]
            stages = self.stages if kind is ScheduleInterleaved1F1B else self.stages[0]
            self._schedules = {micro_batches: kind(stages, micro_batches, loss_fn=micro_batch_loss)}
        return self._schedules[micro_batches]

    def step(self, input_ids: torch.Tensor, labels: torch.Tensor, micro_batches: int) -> torch.Tensor | None:
        """Forward and backward of one optimizer step's rows (split into ``micro_batches``
        along the batch); the mean of the micro-batches' losses on the rank holding the last
        stage, None on the others. Every rank of the pipeline passes the same rows."""
        losses: list[torch.Tensor] = []
        schedule = self._schedule(micro_batches)
        args = (input_ids,) if self.first else ()
        schedule.step(*args, target=labels if self.last else None, losses=losses)
        return torch.stack(losses).mean() if self.last else None

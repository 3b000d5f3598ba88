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

import copy
from collections.abc import Iterable, Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed import ProcessGroup
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleLoopedBFS,
)

from lightning_modules.llama import Llama
from lightning_modules.pipeline_stages import rank_stages, stage_blocks

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B, "interleaved_1f1b": ScheduleInterleaved1F1B}


def keep_stage(model: Llama, blocks: Iterable[int], first: bool, last: bool) -> None:
    """Reduce ``model`` (on the meta device, before any layout) to one stage, in place: or to
    the blocks of all the stages a rank holds, which ``RankStages.views`` then splits."""
    kept = set(blocks)
    for index in list(model.layers):
        if int(index) not in kept:
            del model.layers[index]
    if not first:
        model.tok_embeddings = None
    if not last:
        model.norm = None
        model.output = None


def stage_view(model: Llama, blocks: range, first: bool, last: bool) -> Llama:
    """One stage of a rank holding several (``interleaved_1f1b``): a Llama whose blocks,
    embedding and head are ``model``'s own modules (the same parameters, under the same
    names), so the rank's optimizer, clipping and checkpoints see one model."""
    view = copy.copy(model)
    view._parameters, view._buffers, view._modules = {}, {}, dict(model._modules)
    view.layers = nn.ModuleDict({str(index): model.layers[str(index)] for index in blocks})
    keep_stage(view, blocks, first, last)
    return view


def micro_batch_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The mean next-token cross-entropy of one micro-batch, in fp32 (the model's plain loss)."""
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())


class ScaledLoss:
    """A micro-batch's loss divided by the optimizer step's micro-batch count, so that its
    gradient is the micro-batch's share of the step's mean (as under gradient accumulation)
    however many of the step's micro-batches one schedule run takes."""

    def __init__(self, divisor: int) -> None:
        self.divisor = divisor

    def __call__(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return micro_batch_loss(logits, labels) / self.divisor


class Pipeline:
    """This rank's stages and the schedules that run an optimizer step, or a validation
    batch, through them.

    A stage learns the shapes it sends and receives at its first step, so a schedule serves
    one shape of the rows, one number of micro-batches and one loss scale: when the global
    batch changes the number (a batch schedule), the rows change length (sequence-length
    warmup) or a step runs its micro-batches one at a time (``step``), the step builds
    stages and a schedule for it (over the same modules), kept while the rows' shape lasts.
    Validation runs each batch forward as one micro-batch (GPipe's schedule; with several
    stages per rank, the looped breadth-first one), with stages of its own.
    """

    def __init__(
        self, modules: Sequence[nn.Module], indices: Sequence[int], count: int, group: ProcessGroup, schedule: str
    ) -> None:
        self.modules, self.indices, self.count, self.group = list(modules), list(indices), count, group
        self.device = next(modules[0].parameters()).device
        self.first = indices[0] == 0
        self.last = indices[-1] == count - 1
        # the last stage is on the pipeline's last rank (rank_stages' looped order)
        self.last_rank = dist.get_global_rank(group, group.size() - 1)
        self.schedule_name = schedule
        self._training: dict[tuple, object] = {}
        self._evaluation: tuple[tuple, object] | None = None

    def _stages(self) -> list[PipelineStage]:
        return [
            PipelineStage(module, index, self.count, self.device, group=self.group)
            for module, index in zip(self.modules, self.indices)
        ]

    def _training_schedule(self, micro_batches: int, shape: torch.Size, divisor: int):
        key = (micro_batches, tuple(shape), divisor)
        if key not in self._training:
            if any(cached[1] != key[1] for cached in self._training):
                self._training = {}  # a new length or batch: the old shapes do not come back soon
            kind = SCHEDULES[self.schedule_name] if micro_batches > 1 else ScheduleGPipe
            stages = self._stages()
            if len(stages) > 1 and kind is not ScheduleInterleaved1F1B:  # one micro-batch through looped stages
                kind = ScheduleLoopedBFS
            chosen = stages if len(stages) > 1 else stages[0]
            self._training[key] = kind(chosen, micro_batches, loss_fn=ScaledLoss(divisor), scale_grads=False)
        return self._training[key]

    def _evaluation_schedule(self, shape: torch.Size):
        key = tuple(shape)
        if self._evaluation is None or self._evaluation[0] != key:
            stages = self._stages()
            if len(stages) == 1:
                schedule = ScheduleGPipe(stages[0], 1, loss_fn=micro_batch_loss)
            else:
                schedule = ScheduleLoopedBFS(stages, 1, loss_fn=micro_batch_loss)
            self._evaluation = key, schedule
        return self._evaluation[1]

    def step(self, input_ids: torch.Tensor, labels: torch.Tensor, micro_batches: int, divisor: int) -> torch.Tensor:
        """Forward and backward of ``micro_batches`` micro-batches of an optimizer step of
        ``divisor`` (the rows, split along the batch): the whole step in one run, or one of
        its micro-batches when each must leave its own gradient (the adaptive batch's
        samples; a run of one micro-batch idles every rank but one, the pipeline's bubble at
        its widest). Returns the mean of the micro-batches' losses, on every rank of the
        pipeline. Every rank of the pipeline passes the same rows."""
        schedule = self._training_schedule(micro_batches, input_ids.shape, divisor)
        return self._run(schedule.step, input_ids, labels) * divisor

    @torch.no_grad()
    def evaluate(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The mean token loss of one batch, forward only, on every rank of the pipeline."""
        return self._run(self._evaluation_schedule(input_ids.shape).eval, input_ids, labels)

    def _run(self, run, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        losses: list[torch.Tensor] = []
        args = (input_ids,) if self.first else ()
        run(*args, target=labels if self.last else None, losses=losses)
        loss = torch.stack(losses).mean().detach() if self.last else torch.zeros((), device=input_ids.device)
        dist.broadcast(loss, src=self.last_rank, group=self.group)
        return loss


class RankStages:
    """The stages one pipeline rank holds (``rank_stages``) and how its model is cut to them."""

    def __init__(self, pipeline: DeviceMesh, stages_per_rank: int, n_layers: int) -> None:
        self.group, self.count = pipeline.get_group(), pipeline.size() * stages_per_rank
        self.indices = rank_stages(pipeline.get_local_rank(), pipeline.size(), stages_per_rank)
        self.blocks = stage_blocks(n_layers, self.count)
        self._views: list[Llama] | None = None

    def keep(self, model: Llama) -> None:
        """Reduce ``model`` to the blocks of this rank's stages (the embedding with stage 0,
        the head with the last)."""
        blocks = [block for index in self.indices for block in self.blocks[index]]
        keep_stage(model, blocks, first=0 in self.indices, last=self.count - 1 in self.indices)

    def views(self, model: Llama) -> list[Llama]:
        """Each stage's module: the model itself when the rank holds one stage, else views
        of it (``stage_view``). Made once, from the model as laid out (checkpointing wraps
        blocks), before FSDP2 shards them as roots; the pipeline then runs those."""
        if self._views is None:
            if len(self.indices) == 1:
                self._views = [model]
            else:
                self._views = [stage_view(model, self.blocks[i], i == 0, i == self.count - 1) for i in self.indices]
        return self._views

    def pipeline(self, model: Llama, schedule: str) -> Pipeline:
        return Pipeline(self.views(model), self.indices, self.count, self.group, schedule)


def split_data_parallel(mesh: DeviceMesh, pipeline: int) -> tuple[DeviceMesh, DeviceMesh]:
    """The D x P ranks of ModelParallelStrategy's data-parallel mesh as (data, pipeline) meshes:
    P consecutive ranks hold one pipeline's stages, and FSDP2 shards each stage over the D
    ranks that hold it."""
    split = mesh._unflatten(0, (mesh.size() // pipeline, pipeline), ("pipeline_data", "pipeline"))
    return split["pipeline_data"], split["pipeline"]

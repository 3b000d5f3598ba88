"""The LightningModule that trains a Llama: one optimizer step at a time, over micro-batches.

Each ``training_step`` is one micro-batch; the module owns gradient accumulation (manual
optimization) because the number of micro-batches per optimizer step changes whenever the
global batch does, which Lightning's ``accumulate_grad_batches`` cannot express.

The module keeps the ``TrainingState`` (``lightning_modules/training_state.py``): the
shared knobs that techniques turn, the step in progress and its metrics. It advances the
state and calls the step-level hooks of ``lightning_modules/step_callback.py`` in a fixed order
(``docs/step_anatomy.md``); techniques never touch the module itself.
"""

import logging
import math
import sys
from dataclasses import asdict
from typing import Any

import lightning as L
import torch
from lightning.pytorch.strategies import FSDPStrategy
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp.wrap import wrap

from common.data_groups import DataGroups
from lightning_modules.float8 import float8_all_gather, precompute_fsdp_scales
from lightning_modules.fused_cross_entropy import IGNORE_INDEX
from lightning_modules.global_batch import BatchSettings, GlobalBatch
from lightning_modules.llama import Llama, seed_from_global_rng
from lightning_modules.llama_settings import LlamaSettings
from lightning_modules.lr_schedule import LRScheduleSettings, learning_rate
from lightning_modules.meta_init import fsdp1_param_init_fn, materialize_and_init
from lightning_modules.optimizers.parameter_groups import group_settings, restore_group_settings
from lightning_modules.optimizers.settings import OptimizerSettings
from lightning_modules.parallelism import (
    LayoutSettings,
    apply_layout,
    attention_backend,
    clip_grad_norm,
    data_parallel_mesh,
    set_gradient_sync,
    tensor_parallel_mesh,
)
from lightning_modules.pipeline_parallel import Pipeline, RankStages, split_data_parallel
from lightning_modules.resume_notes import resume_notes
from lightning_modules.step_callback import StepCallback
from lightning_modules.tensor_parallel import loss_context
from lightning_modules.training_state import WEIGHTS_NOTE, TrainingState

PROGRESS_BAR_KEYS = (
    "train/loss",
    "perf/tokens_per_sec",
    "train/global_batch_size",
    "train/seq_len",
    "diloco/round",
    "diloco/pseudo_grad_norm",
)
log = logging.getLogger(__name__)
LARGEST_EXP_ARGUMENT = math.log(sys.float_info.max)  # 709.78


def processes(count: int) -> str:
    return f"{count} process{'' if count == 1 else 'es'}"


def perplexity(loss: float) -> float:
    """exp(loss), inf where that overflows: a diverged run (loss above ~709 nats; NaN stays
    NaN) is logged and judged as such instead of ending the run, or a sweep, with an error."""
    return math.inf if loss > LARGEST_EXP_ARGUMENT else math.exp(loss)


class LlamaLightningModule(L.LightningModule):
    """Next-token prediction on packed rows with token-based schedules.

    Args:
        model: the architecture; ``vocab_size`` must be filled in.
        optimizer, lr_schedule, batch, layout: the run's settings of those names.
        micro_batch_size: the micro-batch every rank runs (resolved from ``batch``).
        token_budget: training stops once this many tokens were seen (all ranks).
        sequential_replicas: optimizer steps per global step (simulated DiLoCo replicas).
        batch_scheduled: a technique sets the global batch (so a resumed run keeps the
            checkpoint's instead of the configured one).
        init_state_dict: weights to start from (e.g. converted Hugging Face weights);
            applied when the model is built, before any sharding.
        pipeline_parallel_size: the ranks of each pipeline, over which the blocks are split
            into stages (``pipeline_parallel.py``); 1: none.
    """

    def __init__(
        self,
        model: LlamaSettings,
        optimizer: OptimizerSettings,
        lr_schedule: LRScheduleSettings,
        batch: BatchSettings,
        layout: LayoutSettings,
        micro_batch_size: int,
        token_budget: int | None,
        sequential_replicas: int = 1,
        data_groups: DataGroups = DataGroups(),
        batch_scheduled: bool = False,
        init_state_dict: dict[str, torch.Tensor] | None = None,
        pipeline_parallel_size: int = 1,
    ) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.save_hyperparameters(
            {
                "model": asdict(model),
                "optimizer": {"kind": optimizer.kind, **asdict(optimizer)},
                "lr_schedule": asdict(lr_schedule),
                "batch": asdict(batch),
                "layout": asdict(layout),
                "micro_batch_size": micro_batch_size,
                "token_budget": token_budget,
                "sequential_replicas": sequential_replicas,
            }
        )
        self.model_config, self.optimizer_config = model, optimizer
        self.lr_schedule, self.batch_config, self.layout = lr_schedule, batch, layout
        self._init_state_dict = init_state_dict
        self.batch_scheduled = batch_scheduled
        self.data_groups = data_groups
        self.model: Llama | None = None
        global_batch = GlobalBatch(batch, micro_batch_size, data_groups.data_parallel_size(1), sequential_replicas)
        self.training_state = TrainingState(global_batch, token_budget, model, layout, log_every_n_steps=1)
        self._step_loss = torch.zeros(())
        self._step_tokens = 0
        self._grad_norm = torch.zeros(())
        self._step_callbacks: list[StepCallback] = []
        self._configured_groups: list[dict[str, Any]] = []  # the built optimizer's group settings
        self._float8_scales_per_step = False
        self.pipeline_parallel_size = pipeline_parallel_size
        self._pipeline: Pipeline | None = None
        self._pipeline_rows: list[dict[str, torch.Tensor]] = []  # the step's micro-batches so far

    @property
    def step_callbacks(self) -> list[StepCallback]:
        """The callbacks that receive the step-level hooks, in the trainer's order (found once
        per fit, in ``setup``: the step calls them several times per micro-batch)."""
        return self._step_callbacks

    # ---------------------------------------------------------------- model building
    def configure_model(self) -> None:
        """Build the model (once) without any rank holding it whole, and lay it out.

        The model is created on the meta device, laid out (kernels, checkpointing, compile,
        FSDP2 sharding), then given storage and initialised shard by shard
        (``meta_init.py``): the same weights as a model built whole from the same seed.
        """
        if self.model is not None:
            return
        with torch.device("meta"):
            model = Llama(self.model_config)
        dynamic = any(callback.varies_sequence_length for callback in self.step_callbacks)
        mesh, split = self._shard_mesh(), tensor_parallel_mesh(self.device_mesh)
        stages = None
        if self.pipeline_parallel_size > 1:
            mesh, stages = self._keep_pipeline_stages(model, mesh)
        if (split is not None or stages is not None) and self.global_rank == 0:
            log.info("layout: %s", self._describe_layout(mesh, stages, split))
        apply_layout(model, self.layout, mesh, dynamic, split, stages.views if stages is not None else None)
        self._float8_scales_per_step = float8_all_gather(self.layout.float8, sharded=mesh is not None)
        seed = seed_from_global_rng()
        if self._trainer is not None and isinstance(self.trainer.strategy, FSDPStrategy):
            # Wrap the model itself (with the strategy's settings, which Lightning puts in
            # effect around configure_model) so Lightning does not wrap this module: its
            # training_step runs backward, which FSDP1 forbids inside a root forward.
            model = wrap(model, param_init_fn=fsdp1_param_init_fn(model, seed))
        else:
            materialize_and_init(model, self._build_device, seed)
        if self._init_state_dict is not None:
            set_model_state_dict(model, self._init_state_dict, options=StateDictOptions(full_state_dict=True))
            self._init_state_dict = None
        self.model = self.training_state.model = model
        self.training_state.gradient_group_size = mesh.size() if mesh is not None else self._world_size
        if stages is not None:
            self._pipeline = stages.pipeline(model, self.layout.pipeline_schedule)
            self.training_state.pipeline_group = stages.group

    def _keep_pipeline_stages(self, model: Llama, mesh: DeviceMesh) -> tuple[DeviceMesh, RankStages]:
        """Reduce the model to this rank's stages; FSDP2 then shards them over the ranks
        holding the same stages. Returns that mesh and the stages."""
        data, pipeline = split_data_parallel(mesh, self.pipeline_parallel_size)
        stages = RankStages(pipeline, self.layout.stages_per_rank, self.model_config.n_layers)
        stages.keep(model)
        return data, stages

    def _describe_layout(self, data: DeviceMesh, stages: RankStages | None, split: DeviceMesh | None) -> str:
        """For the log: '2 data-parallel x 2 pipeline x 2 tensor-parallel ranks, 4 stages
        (1f1b schedule), with sequence parallelism'."""
        sizes = [f"{data.size()} data-parallel"]
        details = []
        if stages is not None:
            sizes.append(f"{self.pipeline_parallel_size} pipeline")
            details.append(f"{stages.count} stages ({self.layout.pipeline_schedule} schedule)")
        if split is not None:
            sizes.append(f"{split.size()} tensor-parallel")
            details.append(f"{'with' if self.layout.sequence_parallel else 'without'} sequence parallelism")
        return " x ".join(sizes) + " ranks, " + ", ".join(details)

    @property
    def _build_device(self) -> torch.device:
        """Where the weights live: the strategy's device (a GPU, or the CPU)."""
        return self.trainer.strategy.root_device if self._trainer is not None else torch.device("cpu")

    @property
    def _world_size(self) -> int:
        return self.trainer.world_size if self._trainer is not None else 1

    def _shard_mesh(self):
        """The mesh FSDP2 shards over (None: no sharding); techniques may narrow it."""
        mesh = data_parallel_mesh(self.device_mesh)
        if mesh is not None:
            for callback in self.step_callbacks:
                mesh = callback.shard_mesh(mesh)
        return mesh

    def configure_optimizers(self) -> torch.optim.Optimizer:
        optimizer = self.optimizer_config.build(self.model, fused=self.layout.fused_adamw)
        self.training_state.optimizer = optimizer
        self._configured_groups = group_settings(optimizer)
        return optimizer

    def setup(self, stage: str) -> None:
        """Fix the data-parallel size, now known, into the global batch arithmetic; find the step callbacks."""
        if stage != "fit":
            return
        state = self.training_state
        previous = state.global_batch
        ranks = self.data_groups.data_parallel_size(self.trainer.world_size)
        state.global_batch = GlobalBatch(
            self.batch_config, previous.micro_batch_size, ranks, previous.sequential_replicas
        )
        state.global_batch.load_state_dict(previous.state_dict())
        state.log_every_n_steps = self.trainer.log_every_n_steps
        self._step_callbacks = [callback for callback in self.trainer.callbacks if isinstance(callback, StepCallback)]

    def on_fit_start(self) -> None:
        """The device is known once the strategy has placed the model (after ``setup``); a
        run resumed from a checkpoint taken at its end is marked ``stopping`` before any
        technique starts (a replica group then joins no quorum)."""
        state = self.training_state
        state.device = self.device
        state.stopping = bool(state.clock.steps) and self._ends_training()

    # ---------------------------------------------------------------- forward / loss
    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None) -> torch.Tensor:
        return self.model(input_ids, position_ids)

    def loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Mean next-token cross-entropy in fp32 over the batch's labelled tokens (forward
        through every stage of a pipeline: on each of its ranks)."""
        if self._pipeline is not None:
            with attention_backend(self.layout.attention_backend):
                return self._pipeline.evaluate(batch["input_ids"], batch["labels"])
        with attention_backend(self.layout.attention_backend), loss_context(self.model):
            return self.model(batch["input_ids"], batch.get("position_ids"), labels=batch["labels"])

    # ---------------------------------------------------------------- training
    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        """Begin an optimizer step at its first micro-batch; tell DDP whether this one syncs.

        This runs before the strategy's forward, which is where DDP reads its sync flag.
        """
        state = self.training_state
        if state.micro_batch_index == 0:
            self._start_step()
        set_gradient_sync(self.trainer.strategy.model, enabled=state.is_last_micro_batch)

    def _start_step(self) -> None:
        state = self.training_state
        for callback in self.step_callbacks:
            callback.on_step_start(state)
        if state.at_global_step_start:
            state.global_batch.apply_pending()
            state.schedule_tokens = state.clock.tokens
        if self._float8_scales_per_step:
            # After every change to the weights (optimizer, outer step, heal, resume), before
            # the first all-gather: FSDP2 gathers float8 weights with these scales.
            precompute_fsdp_scales(self.model)
        self._step_loss, self._step_tokens = torch.zeros((), device=self.device), 0

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        state = self.training_state
        batch = state.cut(batch)
        if self._pipeline is not None:
            loss = self._pipelined(batch)
        else:
            loss = self.loss(batch)
            # Each rank's micro-batches weigh 1/accumulation; DDP and FSDP average over ranks,
            # so the gradient is the mean over the global batch.
            with loss_context(self.model):
                self.manual_backward(loss / state.global_batch.accumulation)
        self._step_loss += loss.detach()
        self._step_tokens += batch["labels"].numel()
        state.seq_len = batch["labels"].shape[1]
        for callback in self.step_callbacks:
            callback.on_micro_batch_end(state)
        state.micro_batch_index += 1
        if state.micro_batch_index == state.global_batch.accumulation:
            self._finish_step()
        return loss.detach()

    def _pipelined(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Collect the step's micro-batches; at the last, run them through the pipeline's
        schedule (forward and backward, gradients averaged over them). Returns what this
        micro-batch adds to the step's summed loss: the step's mean loss times the micro-batch
        count at the last one, so the step's mean is the pipeline's; zero before it. A step
        whose micro-batches must each leave their own gradient (``StepCallback``) runs each
        through the pipeline alone."""
        state = self.training_state
        accumulation = state.global_batch.accumulation
        if any(callback.needs_micro_step_gradients(state) for callback in self.step_callbacks):
            with attention_backend(self.layout.attention_backend):
                return self._pipeline.step(batch["input_ids"], batch["labels"], 1, accumulation)
        self._pipeline_rows.append(batch)
        if not state.is_last_micro_batch:
            return torch.zeros((), device=self.device)
        rows = {key: torch.cat([part[key] for part in self._pipeline_rows]) for key in ("input_ids", "labels")}
        self._pipeline_rows = []
        with attention_backend(self.layout.attention_backend):
            return self._pipeline.step(rows["input_ids"], rows["labels"], accumulation, accumulation) * accumulation

    def _finish_step(self) -> None:
        state = self.training_state
        lr = learning_rate(
            self.optimizer_config.lr, self.lr_schedule, state.schedule_step, state.schedule_tokens, state.token_budget
        )
        scale = state.lr_scale
        if scale is not None:
            lr *= scale
            state.record_metric("train/lr_scale", scale)
        optimizer = self.optimizers()
        for group in optimizer.param_groups:
            group["lr"] = lr
            if "name" in group:  # optimizers of several parts (Muon and AdamW) log each part's rate
                state.record_metric(f"train/lr/{group['name']}", lr)
        optimizer.step()  # clips in on_before_optimizer_step, after any loss-scale unscaling
        optimizer.zero_grad(set_to_none=True)

        # Every rank (of every data group) trains the same shapes: global tokens = local tokens x ranks.
        ranks = self.data_groups.data_parallel_size(self.trainer.world_size)
        state.clock.advance(state.global_batch.sequences_per_optimizer_step, self._step_tokens * ranks)
        state.trained_tokens += self._step_tokens * self.data_groups.job_data_parallel_size(self.trainer.world_size)
        state.micro_batch_index = 0
        state.local_step_loss = self._step_loss / state.global_batch.accumulation
        state.step_loss = self.trainer.strategy.reduce(
            state.local_step_loss.clone(), reduce_op="mean"
        )  # reduces in place
        state.stopping = self._ends_training()
        state.record_metrics(
            {
                "train/loss": state.step_loss,
                "train/grad_norm": self._grad_norm,
                "train/lr": lr,
                "train/sequences_seen": state.clock.sequences,
                "train/global_batch_size": state.global_batch.size,
                "train/seq_len": state.seq_len,
            }
        )
        for callback in self.step_callbacks:
            callback.on_step_end(state)
        if state.stopping:
            self.trainer.should_stop = True
        if state.is_logging_step:
            self._log_step()
        state.metrics.clear()

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Clip to ``optimizer.grad_clip`` (inf: measure only) and keep the global norm.

        Lightning calls this inside ``optimizer.step()``, after a 16-bit loss scaler has
        unscaled the gradients, so the norm is that of the true gradients in every precision.
        """
        across = self.training_state.pipeline_group
        self._grad_norm = clip_grad_norm(self.model, self.optimizer_config.grad_clip or math.inf, across)

    def _ends_training(self) -> bool:
        """The token budget or max_steps is reached, and no technique is mid-way through a global step."""
        state = self.training_state
        budget_reached = state.token_budget is not None and state.clock.tokens >= state.token_budget
        steps_reached = 0 < self.trainer.max_steps <= state.clock.steps
        if not (budget_reached or steps_reached):
            return False
        return all(callback.allows_stop(state) for callback in self.step_callbacks)

    def _log_step(self) -> None:
        """Send this step's metrics to every logger, with optimizer steps as the step axis.

        Lightning's own ``self.log`` counts steps in training batches, which here are
        micro-batches; logging directly keeps the step axis in optimizer steps and puts
        the token clock (the x-axis of every chart) in every row. This is the only place
        where the step's device values are read.
        """
        row = self.training_state.metrics.as_floats()
        row["train/tokens_seen"] = float(self.training_state.clock.tokens)
        if self.data_groups.count > 1:  # other jobs train slices of the same steps: what this one trained
            row["train/tokens_trained"] = float(self.training_state.trained_tokens)
        for logger in self.loggers:
            logger.log_metrics(row, step=self.training_state.clock.steps)
        shown = {key: row[key] for key in PROGRESS_BAR_KEYS if key in row}
        self.log_dict(shown, prog_bar=True, logger=False)

    def on_validation_model_zero_grad(self) -> None:
        """Keep accumulated gradients: this module clears them itself after each step."""

    # ---------------------------------------------------------------- validation
    def on_validation_epoch_start(self) -> None:
        self._val_sums: dict[str | None, list[torch.Tensor | int]] = {}

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        """Validation always runs at the full packed length; a mixture's batches name their source.
        Sums of token losses and token counts, so the mean weighs every token once."""
        zeros = torch.zeros((), dtype=torch.float64, device=self.device)
        total = self._val_sums.setdefault(batch.get("source"), [zeros, zeros.clone()])
        tokens = (batch["labels"] != IGNORE_INDEX).sum()
        total[0] += self.loss(batch).detach().double() * tokens
        total[1] += tokens

    def _token_mean(self, loss_sum: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Mean loss per validation token over every rank: the same number whatever the
        micro-batch size and the process count (a mean of batch means is not: a short last
        batch would weigh as much as a full one)."""
        reduce = self.trainer.strategy.reduce
        return (reduce(loss_sum.clone(), reduce_op="sum") / reduce(tokens.clone(), reduce_op="sum")).float()

    def on_validation_epoch_end(self) -> None:
        """The token mean over all validation rows, and each mixture source's as ``val/loss/<name>``."""
        if not self._val_sums:
            return
        loss_sum = sum(total[0] for total in self._val_sums.values())
        tokens = sum(total[1] for total in self._val_sums.values())
        val_loss = self._token_mean(loss_sum, tokens)
        self.log("val/loss", val_loss, prog_bar=True, logger=False)  # for the bar and checkpoint monitors
        per_source = {
            f"val/loss/{source}": self._token_mean(*total).item()
            for source, total in self._val_sums.items()
            if source is not None
        }
        if not self.trainer.sanity_checking:
            value = val_loss.item()
            row = {
                "val/loss": value,
                "val/ppl": perplexity(value),
                **per_source,
                "train/tokens_seen": float(self.training_state.clock.tokens),
            }
            for logger in self.loggers:
                logger.log_metrics(row, step=self.training_state.clock.steps)

    # ---------------------------------------------------------------- checkpoints
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Save the state as of the last completed optimizer step.

        A checkpoint taken mid-accumulation (preemption) is still exact: weights, optimizer
        state and clock only change at step boundaries, the data position is the clock's
        sequence count, and a resumed run simply recomputes the partial step.
        """
        checkpoint["training_state"] = self.training_state.state_dict()
        checkpoint["world_size"] = self.trainer.world_size
        if self.training_state.weights_note is not None:
            checkpoint[WEIGHTS_NOTE] = self.training_state.weights_note

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Continue the checkpoint's clock and batch; settings changed since are applied and logged.

        The learning rate follows the config at every step; the other optimizer settings
        are put into the restored optimizer in ``on_train_start``. The global batch is the
        configured one unless a technique sets it (then it continues where it was).
        """
        state = self.training_state
        state.load_state_dict(checkpoint["training_state"])
        notes = resume_notes(checkpoint.get("hyper_parameters", {}), self.hparams)
        written_by = checkpoint.get("world_size", self.trainer.world_size)
        if written_by != self.trainer.world_size:
            notes.append(
                f"resuming on {processes(self.trainer.world_size)} (the checkpoint's run had {written_by}):"
                f" the weights and optimizer state are resharded, the data continues at sequence {state.clock.sequences:,}"
            )
        for note in notes:
            log.info(note)
        configured = self.batch_config.global_batch_size
        if not self.batch_scheduled and state.global_batch.size != configured:
            log.info(
                "resuming with batch.global_batch_size=%d (the checkpoint's run was at %d)",
                configured,
                state.global_batch.size,
            )
            state.global_batch.size = configured

    def on_train_start(self) -> None:
        """Put the configured optimizer settings into a (possibly restored) optimizer; read the
        data from the clock's position (which a replica group that rejoined its peers moved);
        a run resumed from a checkpoint taken at its end stops before taking another step."""
        restore_group_settings(self.training_state.optimizer, self._configured_groups)
        if hasattr(self.trainer.datamodule, "seek"):
            self.trainer.datamodule.seek(self.training_state.clock.sequences)
            self.training_state.set_data_seek(self.trainer.datamodule.seek)  # a clock moved mid-run
        if self.training_state.stopping:
            log.info(
                "the checkpoint is at the end of training (step %d): nothing left to train",
                self.training_state.clock.steps,
            )
            self.trainer.should_stop = True

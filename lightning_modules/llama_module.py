"""The LightningModule that trains a Llama and owns the shared training knobs.

Knobs (see DESIGN.md, "Shape"): the clock, the global batch, the training sequence
length, the token-based LR schedule and the token budget. Callbacks change training only
through these.

Each ``training_step`` is one micro-batch; the module owns gradient accumulation (manual
optimization), because the number of micro-batches per optimizer step changes whenever
the global batch does, which Lightning's ``accumulate_grad_batches`` cannot express.
"""

import math
import warnings
from dataclasses import asdict
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.strategies import FSDPStrategy
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp.wrap import wrap
from torch.nn.parallel import DistributedDataParallel

from lightning_modules.clock import TrainingClock
from lightning_modules.global_batch import BatchConfig, GlobalBatch
from lightning_modules.llama import Llama, LlamaConfig
from lightning_modules.lr_schedule import LRScheduleConfig, learning_rate
from lightning_modules.optim import OptimizerConfig, build_optimizer
from lightning_modules.parallelism import LayoutConfig, apply_layout, attention_backend, clip_grad_norm

PROGRESS_BAR_KEYS = ("train/loss", "train/tokens_seen", "perf/tokens_per_sec")

# ModelCheckpoint warns that under manual optimization it saves the state after the
# optimizer step: that is the state the clock in the checkpoint describes.
warnings.filterwarnings("ignore", message="Using ModelCheckpoint with manual optimization")


class LlamaLightningModule(L.LightningModule):
    """Next-token prediction on packed rows with token-based schedules.

    Args:
        model: the architecture; ``vocab_size`` must be filled in.
        optimizer, lr_schedule, batch, layout: settings of their Hydra groups.
        token_budget: training stops once this many tokens were seen (all ranks).
        init_state_dict: weights to start from (e.g. converted Hugging Face weights);
            applied when the model is built, before any sharding.
    """

    def __init__(
        self,
        model: LlamaConfig,
        optimizer: OptimizerConfig,
        lr_schedule: LRScheduleConfig,
        batch: BatchConfig,
        layout: LayoutConfig,
        token_budget: int | None = None,
        init_state_dict: dict[str, torch.Tensor] | None = None,
    ) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.save_hyperparameters(
            {
                "model": asdict(model),
                "optimizer": asdict(optimizer),
                "lr_schedule": asdict(lr_schedule),
                "batch": asdict(batch),
                "layout": asdict(layout),
                "token_budget": token_budget,
            }
        )
        self.model_config, self.optimizer_config = model, optimizer
        self.lr_schedule, self.batch_config, self.layout = lr_schedule, batch, layout
        self.token_budget = token_budget
        self._init_state_dict = init_state_dict
        self.model: Llama | None = None

        self.clock = TrainingClock()
        self.global_batch = GlobalBatch(batch)
        self.train_seq_len: int | None = None  # None: train on the full packed length
        self.seq_len_mode = "truncate"  # how rows are cut to train_seq_len: truncate | reshape
        self.seq_len_varies = False  # set by techniques that change the length during training
        self._micro_index = 0  # micro-batch within the current optimizer step
        self._step_loss = torch.zeros(())
        self._step_tokens = 0
        self.trained_seq_len = 0  # sequence length of the last micro-batch trained on
        self.step_metrics: dict[str, float] = {}  # this step's metrics; callbacks may add to it
        self.log_this_step = False  # callbacks set it to log this step's metrics off the usual interval
        # DiLoCo: ranks form `replica_groups` replicas that never sync gradients; FSDP2
        # shards only within a replica (mesh replica x shard, kept in `replica_mesh`).
        self.replica_groups = 1
        self.replica_mesh = None
        # Simulated replicas take turns: `turns_per_step` optimizer steps make one step of
        # the LR schedule, which reads the tokens seen when that global step began.
        self.turns_per_step = 1
        self._schedule_tokens = 0

    # ---------------------------------------------------------------- model building
    def configure_model(self) -> None:
        """Build the model (once) and lay it out: checkpointing, compile, FSDP2 sharding."""
        if self.model is not None:
            return
        self.model = Llama(self.model_config)
        if self._init_state_dict is not None:
            self.model.load_state_dict(self._init_state_dict)
            self._init_state_dict = None
        apply_layout(self.model, self.layout, mesh=self._shard_mesh(), dynamic_seq_len=self.seq_len_varies)
        if self._trainer is not None and isinstance(self.trainer.strategy, FSDPStrategy):
            # Wrap the model itself (with the strategy's settings, which Lightning puts in
            # effect around configure_model) so Lightning does not wrap this module: its
            # training_step runs backward, which FSDP1 forbids inside a root forward.
            self.model = wrap(self.model)

    def _shard_mesh(self):
        """The mesh FSDP2 shards over under ModelParallelStrategy (None: no sharding).

        With DiLoCo replica groups, a (replica, shard) mesh is built and only its shard
        dimension shards, so inner steps never communicate across replicas. A replica of one
        rank still gets FSDP2 on its 1-rank mesh: nothing is communicated, and Lightning's
        checkpointing, which expects distributed parameters, works unchanged.
        """
        mesh = self.device_mesh
        if mesh is None:
            return None
        if mesh.mesh_dim_names and "tensor_parallel" in mesh.mesh_dim_names:
            if mesh["tensor_parallel"].size() != 1:
                raise ValueError("tensor parallelism is not supported: set strategy.tensor_parallel_size=1.")
            mesh = mesh["data_parallel"]
        if self.replica_groups == 1:
            return mesh
        shards = mesh.size() // self.replica_groups
        self.replica_mesh = init_device_mesh(
            mesh.device_type, (self.replica_groups, shards), mesh_dim_names=("replica", "shard")
        )
        return self.replica_mesh["shard"]

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return build_optimizer(self.model, self.optimizer_config)

    def setup(self, stage: str) -> None:
        """Fix the data-parallel size, now known, into the global batch arithmetic."""
        if stage == "fit":
            state = self.global_batch.state_dict()
            self.global_batch = GlobalBatch(self.batch_config, data_parallel_size=self.data_parallel_size)
            self.global_batch.load_state_dict(state)

    @property
    def data_parallel_size(self) -> int:
        """Ranks that each read different data: all of them (DDP and FSDP shard data)."""
        return self.trainer.world_size if self._trainer is not None else 1

    # ---------------------------------------------------------------- forward / loss
    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None) -> torch.Tensor:
        return self.model(input_ids, position_ids)

    def loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Mean next-token cross-entropy in fp32 over the batch's labelled tokens."""
        with attention_backend(self.layout.attention_backend):
            logits = self.model(batch["input_ids"], batch.get("position_ids"))
        return F.cross_entropy(logits.float().flatten(0, 1), batch["labels"].flatten())

    def _fit_seq_len(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Cut the batch's rows to the current training sequence length d.

        ``truncate`` keeps the first d tokens of each row. ``reshape`` splits each row of
        length L into L // d rows of d tokens (the last L % d tokens are dropped), so tokens
        per step stay nearly constant; with no position ids, positions restart in each row.
        """
        length = batch["input_ids"].shape[1]
        if self.train_seq_len is None or self.train_seq_len >= length:
            return batch
        d = self.train_seq_len
        if self.seq_len_mode == "truncate":
            return {key: value[:, :d] for key, value in batch.items()}
        keep = length // d * d
        return {key: value[:, :keep].reshape(-1, d) for key, value in batch.items() if key != "position_ids"}

    def preallocate(self, seq_len: int) -> None:
        """One forward/backward at full length, so the allocator reserves full-size blocks
        first and shorter-then-longer sequences do not fragment memory. Changes nothing else."""
        tokens = torch.zeros(self.batch_config.micro_batch_size, seq_len, dtype=torch.long, device=self.device)
        with self.trainer.precision_plugin.forward_context():
            self.model(tokens).float().mean().backward()
        self.model.zero_grad(set_to_none=True)

    # ---------------------------------------------------------------- training
    @property
    def at_step_boundary(self) -> bool:
        """True between optimizer steps (no gradients are partly accumulated)."""
        return self._micro_index == 0

    @property
    def schedule_step(self) -> int:
        """The 1-based step that step-based schedules (LR warmup, curricula) are at.

        It is the optimizer step about to run, except that simulated replicas' turns in
        one global step share one schedule step.
        """
        return self.clock.steps // self.turns_per_step + 1

    @property
    def micro_index(self) -> int:
        """Index of the current micro-batch within its optimizer step (0 at a boundary)."""
        return self._micro_index

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        if self.at_step_boundary:
            self.global_batch.apply_pending()
        wrapped = self.trainer.strategy.model
        if isinstance(wrapped, DistributedDataParallel):
            # DDP reads this flag in its forward: only the last micro-batch of a step
            # all-reduces; the earlier ones accumulate locally (what no_sync() does).
            wrapped.require_backward_grad_sync = self._micro_index == self.global_batch.accumulation - 1

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        batch = self._fit_seq_len(batch)
        loss = self.loss(batch)
        # Each rank's micro-batches weigh 1/accumulation; DDP and FSDP average over ranks,
        # so the gradient is the mean over the global batch.
        self.manual_backward(loss / self.global_batch.accumulation)
        self._step_loss = self._step_loss.to(loss.device) + loss.detach()
        self._step_tokens += batch["labels"].numel()
        self.trained_seq_len = batch["labels"].shape[1]
        self._micro_index += 1
        if self._micro_index == self.global_batch.accumulation:
            self._optimizer_step()
        return loss.detach()

    def _optimizer_step(self) -> None:
        optimizer = self.optimizers()
        if self.clock.steps % self.turns_per_step == 0:
            self._schedule_tokens = self.clock.tokens
        lr = learning_rate(
            self.optimizer_config.lr, self.lr_schedule, self.schedule_step, self._schedule_tokens, self.token_budget
        )
        for group in optimizer.param_groups:
            group["lr"] = lr
        max_norm = self.optimizer_config.grad_clip or math.inf
        grad_norm = clip_grad_norm(self.model, max_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

        # Every rank trains the same shapes, so global tokens = local tokens x ranks.
        self.clock.advance(self.global_batch.size, self._step_tokens * self.data_parallel_size)
        step_loss = self.trainer.strategy.reduce(self._step_loss / self.global_batch.accumulation, reduce_op="mean")
        self._log_step(step_loss, lr, grad_norm)
        self._micro_index, self._step_loss, self._step_tokens = 0, torch.zeros(()), 0
        if self.token_budget is not None and self.clock.tokens >= self.token_budget:
            self.trainer.should_stop = True

    def _log_step(self, loss: torch.Tensor, lr: float, grad_norm: torch.Tensor) -> None:
        self.step_metrics.update(
            {
                "train/loss": loss.item(),
                "train/sequences_seen": self.clock.sequences,
                "train/lr": lr,
                "train/global_batch_size": self.global_batch.size,
                "train/seq_len": self.trained_seq_len,
                "train/grad_norm": grad_norm.item(),
            }
        )

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        """Flush the metrics of a completed optimizer step (callbacks have added theirs by now)."""
        if not self.at_step_boundary:
            return
        if self.clock.steps % self.trainer.log_every_n_steps == 0 or self.trainer.should_stop or self.log_this_step:
            self.log_metrics(self.step_metrics)
        self.log_this_step = False
        metrics = {**self.step_metrics, "train/tokens_seen": self.clock.tokens}
        shown = {key: float(metrics[key]) for key in PROGRESS_BAR_KEYS if key in metrics}
        self.log_dict(shown, prog_bar=True, logger=False)
        self.step_metrics.clear()

    def log_metrics(self, metrics: dict[str, float]) -> None:
        """Send metrics to every logger at the current optimizer step.

        Lightning's own ``self.log`` counts steps in training batches, which here are
        micro-batches; logging directly keeps the step axis in optimizer steps and puts
        the token clock (the x-axis of every chart) in every row.
        """
        row = {key: float(value) for key, value in metrics.items()}
        row["train/tokens_seen"] = float(self.clock.tokens)
        for logger in self.loggers:
            logger.log_metrics(row, step=self.clock.steps)

    def on_validation_model_zero_grad(self) -> None:
        """Keep accumulated gradients: this module clears them itself after each step."""

    # ---------------------------------------------------------------- validation
    def on_validation_epoch_start(self) -> None:
        self._val_loss_sum = torch.zeros((), device=self.device)
        self._val_batches = 0

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        """Validation always runs at the full packed length."""
        self._val_loss_sum += self.loss(batch).detach()
        self._val_batches += 1

    def on_validation_epoch_end(self) -> None:
        """Mean over batches and ranks (every rank runs the same number of equal batches)."""
        if self._val_batches == 0:
            return
        val_loss = self.trainer.strategy.reduce(self._val_loss_sum / self._val_batches, reduce_op="mean")
        self.log("val/loss", val_loss, prog_bar=True, logger=False)  # for the bar and checkpoint monitors
        if not self.trainer.sanity_checking:
            self.log_metrics({"val/loss": val_loss.item(), "val/ppl": math.exp(val_loss.item())})

    # ---------------------------------------------------------------- checkpoints
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Save the knobs as of the last completed optimizer step.

        A checkpoint taken mid-accumulation (preemption) is still exact: weights, optimizer
        state and clock only change at step boundaries, the data position is the clock's
        sequence count, and a resumed run simply recomputes the partial step.
        """
        checkpoint["training_knobs"] = {
            "clock": self.clock.state_dict(),
            "global_batch": self.global_batch.state_dict(),
            "train_seq_len": self.train_seq_len,
            "schedule_tokens": self._schedule_tokens,
        }

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        knobs = checkpoint["training_knobs"]
        self.clock.load_state_dict(knobs["clock"])
        self.global_batch.load_state_dict(knobs["global_batch"])
        self.train_seq_len = knobs["train_seq_len"]
        self._schedule_tokens = knobs["schedule_tokens"]

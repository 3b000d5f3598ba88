"""DiLoCo (Douillard et al. 2023; scaling laws: Charles et al. 2025): replicas that sync every H steps.

M replicas train with their own inner AdamW state and never average gradients; every H
inner optimizer steps the outer step (``callbacks/diloco_outer_step.py``) averages their
pseudo-gradients (anchor - parameters) and moves the shared anchor with Nesterov SGD.

Two ways to run the replicas:

- **Real** (several processes, ``strategy=fsdp2``): the W ranks form M groups of W / M; the
  training module builds a (replica, shard) mesh and FSDP2 shards only within a replica,
  so inner steps never communicate across replicas. Every rank reads different data and
  the global batch is the sum over replicas (B / M each).
- **Simulated** (one process, the default when M > 1 and there is one process): the
  replicas take turns, one optimizer step each per global step, every one on its own
  weights and inner optimizer state (swapped in by pointer, no copies); each turn trains
  on the next B / M sequences. The LR schedule follows the global step, so M turns share
  one LR. ``trainer.max_steps`` then counts turns (M per global step).

Training always ends synced: if it stops mid-round, the replicas are averaged (anchor minus
the averaged pseudo-gradient, no outer momentum or learning rate, since a partial round's
pseudo-gradient is not a full outer gradient), so the final weights are one model. Checkpoints hold the anchor, the outer momentum and every replica's
weights and inner optimizer state (gathered from all ranks into the single checkpoint
file), so a run resumed mid-round continues exactly.

Memory: the anchor and the outer momentum add two fp32 copies of the (sharded) weights,
on the GPU or, with ``state_device=cpu``, in host memory; simulation adds M - 1 copies of
the weights and M - 1 inner optimizer states.

Logged: ``diloco/round``, ``diloco/pseudo_grad_norm`` (of the averaged pseudo-gradient),
``diloco/bytes_per_token`` and ``diloco/dp_bytes_per_token`` (what all workers send per
token trained, against fp32 data parallelism over the same M workers), and
``diloco/replica_<r>_loss``.
"""

import dataclasses
from collections import defaultdict
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.strategies import ModelParallelStrategy

from callbacks.diloco_outer_step import (
    COMPRESSIONS,
    OuterOptimizer,
    average_across_replicas,
    average_in_process,
    bytes_sent_per_sync,
)
from lightning_modules.global_batch import BatchConfigError, GlobalBatch, check_single_controller
from lightning_modules.sharded_sums import local, shard_groups, sum_over_shards

# Outer learning rates by number of replicas (Charles et al. 2025); others use 0.7 (Douillard et al.).
OUTER_LR_BY_REPLICAS = {1: 0.4, 2: 0.6, 4: 0.6, 8: 0.8}
KEY = "diloco"


class DiLoCo(L.Callback):
    """Args:
    replicas: M (1 is valid: a Lookahead-like outer Nesterov step).
    sync_every: H, inner optimizer steps (global steps) per round.
    outer_lr: null picks it by M (0.4 / 0.6 / 0.6 / 0.8 for M = 1 / 2 / 4 / 8, else 0.7).
    outer_momentum, nesterov: the outer SGD.
    state_device: ``same`` (the parameters' device) or ``cpu`` for the anchor and momentum.
    compression: ``none``, ``bf16`` or ``int8`` for the pseudo-gradient exchange.
    simulated: null: simulate when M > 1 and the run has one process.
    """

    controls_global_batch = True

    def __init__(
        self,
        replicas: int = 2,
        sync_every: int = 30,
        outer_lr: float | None = None,
        outer_momentum: float = 0.9,
        nesterov: bool = True,
        state_device: str = "same",
        compression: str = "none",
        simulated: bool | None = None,
    ) -> None:
        if replicas < 1 or sync_every < 1:
            raise ValueError(f"{KEY}.replicas={replicas} and {KEY}.sync_every={sync_every} must be >= 1.")
        if state_device not in ("same", "cpu"):
            raise ValueError(f"{KEY}.state_device={state_device!r} must be 'same' or 'cpu'.")
        if compression not in COMPRESSIONS:
            raise ValueError(f"{KEY}.compression={compression!r} is unknown; choose one of {COMPRESSIONS}.")
        if not 0 <= outer_momentum < 1 or (outer_lr is not None and outer_lr <= 0):
            raise ValueError(f"{KEY}: outer_momentum must be in [0, 1) and outer_lr > 0.")
        self.replicas, self.sync_every = replicas, sync_every
        self.outer_lr = outer_lr if outer_lr is not None else OUTER_LR_BY_REPLICAS.get(replicas, 0.7)
        self.outer_momentum, self.nesterov = outer_momentum, nesterov
        self.state_device, self.compression, self.simulated = state_device, compression, simulated
        self.rounds = 0
        self._outer: OuterOptimizer | None = None
        self._loaded: dict[str, Any] | None = None

    # ------------------------------------------------------------------ setup and checks
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        check_single_controller(trainer.callbacks)
        world = trainer.world_size
        if self.simulated is None:
            self.simulated = self.replicas > 1 and world == 1
        if self.simulated:
            self._setup_simulation(trainer, pl_module, world)
        else:
            self._setup_real(trainer, pl_module, world)

    def _setup_simulation(self, trainer: L.Trainer, pl_module: L.LightningModule, world: int) -> None:
        if world != 1:
            raise BatchConfigError(
                f"{KEY}.simulated=true runs all replicas in one process, but this run has {world};"
                f" set {KEY}.simulated=false for real replicas over the processes."
            )
        config = pl_module.batch_config
        per_replica = config.global_batch_size // self.replicas
        if config.global_batch_size % (self.replicas * config.micro_batch_size):
            raise BatchConfigError(
                f"batch.global_batch_size={config.global_batch_size} must split into {self.replicas} replica"
                f" batches that are multiples of batch.micro_batch_size={config.micro_batch_size}."
            )
        if trainer.max_steps > 0 and trainer.max_steps % self.replicas:
            raise BatchConfigError(
                f"trainer.max_steps={trainer.max_steps} counts simulated turns ({self.replicas} per global"
                f" step): make it a multiple of {KEY}.replicas."
            )
        pl_module.batch_config = dataclasses.replace(config, global_batch_size=per_replica, max_global_batch_size=None)
        pl_module.global_batch = GlobalBatch(pl_module.batch_config)
        pl_module.turns_per_step = self.replicas

    def _setup_real(self, trainer: L.Trainer, pl_module: L.LightningModule, world: int) -> None:
        if world % self.replicas:
            raise BatchConfigError(f"{KEY}.replicas={self.replicas} must divide the {world} processes.")
        if self.replicas > 1 and not isinstance(trainer.strategy, ModelParallelStrategy):
            raise BatchConfigError(
                f"{KEY}.replicas={self.replicas} over processes needs strategy=fsdp2: DDP or FSDP1 would"
                " average gradients across replicas at every step."
            )
        if world > 1 and getattr(trainer.strategy, "_save_distributed_checkpoint", False):
            raise BatchConfigError(
                "DiLoCo checkpoints gather every replica's state into one file:"
                " set strategy.save_distributed_checkpoint=false."
            )
        pl_module.replica_groups = self.replicas

    # ------------------------------------------------------------------ replicas
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._params = list(pl_module.model.parameters())
        self._optimizer = trainer.optimizers[0]
        device = "cpu" if self.state_device == "cpu" else None
        anchor = [local(p).detach().float().clone().to(device or p.device) for p in self._params]
        self._outer = OuterOptimizer(anchor, self.outer_lr, self.outer_momentum, self.nesterov)
        self._replicas_here = self.replicas if self.simulated else 1
        self._weights = [[local(p).data for p in self._params]]
        self._weights += [[w.clone() for w in self._weights[0]] for _ in range(1, self._replicas_here)]
        self._inner_states = [self._optimizer.state] + [defaultdict(dict) for _ in range(1, self._replicas_here)]
        self._losses: dict[int, float] = {}
        self._loss_sum, self._micro_batches = 0.0, 0
        self._tokens_at_sync, self._steps_at_sync = pl_module.clock.tokens, self._global_steps(pl_module)
        if self._loaded is not None:
            self._restore(self._loaded, pl_module)
            self._loaded = None

    def _activate(self, replica: int) -> None:
        """Point the live parameters and optimizer state at one simulated replica's."""
        for param, weight in zip(self._params, self._weights[replica]):
            param.data = weight
        self._optimizer.state = self._inner_states[replica]

    @staticmethod
    def _global_steps(pl_module: L.LightningModule) -> int:
        return pl_module.clock.steps // pl_module.turns_per_step

    def _replica_of_turn(self, pl_module: L.LightningModule) -> int:
        return pl_module.clock.steps % self.replicas if self.simulated else 0

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int) -> None:
        if self.simulated and pl_module.at_step_boundary:
            self._activate(self._replica_of_turn(pl_module))

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._loss_sum = self._loss_sum + (outputs["loss"] if isinstance(outputs, dict) else outputs).detach().float()
        self._micro_batches += 1
        if not pl_module.at_step_boundary:
            return
        step_loss = float(self._loss_sum / self._micro_batches)
        self._loss_sum, self._micro_batches = 0.0, 0
        if self.simulated:
            self._losses[(pl_module.clock.steps - 1) % self.replicas] = step_loss
            if pl_module.clock.steps % self.replicas:
                trainer.should_stop = False  # finish the global step: every replica takes its turn
                return
        else:
            self._losses = self._replica_losses(step_loss, pl_module.device)
        pl_module.step_metrics.update({f"diloco/replica_{r}_loss": loss for r, loss in sorted(self._losses.items())})
        full_round = self._global_steps(pl_module) % self.sync_every == 0
        if full_round or trainer.should_stop or 0 < trainer.max_steps <= trainer.global_step:
            self._outer_step(trainer, pl_module, full_round)

    def _replica_losses(self, step_loss: float, device: torch.device) -> dict[int, float]:
        """Each real replica's step loss, averaged over its ranks (one tiny all-gather)."""
        if self.replicas == 1 or not dist.is_initialized():
            return {0: step_loss}
        everyone = [torch.zeros(1, device=device) for _ in range(dist.get_world_size())]
        dist.all_gather(everyone, torch.tensor([step_loss], device=device))
        per_replica = torch.cat(everyone).reshape(self.replicas, -1).mean(1)
        return dict(enumerate(per_replica.tolist()))

    # ------------------------------------------------------------------ the outer step
    def _outer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, full_round: bool) -> None:
        """Sync the replicas: an outer optimizer step after a full round; after a partial one
        (training ended mid-round), the replicas' average, without an outer update."""
        anchors = self._outer.anchor
        if self.simulated:
            deltas = [
                average_in_process([a.to(w[i].device) - w[i].float() for w in self._weights], self.compression)
                for i, a in enumerate(anchors)
            ]
        else:
            group = pl_module.replica_mesh["replica"].get_group() if self.replicas > 1 else None
            deltas = [a.to(w.device) - w.float() for a, w in zip(anchors, self._weights[0])]
            if group is not None:
                deltas = [average_across_replicas(d, group, self.compression) for d in deltas]
        norm = self._norm(trainer, deltas)
        if full_round:
            self._outer.step(deltas)
            self.rounds += 1
        else:
            self._outer.average(deltas)
        for weights in self._weights:
            for weight, anchor in zip(weights, anchors):
                weight.copy_(anchor)
        self._log_round(pl_module, norm)

    def _norm(self, trainer: L.Trainer, deltas: list[torch.Tensor]) -> float:
        """Norm of the averaged pseudo-gradient over the whole model (shards summed)."""
        partials: dict = {}
        for param, delta in zip(self._params, deltas):
            key = shard_groups(param, ())
            partials[key] = partials.get(key, torch.zeros((), dtype=torch.float64, device=delta.device))
            partials[key] += delta.double().square().sum()
        return float(sum_over_shards(partials).sqrt())

    def _log_round(self, pl_module: L.LightningModule, norm: float) -> None:
        tokens = pl_module.clock.tokens - self._tokens_at_sync
        steps = self._global_steps(pl_module) - self._steps_at_sync
        self._tokens_at_sync, self._steps_at_sync = pl_module.clock.tokens, self._global_steps(pl_module)
        parameters = sum(p.numel() for p in self._params)
        pl_module.step_metrics.update(
            {
                "diloco/round": self.rounds,
                "diloco/pseudo_grad_norm": norm,
                "diloco/bytes_per_token": bytes_sent_per_sync(parameters, self.replicas, self.compression) / tokens,
                "diloco/dp_bytes_per_token": bytes_sent_per_sync(parameters, self.replicas, "none") * steps / tokens,
            }
        )
        pl_module.log_this_step = True

    # ------------------------------------------------------------------ checkpoints
    def _rank_state(self) -> dict[str, Any]:
        """This rank's outer state and the weights and inner optimizer state of its replica(s)."""
        replicas = []
        for weights, state in zip(self._weights, self._inner_states):
            inner = [{k: local(v).clone() if torch.is_tensor(v) else v for k, v in state.get(p, {}).items()} for p in self._params]
            replicas.append({"weights": [w.clone() for w in weights], "inner": inner})
        synced = {"tokens_at_sync": self._tokens_at_sync, "steps_at_sync": self._steps_at_sync}
        return {"outer": self._outer.state_dict(), "replicas": replicas, **synced}

    def _restore(self, state: dict[str, Any], pl_module: L.LightningModule) -> None:
        self._outer.load_state_dict(state["outer"])
        self._tokens_at_sync, self._steps_at_sync = state["tokens_at_sync"], state["steps_at_sync"]
        for weights, inner_state, saved in zip(self._weights, self._inner_states, state["replicas"]):
            for weight, value in zip(weights, saved["weights"]):
                weight.copy_(value)
            for param, entries in zip(self._params, saved["inner"]):
                live = inner_state[param]
                for name, value in entries.items():
                    if name in live and torch.is_tensor(live[name]):
                        local(live[name]).copy_(value)
                    else:
                        live[name] = value.clone() if torch.is_tensor(value) else value

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        if self._outer is None:
            return
        mine = self._rank_state()
        if trainer.world_size > 1:
            everyone = [None] * trainer.world_size if trainer.global_rank == 0 else None
            dist.gather_object(mine, everyone, dst=0)
            checkpoint["diloco_ranks"] = everyone
        else:
            checkpoint["diloco_ranks"] = [mine]

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        if "diloco_ranks" in checkpoint:
            self._loaded = checkpoint["diloco_ranks"][trainer.global_rank]

    def state_dict(self) -> dict[str, Any]:
        return {"rounds": self.rounds}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.rounds = state_dict["rounds"]

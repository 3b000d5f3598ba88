"""DiLoCo (Douillard et al. 2023; scaling laws: Charles et al. 2025; streaming: Douillard et al. 2025).

M replicas train with their own inner AdamW state and never average gradients; every H
global steps each fragment of the parameters (one fragment: the whole model) averages its
pseudo-gradients (anchor - parameters) over the replicas and the outer optimizer moves the
shared anchor (``sync.py``, ``outer_step.py``, ``exchange.py``).

Two ways to run the replicas (``replicas.py``):

- **Real** (several processes, ``strategy=fsdp2``): the W ranks form M groups of W / M; this
  callback gives the training module a (replica, shard) mesh to shard on, so inner steps
  never communicate across replicas. Every rank reads different data and the global batch
  is the sum over replicas (B / M each). Exchanges of streaming fragments are issued
  asynchronously and waited for ``fragment_delay`` steps later.
- **Simulated** (one process, the default when M > 1 and there is one process): the
  replicas take turns, one optimizer step each per global step, every one on its own
  weights and inner optimizer state; each turn trains on the next B / M sequences. The
  training state counts M optimizer steps per global step, so the LR schedule and other
  step-based schedules follow the global step. ``trainer.max_steps`` counts optimizer steps.
- **Fault-tolerant groups** (``backend=torchft``): each replica is a job of its own, one
  process, and torchft's lighthouse keeps the membership (``torchft_group.py``): a group that
  dies is left out from the next round on, one that restarts rejoins from a live peer.

Checkpoints hold the anchors, the outer optimizer's state, the exchanges in flight and every
replica's weights and inner optimizer state (gathered from all ranks into the single
checkpoint file), so a run resumed mid-round, or with a fragment in flight, continues exactly.

Memory: the anchor and the outer optimizer's state (one momentum buffer for SGD) add two
fp32 copies of the (sharded) weights, on the GPU or, with ``state_device=cpu``, in host
memory; simulation adds M - 1 copies of the weights and M - 1 inner optimizer states.

Logged at each sync: ``diloco/round`` (completed syncs of the last fragment),
``diloco/fragment`` (which synced; -1 for the final averaging), ``diloco/pseudo_grad_norm``
(of the averaged pseudo-gradient of that fragment), ``diloco/bytes_per_sync`` (what all
workers sent for it), ``diloco/sync_seconds`` (the exchange and the outer step, in this
process), ``diloco/bytes_per_token`` and ``diloco/dp_bytes_per_token`` (all exchanges so
far per token trained, against fp32 data parallelism over the same M workers); at logging
steps ``diloco/replica_<r>_loss``. With torchft also ``diloco/groups`` (the groups whose
rounds the sync averaged), ``diloco/discarded_rounds`` (at each discard), and, on a group
that was healed, ``diloco/rejoin_seconds`` and ``diloco/skipped_steps`` (global steps its
clock jumped over when healed, this job's slice of which its model never trained; a group
restarted without a checkpoint counts every step before it joined).

How a torchft group ends: a group that committed the run's final round, or was healed into
it, ends on the run's final weights. A group whose last rounds were discarded (left behind
by its peers) ends on its last committed weights, which are not the run's: its checkpoints
say so (``weights_note``, which the scripts that read checkpoints refuse) and the job ends
with one line naming how many rounds it is behind, exit code 3.
"""

import logging
import time
from typing import TYPE_CHECKING, Any

import lightning as L
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from callbacks.diloco.exchange import bytes_sent_per_sync
from callbacks.diloco.fragments import split_parameters
from callbacks.diloco.outer_step import OuterStep
from callbacks.diloco.replicas import Replicas, replica_mesh
from callbacks.diloco.settings import DiLoCoSettings
from callbacks.diloco.sync import FragmentSync, SyncRecord
from lightning_modules.sharded_sums import local, shard_groups, sum_over_shards
from lightning_modules.step_callback import StepCallback
from lightning_modules.training_state import TrainingState

if TYPE_CHECKING:
    from callbacks.diloco.torchft_group import TorchftGroup

log = logging.getLogger(__name__)


def resolved_settings(state: TrainingState) -> dict[str, str]:
    """The settings a group may leave at ``auto`` as this job resolved them (the device type,
    Muon's iteration dtype), so that groups on a GPU and on a CPU are not taken as alike."""
    resolved = {"trainer.accelerator": repr(state.device.type)}
    dtypes = sorted({group["ns_dtype"] for group in state.optimizer.param_groups if "ns_dtype" in group})
    if dtypes:
        resolved["optimizer.ns_dtype"] = repr(",".join(dtypes))
    return resolved


class DiLoCo(StepCallback):
    """Runs the replicas and their outer loop (settings: ``DiLoCoSettings``)."""

    def __init__(
        self, settings: DiLoCoSettings, simulated: bool, n_layers: int, shared: tuple[tuple[str, str], ...] = ()
    ) -> None:
        self.settings, self.simulated, self.n_layers = settings, simulated, n_layers
        self.shared = dict(shared)  # what every torchft replica group must run with
        self.syncs = 0
        self.bytes_sent = 0.0
        self.dp_bytes = 0.0
        self._group: dist.ProcessGroup | None = None
        self._replicas: Replicas | None = None
        self._sync: FragmentSync | None = None
        self._parameters: list[torch.nn.Parameter] = []
        self._losses: dict[int, torch.Tensor] = {}
        self._loaded: dict[str, Any] | None = None
        self._groups: TorchftGroup | None = None  # backend=torchft: this job's replica group
        self._groups_state: dict[str, int] | None = None  # its torchft step, from a checkpoint
        self._discarded = 0  # rounds this group's runs saw discarded before a resume
        self._skipped_steps = 0  # global steps this group's clock jumped over when healed
        self._uncommitted = 0  # rounds discarded in a row since this group last committed or healed
        self._pace_mark = (0.0, 0)  # time and global step of this group's last sync
        self._sync_seconds = 0.0

    # ------------------------------------------------------------------ build time
    def shard_mesh(self, mesh: DeviceMesh) -> DeviceMesh:
        """Real replicas shard only within a replica; the replica dimension carries the exchange."""
        if self.simulated or self.settings.replicas == 1 or self.settings.fault_tolerant:
            return mesh
        mesh_2d = replica_mesh(mesh, self.settings.replicas)
        self._group = mesh_2d["replica"].get_group()
        return mesh_2d["shard"]

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        state: TrainingState = pl_module.training_state
        names, parameters = zip(*state.model.named_parameters())
        self._parameters = list(parameters)
        # What fp32 data parallelism over the same workers would send per global step.
        every_parameter = range(len(self._parameters))
        self._dp_bytes_per_step = bytes_sent_per_sync(self._model_size(every_parameter), self.settings.replicas, "none")
        self._replicas = Replicas(self._parameters, state.optimizer, self.settings.replicas if self.simulated else 1)
        device = torch.device("cpu") if self.settings.state_device == "cpu" else None
        anchors = [local(p).detach().float().clone().to(device or p.device) for p in self._parameters]
        if self.settings.fault_tolerant and not state.stopping:  # a group resumed at its end joins no quorum
            self._groups = self._join_groups(trainer, state)
        self._sync = FragmentSync(
            weights=self._replicas.weights,
            fragments=split_parameters(names, self.n_layers, self.settings.fragments),
            outer=OuterStep(anchors, self.settings.make_outer_optimizer),
            sync_every=self.settings.sync_every,
            delay=self.settings.fragment_delay,
            alpha=self.settings.fragment_alpha,
            compression=self.settings.compression,
            group=self._group,
            norm=self._norm,
            average=self._groups.sync if self._groups is not None else None,
        )
        self._sync.discarded = self._discarded
        if self._loaded is not None:
            self._restore(self._loaded)
            self._loaded = None
        self._pace_mark = (time.perf_counter(), state.global_steps)
        if self._groups is not None:
            fresh = state.clock.steps == 0  # a new run: every group starts together
            groups = self.settings.replicas if fresh else 1
            records = self._sync.join(lambda deltas: self._groups.join(deltas, groups))
            self._after_round(state, records)

    # ------------------------------------------------------------------ torchft groups
    def _join_groups(self, trainer: L.Trainer, state: TrainingState) -> "TorchftGroup":
        """This job's replica group in the torchft quorum, with what a live peer sends a
        group that rejoins (its DiLoCo state and clock) and what every group must agree on:
        the run's shared settings, its `auto` ones as resolved here, and the tokens' content."""
        from callbacks.diloco.torchft_group import TorchftGroup

        agreed = {
            **self.shared,
            **resolved_settings(state),
            "data.tokens": trainer.datamodule.content_fingerprint,
            "data.vocab_size": repr(trainer.datamodule.vocab_size),
        }
        groups = TorchftGroup(
            self.settings.torchft,
            self.settings.torchft.quorum_size(self.settings.replicas),
            lambda: self._recovery_state(state),
            lambda received: self._recover(state, received),
            agreed,
        )
        if self._groups_state is not None:
            # Resumed from this group's own checkpoint: it claims one round fewer than it
            # committed, so a live peer at the same round (which has trained on since the
            # checkpoint) heals it to the peers' clock; where every group resumed at that
            # round (a whole-run restart), none is ahead and each goes on from its checkpoint.
            groups.load_state_dict({**self._groups_state, "step": max(self._groups_state["step"] - 1, 0)})
        return groups

    def _recovery_state(self, state: TrainingState) -> dict[str, Any]:
        """What this group sends one that is healed, as it stands at the sync, before the
        round's average (which the healed group then takes too). The run's counters go with
        it; what is the group's own (its torchft step, the rounds it saw discarded, the steps
        it skipped) stays, and goes only into its checkpoints (``state_dict``)."""
        return {"diloco": self._rank_state(), "clock": state.clock.state_dict(), "counters": self._run_counters()}

    def _recover(self, state: TrainingState, received: dict[str, Any]) -> None:
        self._restore(received["diloco"])
        behind = state.global_steps
        state.move_clock(received["clock"])  # the data follows: this group reads its slice of the peers' steps
        self._skipped_steps += state.global_steps - behind  # from 0 for a group restarted without a checkpoint
        self._uncommitted = 0
        self._load_run_counters(received["counters"])

    def _after_round(self, state: TrainingState, records: list[SyncRecord]) -> None:
        """Log a heal; a group healed into the peers' last sync ends the run with them."""
        for record in records:
            self._log_sync(state, record)
        healed_in = self._groups.take_heal()
        if healed_in is not None:
            log.info(
                "rejoined the DiLoCo replica groups at global step %d (round %d) with a live peer's state, in %.2f s",
                state.global_steps,
                self.syncs,
                healed_in,
            )
            state.record_metrics({"diloco/rejoin_seconds": healed_in, "diloco/skipped_steps": self._skipped_steps})
            state.log_now()
        if any(record.ends for record in records):
            state.stopping = True
        elif state.stopping:
            state.weights_note = self._behind_note()

    def _behind_note(self) -> str:
        """Why this group's final weights are not the run's: its final average was discarded."""
        group, cause = self.settings.torchft.group, self._groups.discard_cause or "see the log"
        return (
            f"replica group {group} ended {self._uncommitted} round(s) behind the run (its last rounds discarded:"
            f" {cause}): its weights are its last committed ones, not the run's final weights; use the checkpoint"
            " of a group that ended without this message"
        )

    def _count_discards(self, state: TrainingState, discarded: int) -> None:
        """Say why each discarded round was, log the count at once, and warn of a stall."""
        cause = self._groups.discard_cause if self._groups is not None else "a replica group failed during it"
        state.record_metric("diloco/discarded_rounds", self._sync.discarded)
        state.log_now()
        warn_every = self.settings.torchft.warn_after_rounds
        for _ in range(discarded):  # the last step's round and the final average may both be
            log.info("round discarded at global step %d: %s", state.global_steps, cause)
            self._uncommitted += 1
            if self._uncommitted % warn_every == 0:
                self._warn_stalled(cause)

    def _warn_stalled(self, cause: str) -> None:
        """Say that this group has stalled: beside its peers' pace where some are alive; where the
        lighthouse sees no other group alive, that none is (the join timeout is no remedy for a
        peer that is down, and a dead peer's pace is no measure)."""
        torchft, groups = self.settings.torchft, self._groups
        min_groups = torchft.quorum_size(self.settings.replicas)
        if groups.live_peers() == 0:
            log.warning(
                "replica group %d has committed none of its last %d round(s) (%s): no other group is alive (none"
                " heartbeats to the lighthouse at %s: they are down or finished), and a round commits only with"
                " min_groups=%d groups; restart the missing groups to go on",
                torchft.group,
                self._uncommitted,
                cause,
                torchft.address(),
                min_groups,
            )
            return
        peers = (
            f"{groups.peer_pace_s:.2f} s"
            if groups.peer_pace_s is not None
            else "not known (no round shared with them yet)"
        )
        log.warning(
            "replica group %d has committed none of its last %d round(s) (%s): it takes %.2f s per global step, its peers %s;"
            " a group that asks for a quorum more than the lighthouse's --join_timeout_ms after the others is left out"
            " of their round, a round commits only with min_groups=%d groups, and a heal's transfer has timeout_s=%g s",
            torchft.group,
            self._uncommitted,
            cause,
            groups.pace_s,
            peers,
            min_groups,
            torchft.timeout_s,
        )

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._groups is not None:
            self._groups.shutdown()

    # ------------------------------------------------------------------ step hooks
    def on_step_start(self, state: TrainingState) -> None:
        if self.simulated:
            self._replicas.activate(self._turn(state))

    def _turn(self, state: TrainingState) -> int:
        """The simulated replica whose turn the optimizer step in progress is."""
        return state.clock.steps % self.settings.replicas

    def allows_stop(self, state: TrainingState) -> bool:
        """Finish the global step: every replica takes its turn."""
        return state.at_global_step_end

    def on_step_end(self, state: TrainingState) -> None:
        if self.simulated:
            self._losses[(state.clock.steps - 1) % self.settings.replicas] = state.step_loss
        if not state.at_global_step_end:
            return
        self.dp_bytes += self._dp_bytes_per_step
        discarded, started = self._sync.discarded, time.perf_counter()
        if self._groups is not None:
            self._groups.pace_s = (started - self._pace_mark[0]) / max(state.global_steps - self._pace_mark[1], 1)
        records = self._sync.after_global_step(state.global_steps, ending=state.stopping)
        if state.stopping:
            records += self._sync.finish()
        self._sync_seconds = time.perf_counter() - started
        if records or self._sync.discarded > discarded:
            self._pace_mark = (time.perf_counter(), state.global_steps)
        if records:
            self._uncommitted = 0
        if self._sync.discarded > discarded:
            self._count_discards(state, self._sync.discarded - discarded)
        if self._groups is not None:
            self._after_round(state, records)
        else:
            for record in records:
                self._log_sync(state, record)
        if state.is_logging_step:
            self._record_losses(state)

    # ------------------------------------------------------------------ metrics
    def _model_size(self, indices) -> int:
        return sum(self._parameters[i].numel() for i in indices)

    def _norm(self, indices: list[int], deltas: list[torch.Tensor]) -> torch.Tensor:
        """Norm of an averaged pseudo-gradient over the whole model (shards summed)."""
        partials: dict = {}
        for index, delta in zip(indices, deltas):
            key = shard_groups(self._parameters[index], ())
            partials[key] = partials.get(key, torch.zeros((), dtype=torch.float64, device=delta.device))
            partials[key] += delta.double().square().sum()
        return sum_over_shards(partials).sqrt()

    def _log_sync(self, state: TrainingState, record: SyncRecord) -> None:
        replicas = self._groups.groups_present if self._groups is not None else self.settings.replicas
        sent = bytes_sent_per_sync(self._model_size(record.indices), replicas, self.settings.compression)
        if self._groups is not None:
            state.record_metric("diloco/groups", self._groups.contributors)
        self.bytes_sent += sent
        if record.fragment == self.settings.fragments - 1:
            self.syncs += 1
        tokens = max(state.clock.tokens, 1)
        state.record_metrics(
            {
                "diloco/round": self.syncs,
                "diloco/fragment": -1 if record.fragment is None else record.fragment,
                "diloco/pseudo_grad_norm": record.norm,
                "diloco/bytes_per_sync": sent,
                "diloco/sync_seconds": self._sync_seconds,
                "diloco/bytes_per_token": self.bytes_sent / tokens,
                "diloco/dp_bytes_per_token": self.dp_bytes / tokens,
            }
        )
        state.log_now()

    def _record_losses(self, state: TrainingState) -> None:
        """Each replica's last step loss (real replicas: averaged over its ranks, one small all-gather)."""
        if not self.simulated:
            self._losses = self._replica_losses(state.local_step_loss)
        state.record_metrics({f"diloco/replica_{r}_loss": loss for r, loss in sorted(self._losses.items())})

    def _replica_losses(self, step_loss: torch.Tensor) -> dict[int, torch.Tensor]:
        if self.settings.fault_tolerant:
            return {self.settings.torchft.group: step_loss}
        if self.settings.replicas == 1 or not dist.is_initialized():
            return {0: step_loss}
        everyone = [torch.zeros_like(step_loss) for _ in range(dist.get_world_size())]
        dist.all_gather(everyone, step_loss.contiguous())
        per_replica = torch.stack(everyone).reshape(self.settings.replicas, -1).mean(1)
        return dict(enumerate(per_replica))

    # ------------------------------------------------------------------ checkpoints
    def _rank_state(self) -> dict[str, Any]:
        return {"sync": self._sync.state_dict(), "replicas": self._replicas.state_dict()}

    def _restore(self, state: dict[str, Any]) -> None:
        self._sync.load_state_dict(state["sync"])
        self._replicas.load_state_dict(state["replicas"])

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        if self._sync is None:
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

    def _run_counters(self) -> dict[str, float]:
        """Counters of the run as a whole, the same in every replica group."""
        return {"syncs": self.syncs, "bytes_sent": self.bytes_sent, "dp_bytes": self.dp_bytes}

    def _load_run_counters(self, counters: dict[str, float]) -> None:
        self.syncs, self.bytes_sent, self.dp_bytes = counters["syncs"], counters["bytes_sent"], counters["dp_bytes"]

    def state_dict(self) -> dict[str, Any]:
        """For this group's checkpoint: the run's counters and the group's own."""
        own = {
            "discarded_rounds": self._sync.discarded if self._sync is not None else self._discarded,
            "skipped_steps": self._skipped_steps,
        }
        if self._groups is not None:
            own["torchft"] = self._groups.state_dict()
        elif self._groups_state is not None:  # resumed at its end: the step it had
            own["torchft"] = self._groups_state
        return {**self._run_counters(), **own}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._load_run_counters(state_dict)
        self._discarded = state_dict.get("discarded_rounds", 0)  # checkpoints before it was kept: 0
        self._skipped_steps = state_dict.get("skipped_steps", 0)
        self._groups_state = state_dict.get("torchft")

"""Adaptive batch size (Lau, Liu, Kolar 2024): grow the global batch when gradient noise says so.

At a tested step the gradient is split into n samples (``gradient_samples.py``), and the
chosen test (``noise_tests.py``) gives the batch at which it would just hold. If that is
larger than the current batch, the callback asks for it; the training state rounds it up
to a multiple of micro_batch x data-parallel ranks, caps it, and applies it from the next
global step. The batch never shrinks.

Under DiLoCo every replica tests its own gradient (its own micro-step samples: a real
replica's ranks, or a simulated replica's turn), and the replicas agree on the largest
proposal: the batch at which every replica's test holds. A replica's proposal is for its
own share, so it is scaled by global batch / the replica's batch.

Logged at every test (``adaptive_bs/``): the per-sequence gradient variance tr(Sigma), the
squared gradient norm, the noise scale B_simple = tr(Sigma) / ||g||^2, the proposed and
the applied global batch (inner-product tests add their two variances). A tested step
reads its statistics on the host once, to decide: at its own end, which waits for its
backward and the sums' reductions, or, with ``read_next_step``, at the end of the next
step, when they are long done, so no step waits (the batch then grows one step later, and
the statistics are logged in the row of the step that read them).

Memory: the norm test keeps no extra copy of the gradient; the inner-product tests with
``samples=micro_batch`` keep one copy of this rank's gradient shard per micro-step of the
accumulation.
"""

import logging
import math
from typing import Any

import lightning as L
import torch
import torch.distributed as dist

from callbacks.batch_size.adaptive_settings import AdaptiveBatchSettings
from callbacks.batch_size.gradient_samples import MicroStepSamples, RankSamples
from callbacks.batch_size.lr_scaling import LRScaling
from callbacks.batch_size.noise_tests import (
    PendingSums,
    SampleSums,
    gradient_variance,
    inner_product_variance,
    noise_scale,
    orthogonal_variance,
    required_batch,
)
from lightning_modules.sharded_sums import fsdp1_shard_groups
from lightning_modules.step_callback import StepCallback
from lightning_modules.training_state import TrainingState

log = logging.getLogger(__name__)


class AdaptiveBatchSize(StepCallback):
    """Runs the configured test and asks for the batch it wants (settings: ``AdaptiveBatchSettings``)."""

    def __init__(self, settings: AdaptiveBatchSettings, sample_kind: str, lr_scaling: LRScaling | None) -> None:
        self.settings, self.sample_kind, self.lr_scaling = settings, sample_kind, lr_scaling
        self.tests_done = 0
        self.last: dict[str, float] = {}
        self._micro: MicroStepSamples | None = None
        self._ranks: RankSamples | None = None
        self._testing = False
        self._proposal = 0
        self._capped = False  # the cap line is said once
        self._unread: PendingSums | None = None  # this step's sums (read_next_step)
        self._ready: PendingSums | None = None  # the previous tested step's, read at this step's end

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        state: TrainingState = pl_module.training_state
        if self.lr_scaling is not None:
            state.set_lr_scaling(self.lr_scaling)
        keep = self.settings.test != "norm"
        if self.sample_kind == "rank":
            self._ranks = RankSamples(trainer.strategy.model, keep, state.device)
        else:
            parameters = list(state.model.parameters())
            groups = fsdp1_shard_groups(trainer)
            self._micro = MicroStepSamples(parameters, groups, keep, state.device, state.pipeline_group)
        if state.clock.steps == 0 and self.settings.min_global_batch_size:
            state.request_global_batch(self.settings.min_global_batch_size)

    # ------------------------------------------------------------------ step hooks
    def on_step_start(self, state: TrainingState) -> None:
        self._testing = state.global_steps % self.settings.every_n_steps == 0
        if state.at_global_step_start:
            self._proposal = 0
        if self._ranks is not None:
            self._ranks.active = self._testing
            self._ranks.start()
        if self._micro is not None:
            self._micro.start()  # a run resumed mid-step redoes the whole step

    def needs_micro_step_gradients(self, state: TrainingState) -> bool:
        return self._testing and self._micro is not None

    def on_micro_batch_end(self, state: TrainingState) -> None:
        if not self._testing:
            return
        batch = state.global_batch
        if self._micro is not None:
            self._micro.add_micro_step(batch.accumulation, last=state.is_last_micro_batch)
            if state.is_last_micro_batch:
                sample_size = batch.micro_batch_size * state.gradient_group_size
                self._finished(state, self._micro.finish(batch.accumulation, sample_size))
        elif state.is_last_micro_batch:
            sample_size = batch.micro_batch_size * batch.accumulation
            self._finished(state, self._ranks.finish(list(state.model.parameters()), sample_size))

    def _finished(self, state: TrainingState, sums: PendingSums) -> None:
        """A tested step's sums: proposed from now, or kept to be read a step later."""
        if self.settings.read_next_step:
            self._unread = sums
        else:
            self._propose(state, sums.read())

    def on_step_end(self, state: TrainingState) -> None:
        if self.settings.read_next_step:
            if self._ready is not None:
                self._propose(state, self._ready.read())
                self._decide(state)
            self._ready, self._unread = self._unread, None
        elif self._testing and state.at_global_step_end:
            self._decide(state)

    # ------------------------------------------------------------------ the decision
    def _propose(self, state: TrainingState, sums: SampleSums) -> None:
        """This replica's proposal for the global batch, and the statistics behind it."""
        replicas = state.global_batch.size / (sums.n * sums.sample_size)  # that share the global batch
        required = required_batch(sums, self.settings.test, self.settings.eta, self.settings.theta, self.settings.nu)
        self._proposal = max(self._proposal, math.ceil(required * replicas))
        self.last = {
            "adaptive_bs/variance": gradient_variance(sums),
            "adaptive_bs/grad_sq_norm": sums.g_sq,
            "adaptive_bs/noise_scale": noise_scale(sums),
        }
        if sums.dot_sum is not None:
            self.last["adaptive_bs/inner_product_variance"] = inner_product_variance(sums)
            self.last["adaptive_bs/orthogonal_variance"] = orthogonal_variance(sums)

    def _decide(self, state: TrainingState) -> None:
        """Agree on the largest proposal over replicas, ask for it (never smaller), and log."""
        current, asked = state.global_batch.size, self._agreed(self._proposal, state.device)
        proposed = max(current, asked)
        if self.settings.max_global_batch_size is not None:
            proposed = min(proposed, max(current, self.settings.max_global_batch_size))
        applied = state.request_global_batch(proposed) if proposed > current else current
        self._say_if_capped(state, asked, applied)
        self.tests_done += 1
        self.last.update({"adaptive_bs/proposed_batch": float(proposed), "adaptive_bs/applied_batch": float(applied)})
        state.record_metrics(self.last)
        state.log_now()

    def _say_if_capped(self, state: TrainingState, asked: int, applied: int) -> None:
        """One INFO line the first time the batch stops at its cap while the test asks for more."""
        caps = [c for c in (self.settings.max_global_batch_size, state.global_batch.max_size) if c is not None]
        if self._capped or not caps or asked <= applied or applied < min(caps):
            return
        self._capped = True
        log.info(
            "adaptive batch reached its cap of %d at step %d: the %s test asks for %s",
            applied,
            state.clock.steps,
            self.settings.test.replace("_", " "),
            f"{asked:,}",
        )

    @staticmethod
    def _agreed(proposal: int, device: torch.device) -> int:
        """The largest proposal over all ranks (they differ only between DiLoCo replicas)."""
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return proposal
        value = torch.tensor([proposal], dtype=torch.int64, device=device)
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return int(value.item())

    def state_dict(self) -> dict[str, Any]:
        """With ``read_next_step``, the sums still to be read (a resumed run reads them at the
        end of its first step, as the run would have)."""
        ready = self._ready
        unread = (
            None if ready is None else {"n": ready.n, "sample_size": ready.sample_size, "totals": ready.totals.cpu()}
        )
        return {"tests_done": self.tests_done, "last": dict(self.last), "unread": unread}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.tests_done, self.last = state_dict["tests_done"], dict(state_dict["last"])
        unread = state_dict.get("unread")
        self._ready = None if unread is None else PendingSums(**unread)

"""Adaptive batch size (Lau, Liu, Kolar 2024): grow the global batch when gradient noise says so.

At a tested step the gradient is split into n samples (``callbacks/gradient_samples.py``),
and the chosen test (``callbacks/batch_size_tests.py``) gives the batch at which it would
just hold. If that is larger than the current batch, the callback asks the training
module for it; the module rounds it up to a multiple of micro_batch x data-parallel ranks,
caps it, and applies it from the next optimizer step. The batch never shrinks.

Logged at every test (``adaptive_bs/``): the per-sequence gradient variance tr(Sigma), the
squared gradient norm, the noise scale B_simple = tr(Sigma) / ||g||^2, the proposed and
the applied global batch (inner-product tests add their two variances).

Memory: the norm test keeps one extra copy of this rank's gradient shard during tested
steps with ``samples=micro_batch`` and none with ``samples=rank``; the inner-product tests
with ``samples=micro_batch`` keep one copy per micro-step of the accumulation.
"""

import math
from typing import Any

import lightning as L
import torch
from lightning.pytorch.strategies import DDPStrategy

from callbacks.batch_size_tests import (
    TESTS,
    SampleSums,
    gradient_variance,
    inner_product_variance,
    noise_scale,
    orthogonal_variance,
    required_batch,
)
from callbacks.gradient_samples import MicroStepSamples, RankSamples
from lightning_modules.global_batch import BatchConfigError, GlobalBatch, check_single_controller
from lightning_modules.sharded_sums import fsdp1_shard_groups

SAMPLES = ("auto", "micro_batch", "rank")
KEY = "callbacks.adaptive_batch"


class AdaptiveBatchSize(L.Callback):
    """Args:
    test: ``norm``, ``inner_product`` or ``augmented_inner_product``.
    eta, theta, nu: the tests' tolerances (norm; inner product; orthogonality).
    every_n_steps: test every this many optimizer steps (the first step is always tested).
    min_global_batch_size: the batch the run starts at (null: ``batch.global_batch_size``);
        since the batch only grows it is also the smallest.
    max_global_batch_size: the largest batch the test may ask for (null: no cap beyond
        ``batch.max_global_batch_size``).
    samples: ``micro_batch``, ``rank`` or ``auto`` (ranks under DDP, else micro-batches);
        see ``callbacks/gradient_samples.py``.
    """

    controls_global_batch = True

    def __init__(
        self,
        test: str = "norm",
        eta: float = 0.1,
        theta: float = 0.1,
        nu: float = 0.1,
        every_n_steps: int = 1,
        min_global_batch_size: int | None = None,
        max_global_batch_size: int | None = None,
        samples: str = "auto",
    ) -> None:
        if test not in TESTS:
            raise ValueError(f"{KEY}.test={test!r} is unknown; choose one of {TESTS}.")
        if samples not in SAMPLES:
            raise ValueError(f"{KEY}.samples={samples!r} is unknown; choose one of {SAMPLES}.")
        for name, value in (("eta", eta), ("theta", theta), ("nu", nu)):
            if value <= 0:
                raise ValueError(f"{KEY}.{name}={value} must be > 0.")
        if every_n_steps < 1:
            raise ValueError(f"{KEY}.every_n_steps={every_n_steps} must be >= 1.")
        if min_global_batch_size and max_global_batch_size and min_global_batch_size > max_global_batch_size:
            raise ValueError(
                f"{KEY}.min_global_batch_size={min_global_batch_size} exceeds"
                f" max_global_batch_size={max_global_batch_size}."
            )
        self.test, self.eta, self.theta, self.nu = test, eta, theta, nu
        self.every_n_steps, self.samples = every_n_steps, samples
        self.min_global_batch_size, self.max_global_batch_size = min_global_batch_size, max_global_batch_size
        self.tests_done = 0
        self.last: dict[str, float] = {}
        self._micro: MicroStepSamples | None = None
        self._ranks: RankSamples | None = None
        self._testing = False
        self._kind = "micro_batch"

    # ------------------------------------------------------------------ setup and checks
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Reject impossible settings before the model is built or any process trains."""
        check_single_controller(trainer.callbacks)
        self._kind = self._sample_kind(isinstance(trainer.strategy, DDPStrategy))
        self._check_sizes(GlobalBatch(pl_module.batch_config, trainer.world_size))

    def _sample_kind(self, ddp: bool) -> str:
        if self.samples == "auto":
            return "rank" if ddp else "micro_batch"
        if ddp and self.samples == "micro_batch":
            raise BatchConfigError(
                f"{KEY}.samples=micro_batch is not available under DDP: a micro-step's gradient over all"
                " ranks would need an extra full-size all-reduce. Use samples=rank (or auto)."
            )
        if not ddp and self.samples == "rank":
            raise BatchConfigError(
                f"{KEY}.samples=rank needs strategy=ddp: one device has one rank, and FSDP never"
                " materializes a rank's whole gradient. Use samples=micro_batch (or auto)."
            )
        return self.samples

    def _check_sizes(self, batch: GlobalBatch) -> None:
        start = self.min_global_batch_size or batch.size
        for name, size in (("min_global_batch_size", start), ("max_global_batch_size", self.max_global_batch_size)):
            if size is not None and batch.valid_size(size) != size:
                raise BatchConfigError(
                    f"{KEY}.{name}={size} must be a multiple of micro_batch x ranks = {batch.granularity}"
                    f" (and within batch.max_global_batch_size); try {batch.valid_size(size)}."
                )
        if self._kind == "rank" and batch.data_parallel_size < 2:
            raise BatchConfigError(f"{KEY}.samples=rank needs >= 2 data-parallel ranks; this run has 1.")
        if self._kind == "micro_batch" and start // batch.granularity < 2:
            raise BatchConfigError(
                f"{KEY}: the starting global batch {start} is {start // batch.granularity} micro-step(s) of"
                f" micro_batch x ranks = {batch.granularity}; the test needs >= 2 samples. Start at"
                f" {2 * batch.granularity} or lower batch.micro_batch_size."
            )

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        keep = self.test != "norm"
        if self._kind == "rank":
            self._ranks = RankSamples(trainer.strategy.model, keep, pl_module.device)
        else:
            parameters = list(pl_module.model.parameters())
            self._micro = MicroStepSamples(parameters, fsdp1_shard_groups(trainer), keep, pl_module.device)
        if pl_module.clock.steps == 0 and self.min_global_batch_size:
            pl_module.global_batch.request(self.min_global_batch_size)

    # ------------------------------------------------------------------ per micro-batch
    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int) -> None:
        if pl_module.at_step_boundary:
            self._testing = pl_module.clock.steps % self.every_n_steps == 0
            if self._ranks is not None:
                self._ranks.active = self._testing
                self._ranks.start()
            if self._micro is not None:
                self._micro.start()  # a run resumed mid-step redoes the whole step

    def on_after_backward(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self._testing:
            return
        batch = pl_module.global_batch
        last = pl_module.micro_index == batch.accumulation - 1
        if self._micro is not None:
            self._micro.add_micro_step(batch.accumulation)
            if last:
                self._decide(pl_module, self._micro.finish(batch.accumulation, batch.granularity))
        elif last:
            sample_size = batch.micro_batch_size * batch.accumulation
            self._decide(pl_module, self._ranks.finish(list(pl_module.model.parameters()), sample_size))

    # ------------------------------------------------------------------ the decision
    def _decide(self, pl_module: L.LightningModule, sums: SampleSums) -> None:
        """Ask for the batch the test wants (never smaller), and log the statistics."""
        current = pl_module.global_batch.size
        proposed = max(current, math.ceil(required_batch(sums, self.test, self.eta, self.theta, self.nu)))
        if self.max_global_batch_size is not None:
            proposed = min(proposed, max(current, self.max_global_batch_size))
        applied = pl_module.global_batch.request(proposed) if proposed > current else current
        self.tests_done += 1
        self.last = {
            "adaptive_bs/variance": gradient_variance(sums),
            "adaptive_bs/grad_sq_norm": sums.g_sq,
            "adaptive_bs/noise_scale": noise_scale(sums),
            "adaptive_bs/proposed_batch": float(proposed),
            "adaptive_bs/applied_batch": float(applied),
        }
        if sums.dot_sum is not None:
            self.last["adaptive_bs/inner_product_variance"] = inner_product_variance(sums)
            self.last["adaptive_bs/orthogonal_variance"] = orthogonal_variance(sums)
        pl_module.step_metrics.update(self.last)
        pl_module.log_this_step = True

    def state_dict(self) -> dict[str, Any]:
        return {"tests_done": self.tests_done, "last": dict(self.last)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.tests_done, self.last = state_dict["tests_done"], dict(state_dict["last"])

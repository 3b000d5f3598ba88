"""Settings of the adaptive batch size (``conf/technique/adaptive_batch.yaml``), checked early.

Torch-free, so a bad setting is reported before the heavy imports, tokenization or any
process start.
"""

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from callbacks.batch_size.lr_scaling import LRScaling, check_lr_scaling, lr_scaling_for
from callbacks.batch_size.noise_tests import TESTS
from callbacks.technique import TechniqueSettings
from common.errors import ConfigError
from settings.run_context import RunContext

if TYPE_CHECKING:
    from callbacks.batch_size.adaptive import AdaptiveBatchSize

SAMPLES = ("auto", "micro_batch", "rank")


@dataclass(kw_only=True)
class AdaptiveBatchSettings(TechniqueSettings):
    """Args:
    test: ``norm``, ``inner_product`` or ``augmented_inner_product``.
    eta, theta, nu: the tests' tolerances (norm; inner product; orthogonality).
    every_n_steps: test every this many global steps (the first step is always tested).
    min_global_batch_size: the batch the run starts at (null: ``batch.global_batch_size``);
        since the batch only grows it is also the smallest.
    max_global_batch_size: the largest batch the test may ask for (null: no cap beyond
        ``batch.max_global_batch_size``).
    samples: ``micro_batch``, ``rank`` or ``auto`` (ranks under DDP, else micro-batches);
        see ``gradient_samples.py``.
    lr_scaling: ``none``, ``sqrt`` or ``linear``: the learning rate follows the batch's
        growth from its starting size (``lr_scaling.py``).
    read_next_step: read a tested step's statistics at the end of the next step, so that
        no step waits for its own backward and reductions (the batch grows a step later).
    """

    key: ClassVar[str] = "technique.adaptive_batch"
    sets_global_batch: ClassVar[bool] = True

    test: str
    eta: float
    theta: float
    nu: float
    every_n_steps: int
    min_global_batch_size: int | None
    max_global_batch_size: int | None
    samples: str
    lr_scaling: str
    read_next_step: bool

    def __post_init__(self) -> None:
        check_lr_scaling(self.key, self.lr_scaling)
        if self.test not in TESTS:
            raise ConfigError(f"{self.key}.test={self.test!r} is unknown; choose one of {TESTS}.")
        if self.samples not in SAMPLES:
            raise ConfigError(f"{self.key}.samples={self.samples!r} is unknown; choose one of {SAMPLES}.")
        for name in ("eta", "theta", "nu"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{self.key}.{name}={getattr(self, name)} must be > 0.")
        if self.every_n_steps < 1:
            raise ConfigError(f"{self.key}.every_n_steps={self.every_n_steps} must be >= 1.")
        low, high = self.min_global_batch_size, self.max_global_batch_size
        if low and high and low > high:
            raise ConfigError(f"{self.key}.min_global_batch_size={low} exceeds max_global_batch_size={high}.")

    def sample_kind(self, strategy: str) -> str:
        """Where the samples come from: ranks under DDP, micro-steps elsewhere."""
        ddp = strategy == "ddp"
        if self.samples == "auto":
            return "rank" if ddp else "micro_batch"
        if ddp and self.samples == "micro_batch":
            raise ConfigError(
                f"{self.key}.samples=micro_batch is not available under DDP: a micro-step's gradient over all"
                " ranks would need an extra full-size all-reduce. Use samples=rank (or auto)."
            )
        if not ddp and self.samples == "rank":
            raise ConfigError(
                f"{self.key}.samples=rank needs strategy=ddp: one device has one rank, and FSDP never"
                " materializes a rank's whole gradient. Use samples=micro_batch (or auto)."
            )
        return self.samples

    def min_accumulation(self, run: RunContext) -> int:
        """Micro-step samples need at least two micro-steps."""
        return 2 if self.sample_kind(run.strategy_name) == "micro_batch" else 1

    def check(self, run: RunContext) -> None:
        if self.read_next_step and run.sequential_replicas > 1:
            raise ConfigError(
                f"{self.key}.read_next_step=true does not compose with simulated DiLoCo replicas (their turns'"
                " proposals are decided together at the end of each global step); set read_next_step=false."
            )
        kind = self.sample_kind(run.strategy_name)
        batch = run.global_batch
        if batch is None:
            return
        start = self.min_global_batch_size or batch.size
        for name, size in (("min_global_batch_size", start), ("max_global_batch_size", self.max_global_batch_size)):
            if size is not None and batch.valid_size(size) != size:
                raise ConfigError(
                    f"{self.key}.{name}={size} must be a multiple of micro_batch x ranks = {batch.granularity}"
                    f" (and within batch.max_global_batch_size); try {batch.valid_size(size)}."
                )
        if kind == "rank" and batch.data_parallel_size < 2:
            raise ConfigError(f"{self.key}.samples=rank needs >= 2 data-parallel ranks; this run has 1.")
        if kind == "micro_batch" and start // batch.granularity < 2:
            key = "micro_batch_size" if run.batch.micro_batch_size else "max_micro_batch_size"
            raise ConfigError(
                f"{self.key}: the starting global batch {start} is {start // batch.granularity} micro-step(s) of"
                f" micro_batch x ranks{' x replicas' if batch.sequential_replicas > 1 else ''} = {batch.granularity};"
                f" the norm test needs >= 2 samples. Start at {2 * batch.granularity} or set"
                f" batch.{key}={max(1, batch.micro_batch_size // 2)}."
            )

    def lr_rule(self, run: RunContext) -> LRScaling | None:
        return lr_scaling_for(self.lr_scaling, self.min_global_batch_size or run.batch.global_batch_size)

    def build(self, run: RunContext) -> "AdaptiveBatchSize":
        from callbacks.batch_size.adaptive import AdaptiveBatchSize

        return AdaptiveBatchSize(self, self.sample_kind(run.strategy_name), self.lr_rule(run))

"""The global batch: sequences per global step, summed over every rank and replica.

    global = micro_batch_size x data-parallel ranks x sequential replicas x accumulation

*Sequential replicas* are replicas that one process trains one after another within a
global step (simulated DiLoCo): each takes its own optimizer step on global / replicas
sequences. The data-parallel ranks include those of other *data groups* (jobs that train
one global batch together, ``common/data_groups.py``). Techniques ask for a new size at any
step boundary; the request is rounded up to a valid multiple, capped, and applied when the
next global step begins, so a global step never changes size halfway.

Torch-free, so that settings are checked before the heavy imports.
"""

import math
from dataclasses import dataclass

from common.errors import CheckpointError, ConfigError
from settings.section import Section


@dataclass(kw_only=True)
class BatchSettings(Section):
    """User settings (``batch`` in ``conf/train.yaml``, where their defaults live).

    ``micro_batch_size`` null picks the largest divisor of each rank's share of the global
    batch that is at most ``max_micro_batch_size`` (see ``micro_batch_size_for``), so
    changing the number of devices or replicas keeps a global batch working.
    """

    key = "batch"

    global_batch_size: int
    micro_batch_size: int | None
    max_micro_batch_size: int
    max_global_batch_size: int | None

    def __post_init__(self) -> None:
        for name in ("global_batch_size", "max_micro_batch_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"batch.{name}={getattr(self, name)} must be >= 1.")
        if self.micro_batch_size is not None and self.micro_batch_size < 1:
            raise ConfigError(f"batch.micro_batch_size={self.micro_batch_size} must be >= 1 (or null: automatic).")
        if self.max_global_batch_size is not None and self.global_batch_size > self.max_global_batch_size:
            raise ConfigError(
                f"batch.global_batch_size={self.global_batch_size} exceeds"
                f" batch.max_global_batch_size={self.max_global_batch_size}."
            )


def micro_batch_size_for(
    config: BatchSettings, data_parallel_size: int, sequential_replicas: int = 1, min_accumulation: int = 1
) -> int:
    """The micro-batch every rank runs: the configured one, or the largest divisor of its share.

    Each rank's share of one global step is global / (ranks x sequential replicas); it must
    be a whole number of sequences, and the micro-batch must divide it. The automatic choice
    also leaves ``min_accumulation`` micro-batches per step where it can (the adaptive batch
    size's samples on one device).
    """
    parts = data_parallel_size * sequential_replicas
    where = f"{data_parallel_size} data-parallel rank(s)" + (
        f" x {sequential_replicas} simulated replicas" if sequential_replicas > 1 else ""
    )
    if config.global_batch_size % parts:
        raise ConfigError(
            f"batch.global_batch_size={config.global_batch_size} does not split evenly over {where};"
            f" set it to a multiple of {parts}, e.g. {math.ceil(config.global_batch_size / parts) * parts}."
        )
    share = config.global_batch_size // parts
    if config.micro_batch_size is None:
        largest = max(1, min(share // min_accumulation, config.max_micro_batch_size))
        return max(d for d in range(1, largest + 1) if share % d == 0)
    if share % config.micro_batch_size:
        raise ConfigError(
            f"batch.micro_batch_size={config.micro_batch_size} does not divide each rank's share of the global"
            f" batch ({config.global_batch_size} over {where} = {share} sequences);"
            " set batch.micro_batch_size=null to choose one automatically, or a divisor of that share."
        )
    return config.micro_batch_size


class GlobalBatch:
    """Current global batch size, a pending request, and the accumulation they imply."""

    def __init__(
        self, config: BatchSettings, micro_batch_size: int, data_parallel_size: int = 1, sequential_replicas: int = 1
    ) -> None:
        self.micro_batch_size = micro_batch_size
        self.data_parallel_size = data_parallel_size
        self.sequential_replicas = sequential_replicas
        self.max_size = config.max_global_batch_size
        self.size = config.global_batch_size
        self._pending: int | None = None

    @property
    def granularity(self) -> int:
        """Sequences one micro-batch on every rank of every replica adds: all sizes are multiples."""
        return self.micro_batch_size * self.data_parallel_size * self.sequential_replicas

    @property
    def accumulation(self) -> int:
        """Micro-batches each rank runs in one optimizer step."""
        return self.size // self.granularity

    @property
    def sequences_per_optimizer_step(self) -> int:
        """Sequences all ranks train on in one optimizer step (one replica's turn when simulated)."""
        return self.size // self.sequential_replicas

    def valid_size(self, requested: int) -> int:
        """Round a requested size up to a multiple of the granularity, then cap it."""
        size = max(1, math.ceil(requested / self.granularity)) * self.granularity
        if self.max_size is not None:
            size = min(size, max(self.granularity, self.max_size // self.granularity * self.granularity))
        return size

    def request(self, requested: int) -> int:
        """Ask for a new size from the next global step on; returns the size that will apply."""
        self._pending = self.valid_size(requested)
        return self._pending

    def apply_pending(self) -> None:
        """Called by the training module when a new global step begins."""
        if self._pending is not None:
            self.size, self._pending = self._pending, None

    def state_dict(self) -> dict:
        return {"size": self.size, "pending": self._pending}

    def load_state_dict(self, state: dict) -> None:
        if state["size"] % self.granularity:
            raise CheckpointError(
                f"the checkpoint's global batch {state['size']} is not a multiple of micro_batch x ranks"
                f"{' x replicas' if self.sequential_replicas > 1 else ''} = {self.granularity} of this run;"
                " resume with the checkpoint's batch.micro_batch_size and number of devices."
            )
        self.size, self._pending = state["size"], state["pending"]

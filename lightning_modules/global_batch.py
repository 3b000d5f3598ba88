"""The global batch knob: sequences per optimizer step over all data-parallel ranks.

global = micro_batch_size x data_parallel_size x accumulation. Callbacks ask for a new
size at any optimizer-step boundary; the request is rounded up to a valid multiple,
capped, and applied when the next step begins, so a step never changes size halfway.
"""

import math
from dataclasses import dataclass


class BatchConfigError(ValueError):
    """A global batch setting that cannot be realised with the micro-batch and ranks."""


@dataclass
class BatchConfig:
    """User settings (Hydra group ``batch``)."""

    global_batch_size: int = 32
    micro_batch_size: int = 8
    max_global_batch_size: int | None = None


class GlobalBatch:
    """Current global batch size, pending requests and the accumulation they imply."""

    def __init__(self, config: BatchConfig, data_parallel_size: int = 1) -> None:
        self.micro_batch_size = config.micro_batch_size
        self.data_parallel_size = data_parallel_size
        self.max_size = config.max_global_batch_size
        self._check(config.global_batch_size)
        self.size = config.global_batch_size
        self._pending: int | None = None

    @property
    def granularity(self) -> int:
        """Sequences one micro-batch on every rank adds: every size is a multiple of it."""
        return self.micro_batch_size * self.data_parallel_size

    @property
    def accumulation(self) -> int:
        """Micro-batches each rank runs in the current optimizer step."""
        return self.size // self.granularity

    def _check(self, size: int) -> None:
        if self.micro_batch_size < 1:
            raise BatchConfigError(f"batch.micro_batch_size={self.micro_batch_size} must be >= 1.")
        if size < 1 or size % self.granularity:
            raise BatchConfigError(
                f"batch.global_batch_size={size} is not a multiple of micro_batch_size x data-parallel"
                f" ranks = {self.micro_batch_size} x {self.data_parallel_size} = {self.granularity};"
                f" set it to {max(1, math.ceil(size / self.granularity)) * self.granularity}"
                " or change batch.micro_batch_size."
            )
        if self.max_size is not None and size > self.max_size:
            raise BatchConfigError(
                f"batch.global_batch_size={size} exceeds batch.max_global_batch_size={self.max_size}."
            )

    def valid_size(self, requested: int) -> int:
        """Round a requested size up to a multiple of the granularity, then cap it."""
        size = max(1, math.ceil(requested / self.granularity)) * self.granularity
        if self.max_size is not None:
            size = min(size, self.max_size // self.granularity * self.granularity)
        return size

    def request(self, requested: int) -> int:
        """Ask for a new size from the next optimizer step on; returns the size that will apply."""
        self._pending = self.valid_size(requested)
        return self._pending

    def apply_pending(self) -> None:
        """Called by the training module when a new optimizer step begins."""
        if self._pending is not None:
            self.size, self._pending = self._pending, None

    def state_dict(self) -> dict:
        return {"size": self.size, "pending": self._pending}

    def load_state_dict(self, state: dict) -> None:
        self.size, self._pending = state["size"], state["pending"]
        self._check(self.size)


def check_single_controller(callbacks: list) -> None:
    """Two callbacks setting the batch would overwrite each other's requests every step."""
    controllers = [type(cb).__name__ for cb in callbacks if getattr(cb, "controls_global_batch", False)]
    if len(controllers) > 1:
        raise BatchConfigError(f"only one callback may set the global batch, but these all do: {', '.join(controllers)}.")

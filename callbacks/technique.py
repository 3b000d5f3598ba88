"""Technique settings: what a technique's config file holds, checked before any work is done.

Every technique is switched on by one config file, ``conf/technique/NAME.yaml``, whose
node ``technique.NAME`` names a ``TechniqueSettings`` subclass in ``_target_`` and lists
every setting with its default (the YAML file is the one source of defaults). ``train.py``
turns each node into its settings class (types and unknown keys checked), calls
``check(run)`` against the rest of the run, all before the heavy imports, tokenization or
any process start, and only then ``build(run)`` the callback.

This module and the settings modules stay free of torch and Lightning, so that a config
error appears within a second or two.
"""

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from common.data_groups import DataGroups
from lightning_modules.global_batch import BatchConfig, GlobalBatch
from lightning_modules.lr_schedule import LRScheduleConfig

if TYPE_CHECKING:
    from lightning_modules.step_callback import StepCallback

STRATEGIES = ("single_device", "ddp", "fsdp", "fsdp2")


@dataclass(frozen=True, kw_only=True)
class RunContext:
    """The run as far as techniques need to check their settings against it.

    ``world_size`` is None when the config does not state it as numbers (``devices: auto``);
    checks that need it run again once the Trainer has counted the processes.
    """

    world_size: int | None
    strategy: str
    accelerator: str
    batch: BatchConfig
    token_budget: int | None
    lr_schedule: LRScheduleConfig
    max_steps: int
    seq_len: int
    save_distributed_checkpoint: bool
    n_layers: int
    sequential_replicas: int = 1
    #: The jobs this one shares the global batch and data with (torchft replica groups).
    data_groups: DataGroups = DataGroups()
    #: The micro-batch every rank runs; None while the process count is unknown.
    micro_batch_size: int | None = None
    #: The resolved config less its per-job keys, as (key, value) pairs: what jobs that train
    #: one model together must agree on (``launch/shared_settings.py``).
    shared_settings: tuple[tuple[str, str], ...] = ()

    def global_batch(self) -> GlobalBatch | None:
        """The global batch arithmetic of this run (None while the process count is unknown)."""
        if self.micro_batch_size is None or self.world_size is None:
            return None
        ranks = self.data_groups.data_parallel_size(self.world_size)
        return GlobalBatch(self.batch, self.micro_batch_size, ranks, self.sequential_replicas)


@dataclass(kw_only=True)
class TechniqueSettings(ABC):
    """Base of every technique's settings (one dataclass per technique, no defaults here)."""

    #: The settings' path in the config, for messages: ``technique.NAME``.
    key: ClassVar[str] = "technique"
    #: True for techniques that set the global batch: at most one may be on.
    sets_global_batch: ClassVar[bool] = False

    def check(self, run: RunContext) -> None:
        """Raise ``ConfigError`` (naming ``self.key`` settings and the fix) if they cannot work in ``run``."""

    def sequential_replicas(self, run: RunContext) -> int:
        """Optimizer steps one process takes per global step (simulated DiLoCo replicas), else 1."""
        return 1

    def check_services(self) -> None:
        """Raise ``ConfigError`` if what the technique needs outside this process cannot be
        reached (a torchft lighthouse). Called as a run starts, before any logger, and not when
        settings alone are checked (documented commands name hosts that are not up)."""

    def data_groups(self) -> DataGroups:
        """The jobs this run shares its global batch and data with (torchft DiLoCo groups)."""
        return DataGroups()

    def min_accumulation(self, run: RunContext) -> int:
        """Micro-batches per optimizer step the technique needs, for the automatic micro-batch."""
        return 1

    @abstractmethod
    def build(self, run: RunContext) -> "StepCallback":
        """The callback that carries out the technique (imported here, not at module level)."""

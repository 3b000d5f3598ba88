"""Technique settings: what a technique's config file holds, checked before any work is done.

Every technique is switched on by one config file, ``conf/technique/NAME.yaml``, whose
node ``technique.NAME`` names a ``TechniqueSettings`` subclass in ``_target_`` and lists
every setting with its default (the YAML file is the one source of defaults). The run's
settings turn each node into its settings class (types and unknown keys checked); its
two check phases are every section's (``settings/section.py``): ``check(run)`` against the
rest of the run, before the heavy imports, tokenization or any process start, and
``check_services(run)`` (a torchft lighthouse reachable) as the run starts, before any
logger. Only then is the callback built with ``build(run)``.

This module and the settings modules import neither torch nor Lightning (a method that
needs them imports them inside it), so that a config error appears within about a second;
``tests/test_layers.py`` holds them to it.
"""

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from common.data_groups import DataGroups
from common.errors import ConfigError
from settings.run_context import RunContext
from settings.section import Section

if TYPE_CHECKING:
    from lightning_modules.step_callback import StepCallback


def refuse_pipeline(
    key: str, run: RunContext, why: str, fix: str = "set strategy.pipeline_parallel_size=1, or leave it out"
) -> None:
    """A technique (or one of its settings) that does not compose with pipeline parallelism
    says so in one line: why, and the fix."""
    if run.pipeline_parallel_size > 1:
        raise ConfigError(
            f"{key} does not compose with strategy.pipeline_parallel_size={run.pipeline_parallel_size}: {why}; {fix}."
        )


@dataclass(kw_only=True)
class TechniqueSettings(Section, ABC):
    """Base of every technique's settings (one dataclass per technique, no defaults here)."""

    #: The settings' path in the config, for messages: ``technique.NAME``.
    key: ClassVar[str] = "technique"
    #: True for techniques that set the global batch: at most one may be on.
    sets_global_batch: ClassVar[bool] = False

    def sequential_replicas(self, run: RunContext) -> int:
        """Optimizer steps one process takes per global step (simulated DiLoCo replicas), else 1."""
        return 1

    def data_groups(self) -> DataGroups:
        """The jobs this run shares its global batch and data with (torchft DiLoCo groups)."""
        return DataGroups()

    def min_accumulation(self, run: RunContext) -> int:
        """Micro-batches per optimizer step the technique needs, for the automatic micro-batch."""
        return 1

    @abstractmethod
    def build(self, run: RunContext) -> "StepCallback":
        """The callback that carries out the technique (imported here, not at module level)."""

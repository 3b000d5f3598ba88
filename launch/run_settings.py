"""The run's settings as one frozen tree of sections, and the two check phases over it.

``launch/from_config.py`` builds the tree from the composed config (the one reader of
it); every other component reads typed fields from the tree. The tree derives the
``RunContext`` the sections check against (the process count, the micro-batch, what the
techniques ask of the batch) and runs each phase over every section in one loop:
``check`` as the tree is assembled, ``check_services`` as a run starts
(``launch/training.py``).
"""

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from callbacks.technique import TechniqueSettings
from common.data_groups import DataGroups
from common.errors import ConfigError
from data.settings import DataSettings
from lightning_modules.global_batch import BatchSettings, GlobalBatch, micro_batch_size_for
from lightning_modules.layout_settings import LayoutSettings
from lightning_modules.llama_settings import LlamaSettings
from lightning_modules.lr_schedule import LRScheduleSettings
from lightning_modules.optimizers.settings import OptimizerSettings
from settings.callbacks import CallbackSettings
from settings.job import JobSettings
from settings.loggers import LoggerSettings
from settings.run_context import RunContext
from settings.section import Section
from settings.strategy import StrategySettings
from settings.trainer import TrainerSettings


@dataclass(frozen=True, kw_only=True)
class RunSettings:
    """Every section of a run, typed and checked, and the run they make together (``run``)."""

    job: JobSettings
    model: LlamaSettings
    data: DataSettings
    batch: BatchSettings
    optimizer: OptimizerSettings
    lr_schedule: LRScheduleSettings
    layout: LayoutSettings
    strategy: StrategySettings
    trainer: TrainerSettings
    logger: LoggerSettings
    callbacks: CallbackSettings
    #: ``technique.NAME`` sections, in config order.
    techniques: dict[str, TechniqueSettings]
    #: The resolved config less its per-job keys (``RunContext.shared_settings``).
    shared_settings: tuple[tuple[str, str], ...]
    run: RunContext

    def sections(self) -> list[Section]:
        """Every section, in the order their checks run (a run with several mistakes reports
        the first): where training stops, the strategy and layout, then the rest."""
        return [
            self.job,
            self.lr_schedule,
            self.strategy,
            self.layout,
            self.trainer,
            self.optimizer,
            *self.techniques.values(),
            self.batch,
            self.data,
            self.logger,
            self.callbacks,
            self.model,
        ]

    def check(self) -> None:
        """The settings against each other (cheap; before anything is written)."""
        setters = [f"technique.{name}" for name, technique in self.techniques.items() if technique.sets_global_batch]
        if len(setters) > 1:
            raise ConfigError(
                f"only one technique may set the global batch, but {' and '.join(setters)} both do; keep one of them."
            )
        for section in self.sections():
            section.check(self.run)

    def check_services(self, tokenizer_vocab_size: Callable[[], int]) -> None:
        """What the settings need of this machine and beyond it, as the run starts."""
        run = self.services_run(tokenizer_vocab_size)
        for section in self.sections():
            section.check_services(run)

    def services_run(self, tokenizer_vocab_size: Callable[[], int]) -> RunContext:
        """The run as the services phase sees it: with the tokenizer's size (built on first call)."""
        return dataclasses.replace(self.run, tokenizer_vocab_size=tokenizer_vocab_size)

    def for_processes(self, processes: int) -> "RunSettings":
        """The settings for the process count the Trainer found (``devices: auto``), checked again."""
        if processes == self.run.world_size:
            return self
        return assemble(
            **{field.name: getattr(self, field.name) for field in dataclasses.fields(self) if field.name != "run"},
            processes=processes,
        )

    def resuming_from(self, checkpoint: str) -> "RunSettings":
        """The same run, started from ``checkpoint`` (a sweep job continuing an interrupted run)."""
        return dataclasses.replace(self, job=dataclasses.replace(self.job, ckpt_path=checkpoint))

    @property
    def batch_scheduled(self) -> bool:
        """Whether a technique sets the global batch (a resumed run keeps the checkpoint's)."""
        return any(technique.sets_global_batch for technique in self.techniques.values())


def assemble(*, processes: int | None, **sections) -> RunSettings:
    """The tree from its sections, with the run they make for ``processes`` (None: as the
    trainer states it), checked."""
    trainer, techniques, batch = sections["trainer"], sections["techniques"], sections["batch"]
    run = RunContext(
        world_size=processes or trainer.stated_processes(),
        nodes=trainer.nodes,
        strategy_name=sections["strategy"].name,
        accelerator=trainer.accelerator,
        precision=trainer.precision,
        model=sections["model"],
        optimizer_kind=sections["optimizer"].kind,
        batch=batch,
        token_budget=sections["job"].token_budget,
        lr_schedule=sections["lr_schedule"],
        max_steps=trainer.max_steps,
        seq_len=sections["data"].seq_len,
        save_distributed_checkpoint=sections["strategy"].save_distributed_checkpoint,
        tensor_parallel_size=sections["strategy"].tensor_parallel_size,
        pipeline_parallel_size=sections["strategy"].pipeline_parallel_size,
        sequence_shards=sections["strategy"].tensor_parallel_size if sections["layout"].sequence_parallel else 1,
        shared_settings=sections["shared_settings"],
    )
    replicas = max([technique.sequential_replicas(run) for technique in techniques.values()], default=1)
    # a pipeline needs a micro-batch per rank in flight (fewer leave ranks idle: refused by the layout's check)
    accumulation = max(
        [run.pipeline_parallel_size, *(technique.min_accumulation(run) for technique in techniques.values())]
    )
    groups = max(
        [technique.data_groups() for technique in techniques.values()], key=lambda g: g.count, default=DataGroups()
    )
    model_parallel = run.pipeline_parallel_size * run.tensor_parallel_size  # ranks that read the same rows
    groups = dataclasses.replace(groups, model_parallel=model_parallel)
    # (a process count the model-parallel sizes do not divide is refused by the strategy's check)
    whole = run.world_size and run.world_size % model_parallel == 0
    ranks = groups.data_parallel_size(run.world_size) if whole else None
    micro = micro_batch_size_for(batch, ranks, replicas, accumulation) if ranks else None
    batches = GlobalBatch(batch, micro, ranks, replicas) if micro is not None else None
    run = dataclasses.replace(
        run, sequential_replicas=replicas, data_groups=groups, micro_batch_size=micro, global_batch=batches
    )
    settings = RunSettings(**sections, run=run)
    settings.check()
    return settings

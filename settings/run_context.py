"""What a section's checks see of the rest of the run: ``RunContext``.

The protocol layer imports no domain package: the model, batch and schedule sections it
carries are built by the assembly (``launch/run_settings.py``), which also derives the
global batch, so their types are named here for readers and type checkers only.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from common.data_groups import DataGroups

if TYPE_CHECKING:
    from lightning_modules.global_batch import BatchSettings, GlobalBatch
    from lightning_modules.llama_settings import LlamaSettings
    from lightning_modules.lr_schedule import LRScheduleSettings


@dataclass(frozen=True, kw_only=True)
class RunContext:
    """The run as far as a section needs to check its settings against the others.

    ``world_size`` is None when the config does not state it as numbers (``devices: auto``);
    the checks run again once the Trainer has counted the processes.
    """

    world_size: int | None
    #: The nodes the processes are spread over (``trainer.num_nodes``), each running as many.
    nodes: int = 1
    #: The ``strategy`` config choice's name (``single_device``, ``ddp``, ``fsdp``, ``fsdp2``).
    strategy_name: str
    accelerator: str
    precision: str
    model: "LlamaSettings"
    #: The optimizer's ``kind`` (``adamw``, ``muon``), as checkpoints record it.
    optimizer_kind: str
    batch: "BatchSettings"
    token_budget: int | None
    lr_schedule: "LRScheduleSettings"
    max_steps: int
    seq_len: int
    save_distributed_checkpoint: bool
    #: Ranks each block is split over (``strategy.tensor_parallel_size``); they see the same data.
    tensor_parallel_size: int = 1
    #: Stages the blocks are split into, on successive ranks (``strategy.pipeline_parallel_size``); they see the same data.
    pipeline_parallel_size: int = 1
    #: The parts each row's sequence is split into: T under sequence parallelism, else 1.
    sequence_shards: int = 1
    sequential_replicas: int = 1
    #: The jobs this one shares the global batch and data with (torchft replica groups).
    data_groups: DataGroups = DataGroups()
    #: The micro-batch every rank runs; None while the process count is unknown.
    micro_batch_size: int | None = None
    #: The global batch arithmetic of this run; None while the process count is unknown.
    global_batch: "GlobalBatch | None" = None
    #: The resolved config less its per-job keys, as (key, value) pairs: what jobs that train
    #: one model together must agree on (``launch/from_config.py``).
    shared_settings: tuple[tuple[str, str], ...] = ()
    #: The tokenizer's size, in the services phase only: the tokenizer is built on the first
    #: call (a ``bpe`` one is trained), so only a check that needs it calls it.
    tokenizer_vocab_size: Callable[[], int] | None = None

    @property
    def n_layers(self) -> int:
        return self.model.n_layers

    def model_with_vocab(self) -> "LlamaSettings":
        """The model with its vocabulary filled in from the tokenizer (services phase only)."""
        if self.tokenizer_vocab_size is None:
            raise RuntimeError("the tokenizer's size is known in the services phase only")
        return self.model.with_vocab(self.tokenizer_vocab_size())

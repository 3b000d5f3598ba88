"""The ``strategy`` section: how Lightning spreads the run over processes."""

from dataclasses import dataclass
from typing import Any

from common.errors import ConfigError
from settings.run_context import RunContext
from settings.section import Section

#: The strategies this framework trains with, by the Lightning class a ``conf/strategy/`` file names.
STRATEGY_BY_CLASS = {
    "DDPStrategy": "ddp",
    "FSDPStrategy": "fsdp",
    "ModelParallelStrategy": "fsdp2",
}


@dataclass(frozen=True, kw_only=True)
class StrategySettings(Section):
    """A ``conf/strategy/`` choice: ``name`` (single_device, ddp, fsdp or fsdp2, from its
    ``_target_``) and ``spec``, the node Lightning's strategy is instantiated from (without a
    ``_target_``, ``spec["name"]`` is Lightning's own name for a one-device strategy)."""

    key = "strategy"

    name: str
    spec: dict[str, Any]

    @classmethod
    def from_spec(cls, spec: dict[str, Any]) -> "StrategySettings":
        target = str(spec.get("_target_", ""))
        return cls(name=STRATEGY_BY_CLASS.get(target.rsplit(".", 1)[-1], "single_device"), spec=spec)

    @property
    def save_distributed_checkpoint(self) -> bool:
        return bool(self.spec.get("save_distributed_checkpoint", False))

    def check(self, run: RunContext) -> None:
        if self.name == "fsdp" and run.accelerator == "cpu":
            raise ConfigError("strategy=fsdp (FSDP1) needs GPUs; on CPU use strategy=fsdp2.")
        if self.name == "single_device" and run.world_size is not None and run.world_size > 1:
            raise ConfigError(
                f"trainer.devices x trainer.num_nodes = {run.world_size} processes need a distributed strategy:"
                " add strategy=ddp or strategy=fsdp2."
            )
        if self.spec.get("tensor_parallel_size", 1) != 1:
            raise ConfigError("tensor parallelism is not supported: set strategy.tensor_parallel_size=1.")

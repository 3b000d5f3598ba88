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
#: The model-parallel sizes of ``strategy`` (defaults 1), by what they split.
MODEL_PARALLEL_SIZES = {"tensor_parallel_size": "tensor parallelism", "pipeline_parallel_size": "pipeline parallelism"}


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


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

    def __post_init__(self) -> None:
        """The sizes are checked as the section is built: the assembly divides the process count
        by them before any section's ``check`` runs."""
        for key, what in MODEL_PARALLEL_SIZES.items():
            self._size(key, what)
        data_parallel = self.spec.get("data_parallel_size")
        if data_parallel is not None and not _positive_int(data_parallel):
            raise ConfigError(
                f"strategy.data_parallel_size={data_parallel!r} must be an integer >= 1, or null for every process"
                " the tensor-parallel groups leave."
            )

    def _size(self, key: str, what: str) -> int:
        size = self.spec.get(key, 1)
        if not _positive_int(size):
            raise ConfigError(f"strategy.{key}={size!r} must be an integer >= 1 (1: no {what}).")
        if size > 1 and self.name != "fsdp2":
            raise ConfigError(f"strategy.{key}={size} needs strategy=fsdp2 (ModelParallelStrategy).")
        return size

    @property
    def tensor_parallel_size(self) -> int:
        return self.spec.get("tensor_parallel_size", 1)

    @property
    def pipeline_parallel_size(self) -> int:
        return self.spec.get("pipeline_parallel_size", 1)

    def lightning_spec(self) -> dict[str, Any]:
        """The node Lightning's strategy is built from: the pipeline's size is this framework's
        (the training module builds the stages), not a ModelParallelStrategy argument."""
        return {key: value for key, value in self.spec.items() if key != "pipeline_parallel_size"}

    def check(self, run: RunContext) -> None:
        if self.name == "fsdp" and run.accelerator == "cpu":
            raise ConfigError("strategy=fsdp (FSDP1) needs GPUs; on CPU use strategy=fsdp2.")
        if self.name == "single_device" and run.world_size is not None and run.world_size > 1:
            raise ConfigError(
                f"trainer.devices x trainer.num_nodes = {run.world_size} processes need a distributed strategy:"
                " add strategy=ddp or strategy=fsdp2."
            )
        self._check_tensor_parallel(run)
        self._check_pipeline_parallel(run)
        self._check_nodes(run)
        self._check_data_parallel(run)

    def _check_data_parallel(self, run: RunContext) -> None:
        """Lightning's mesh is data-parallel x tensor-parallel ranks (pipeline stages count as
        data-parallel there: the training module builds them), and must hold every process."""
        size = self.spec.get("data_parallel_size")
        if size is None or run.world_size is None or size * self.tensor_parallel_size == run.world_size:
            return
        raise ConfigError(
            f"strategy.data_parallel_size={size} x strategy.tensor_parallel_size={self.tensor_parallel_size} must equal"
            f" the {run.world_size} processes (trainer.devices x trainer.num_nodes): set strategy.data_parallel_size="
            f"{run.world_size // self.tensor_parallel_size or 1} or null (every process the tensor-parallel groups leave)."
        )

    def _check_tensor_parallel(self, run: RunContext) -> None:
        size = self.tensor_parallel_size
        if size == 1:
            return
        if run.world_size is not None and run.world_size % size:
            raise ConfigError(
                f"strategy.tensor_parallel_size={size} does not divide the {run.world_size} processes"
                " (trainer.devices x trainer.num_nodes): choose a divisor, or change the process count."
            )
        model = run.model
        for name, heads in (("n_heads", model.n_heads), ("n_kv_heads", model.n_kv_heads)):
            if heads % size:
                raise ConfigError(
                    f"strategy.tensor_parallel_size={size} does not divide model.{name}={heads}: each rank holds"
                    f" {name} / {size} heads; choose a divisor of {heads}."
                )
        if model.tie_embeddings:
            raise ConfigError(
                f"strategy.tensor_parallel_size={size} does not compose with model.tie_embeddings=true (the embedding"
                " is split by rows, the output head by columns); set model.tie_embeddings=false or the size to 1."
            )

    def _check_nodes(self, run: RunContext) -> None:
        """A model's ranks (T x P consecutive ranks) lie within one node, or span whole nodes: a
        group that straddles a node boundary for some models and not others is refused."""
        group = self.tensor_parallel_size * self.pipeline_parallel_size
        if run.nodes == 1 or group == 1 or run.world_size is None or run.world_size % run.nodes:
            return
        per_node = run.world_size // run.nodes
        if group % per_node and per_node % group:
            raise ConfigError(
                f"strategy.tensor_parallel_size={self.tensor_parallel_size} x strategy.pipeline_parallel_size="
                f"{self.pipeline_parallel_size} = {group} ranks per model, but each of the {run.nodes} nodes runs"
                f" {per_node} (trainer.devices): some models would straddle two nodes; choose sizes whose product"
                f" divides {per_node} or is a multiple of it."
            )

    def _check_pipeline_parallel(self, run: RunContext) -> None:
        size = self.pipeline_parallel_size
        if size == 1:
            return
        model_parallel = size * self.tensor_parallel_size
        if run.world_size is not None and run.world_size % model_parallel:
            raise ConfigError(
                f"strategy.pipeline_parallel_size={size} x strategy.tensor_parallel_size={self.tensor_parallel_size}"
                f" does not divide the {run.world_size} processes (trainer.devices x trainer.num_nodes): choose sizes"
                " whose product divides them, or change the process count."
            )
        if not self.save_distributed_checkpoint:
            raise ConfigError(
                f"strategy.pipeline_parallel_size={size} needs strategy.save_distributed_checkpoint=true: each rank"
                " holds its stages' weights only, so no rank can gather the whole model into one file."
            )
        if run.model.tie_embeddings:
            raise ConfigError(
                f"strategy.pipeline_parallel_size={size} does not compose with model.tie_embeddings=true (the embedding"
                " lives on the first stage, the output head on the last); set model.tie_embeddings=false."
            )

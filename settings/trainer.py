"""The ``trainer`` section: Lightning's Trainer, and the process count and precision it implies."""

from dataclasses import dataclass
from typing import Any

from common.errors import ConfigError
from common.external_launch import ExternalLaunch, external_launch
from settings.run_context import RunContext
from settings.section import Section
from settings.typed import coerce

FP16_PRECISIONS = ("16-mixed", "16", "16-true")


@dataclass(frozen=True, kw_only=True)
class TrainerSettings(Section):
    """A ``conf/trainer/`` choice: ``spec`` is the node the Trainer is instantiated from; the
    fields are the keys the rest of the run depends on, typed."""

    key = "trainer"

    spec: dict[str, Any]
    accelerator: str
    precision: str
    max_steps: int

    @classmethod
    def from_spec(cls, spec: dict[str, Any]) -> "TrainerSettings":
        return cls(
            spec=spec,
            accelerator=str(spec.get("accelerator", "auto")),
            precision=str(spec.get("precision")),
            max_steps=coerce(spec.get("max_steps", -1), int, "trainer.max_steps"),
        )

    @property
    def nodes(self) -> int:
        nodes = self.spec.get("num_nodes", 1)
        return nodes if isinstance(nodes, int) and not isinstance(nodes, bool) and nodes >= 1 else 1

    def stated_processes(self) -> int | None:
        """Processes the run will use, when the config states it as numbers (not ``devices: auto``)."""
        devices, nodes = self.spec.get("devices"), self.spec.get("num_nodes", 1)
        if isinstance(nodes, int) and isinstance(devices, int) and devices > 0:
            return devices * nodes
        if isinstance(nodes, int) and isinstance(devices, (list, tuple)):
            return len(devices) * nodes
        return None

    def processes(self) -> int:
        """The number of processes the Trainer will start, as Lightning counts ``devices: auto`` / -1."""
        import torch

        stated = self.stated_processes()
        if stated is not None:
            return stated
        gpus = torch.cuda.device_count() if self.accelerator in ("auto", "gpu", "cuda") else 0
        return max(gpus, 1) * self.spec.get("num_nodes", 1)

    def check(self, run: RunContext) -> None:
        if self.precision in FP16_PRECISIONS:
            raise ConfigError(
                f"trainer.precision={self.precision} (fp16) is not supported: use bf16-mixed on GPUs"
                " (trainer=gpu) or 32-true."
            )

    def check_services(self, run: RunContext) -> None:
        """Processes that torchrun or srun started must be the ones the config counts: a
        disagreement is found here, before the process group waits for ranks that never come."""
        launched = external_launch()
        if launched is not None:
            self._check_launched(launched)

    def _check_launched(self, launched: ExternalLaunch) -> None:
        devices, nodes, stated = self.spec.get("devices"), self.spec.get("num_nodes", 1), self.stated_processes()
        per_node = launched.local_world_size
        fix = (
            f"set trainer.num_nodes={launched.world_size // per_node} trainer.devices={per_node} (processes per node)"
            if per_node and launched.world_size % per_node == 0
            else "set trainer.num_nodes and trainer.devices (processes per node) to the launch's"
        )
        if stated is not None and stated != launched.world_size:
            raise ConfigError(
                f"trainer.devices={devices} x trainer.num_nodes={nodes} is {stated} processes, but {launched.launcher}"
                f" started {launched.world_size}: {fix}."
            )
        if per_node is not None and isinstance(devices, int) and devices > 0 and devices != per_node:
            raise ConfigError(
                f"trainer.devices={devices}, but {launched.launcher} started {per_node} processes on this node: {fix}."
            )

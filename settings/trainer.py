"""The ``trainer`` section: Lightning's Trainer, and the process count and precision it implies."""

from dataclasses import dataclass
from typing import Any

from common.errors import ConfigError
from common.external_launch import ExternalLaunch, external_launch
from settings.run_context import RunContext
from settings.section import Section
from settings.typed import coerce

FP16_PRECISIONS = ("16-mixed", "16", "16-true")
# Lightning's precisions this framework trains with (YAML's ``precision: 32`` reads as "32").
PRECISIONS = ("32-true", "bf16-mixed", "bf16-true", "64-true", "32", "bf16", "64")
ACCELERATORS = ("auto", "cpu", "gpu", "cuda", "mps")
# Lightning's loop counters: the smallest value each takes, and what it means there.
COUNTERS = {
    "max_steps": (-1, "-1 stops at the token budget only"),
    "max_epochs": (-1, "-1 for no epoch limit"),
    "num_sanity_val_steps": (-1, "-1 checks every validation batch, 0 none"),
    "log_every_n_steps": (1, "it counts optimizer steps between logged rows"),
    "num_nodes": (1, "it counts the machines the run spans"),
}


@dataclass(frozen=True, kw_only=True)
class TrainerSettings(Section):
    """A ``conf/trainer/`` choice: ``spec`` is the node the Trainer is instantiated from; the
    fields are the keys the rest of the run depends on, typed."""

    key = "trainer"

    spec: dict[str, Any]
    accelerator: str
    precision: str
    max_steps: int
    nodes: int

    @classmethod
    def from_spec(cls, spec: dict[str, Any]) -> "TrainerSettings":
        """The keys the rest of the run reads, and every counter Lightning would otherwise reject
        with a traceback (or divide by) once the run folder exists, checked here."""
        counters = {name: _counter(spec, name, *bound) for name, bound in COUNTERS.items()}
        accelerator = _choice(spec, "accelerator", "auto", ACCELERATORS)
        _check_devices(spec.get("devices", "auto"), accelerator)
        return cls(
            spec=spec,
            accelerator=accelerator,
            precision=str(spec.get("precision")),
            max_steps=counters["max_steps"],
            nodes=counters["num_nodes"],
        )

    def stated_processes(self) -> int | None:
        """Processes the run will use, when the config states it as numbers (not ``devices: auto``)."""
        devices = self.spec.get("devices")
        if isinstance(devices, int) and devices > 0:
            return devices * self.nodes
        if isinstance(devices, (list, tuple)):
            return len(devices) * self.nodes
        return None

    def processes(self) -> int:
        """The number of processes the Trainer will start, as Lightning counts ``devices: auto`` / -1."""
        import torch

        stated = self.stated_processes()
        if stated is not None:
            return stated
        gpus = torch.cuda.device_count() if self.accelerator in ("auto", "gpu", "cuda") else 0
        if gpus == 0 and self.spec.get("devices") == -1:
            raise ConfigError(
                "trainer.devices=-1 means all of a node's GPUs, and this machine has none: give the processes"
                " per node (trainer.devices=1)."
            )
        return max(gpus, 1) * self.nodes

    def check(self, run: RunContext) -> None:
        if self.precision in FP16_PRECISIONS:
            raise ConfigError(
                f"trainer.precision={self.precision} (fp16) is not supported: use bf16-mixed on GPUs"
                " (trainer=gpu) or 32-true."
            )
        if self.precision not in PRECISIONS:
            raise ConfigError(
                f"trainer.precision={self.precision} is not a precision this framework trains with; choose one of"
                f" {', '.join(PRECISIONS[:4])} (bf16-mixed on GPUs: trainer=gpu)."
            )

    def check_services(self, run: RunContext) -> None:
        """Processes that torchrun or srun started must be the ones the config counts: a
        disagreement is found here, before the process group waits for ranks that never come."""
        launched = external_launch()
        if launched is not None:
            self._check_launched(launched)

    def _check_launched(self, launched: ExternalLaunch) -> None:
        devices, nodes, stated = self.spec.get("devices"), self.nodes, self.stated_processes()
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


def _counter(spec: dict[str, Any], name: str, least: int, meaning: str) -> int:
    value = coerce(spec.get(name, least), int, f"trainer.{name}")
    if value < least:
        raise ConfigError(f"trainer.{name}={value} must be at least {least} ({meaning}).")
    return value


def _choice(spec: dict[str, Any], name: str, default: str, choices: tuple[str, ...]) -> str:
    value = str(spec.get(name, default))
    if value not in choices:
        raise ConfigError(f"trainer.{name}={value} is not supported; choose one of {', '.join(choices)}.")
    return value


def _check_devices(devices: Any, accelerator: str) -> None:
    """Lightning's forms: a count, -1 or ``auto`` (all of a node's GPUs), or a list of device
    indices; a CPU run counts its processes, so -1 means nothing there."""
    indices = isinstance(devices, (list, tuple)) and devices and all(_is_int(i) and i >= 0 for i in devices)
    count = _is_int(devices) and (devices >= 1 or (devices == -1 and accelerator != "cpu"))
    if not (indices or count or devices == "auto"):
        raise ConfigError(
            f"trainer.devices={devices} is not a device count: give the processes per node (trainer.devices=2),"
            " auto or -1 for all of a node's GPUs, or a list of GPU indices ([0,1])."
        )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)

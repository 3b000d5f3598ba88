"""The ``callbacks``, ``evaluation`` and ``samples`` sections: the run's infrastructure callbacks."""

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from settings.section import Section
from settings.typed import class_named

if TYPE_CHECKING:
    from settings.run_context import RunContext


@dataclass(frozen=True, kw_only=True)
class CallbackSettings(Section):
    """Each callback of the ``callbacks`` group by name, then evaluation and samples where their
    file names a ``_target_`` (``none`` does not), as the nodes they are instantiated from.
    Each callback checks its own arguments as it is built (before any logger starts)."""

    key = "callbacks"

    specs: dict[str, dict[str, Any]]
    evaluation: dict[str, Any] | None
    samples: dict[str, Any] | None

    def check_services(self, run: "RunContext") -> None:
        """Every ``_target_`` names a class that exists: found here, a typo is one line before
        any logger starts instead of Hydra's traceback after it (importing the callbacks needs
        Lightning, hence this phase)."""
        named = {f"callbacks.{name}": spec for name, spec in self.specs.items()}
        named.update({"evaluation": self.evaluation, "samples": self.samples})
        for key, spec in named.items():
            if spec is not None:
                class_named(
                    spec.get("_target_"),
                    f"{key}._target_",
                    object,
                    "a class that exists",
                    "name it as module.path.ClassName (conf/callbacks/ shows the callbacks' names)",
                )

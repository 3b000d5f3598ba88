"""The ``callbacks``, ``evaluation`` and ``samples`` sections: the run's infrastructure callbacks."""

from dataclasses import dataclass
from typing import Any

from settings.section import Section


@dataclass(frozen=True, kw_only=True)
class CallbackSettings(Section):
    """Each callback of the ``callbacks`` group by name, then evaluation and samples where their
    file names a ``_target_`` (``none`` does not), as the nodes they are instantiated from.
    Each callback checks its own arguments as it is built (before any logger starts)."""

    key = "callbacks"

    specs: dict[str, dict[str, Any]]
    evaluation: dict[str, Any] | None
    samples: dict[str, Any] | None

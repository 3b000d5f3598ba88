"""The one protocol of every settings section, and the view of the run each check receives.

A section is one node of the composed config (``model``, ``batch``, ``layout``,
``technique.diloco``, ...) as a typed dataclass. Its single-field rules (ranges, choices)
run as it is built; the rules that involve other sections or the machine are its two
check phases, which ``launch/run_settings.py`` calls for every section in one loop each:

- ``check(run)``: the settings against the rest of the run (the strategy, the process
  count, the model's shape). Cheap, imports neither Lightning nor the data libraries, and
  runs before anything is written (also for documented commands checked in tests).
- ``check_services(run)``: what the settings need from this machine and beyond it (CUDA
  kernels, libraries, a reachable lighthouse, enough device memory), as the run starts,
  before any logger or data work.

Both raise ``ConfigError`` naming the setting as the user types it, and the fix. What a
check sees of the rest of the run is a ``RunContext`` (``settings/run_context.py``).
"""

from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from settings.run_context import RunContext


class Section:
    """Base of every settings section: both phases pass unless a section has rules of its own."""

    #: The section's path in the config, for messages (``layout``, ``technique.diloco``).
    key: ClassVar[str]

    def check(self, run: "RunContext") -> None:
        """Raise ``ConfigError`` (naming the setting and the fix) if it cannot work in ``run``."""

    def check_services(self, run: "RunContext") -> None:
        """Raise ``ConfigError`` if what the settings need of the machine or a service is missing."""

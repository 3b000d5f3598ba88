"""The ``logger`` section: the loggers a run writes to, and what identifies the run in them."""

from dataclasses import dataclass
from typing import Any

from settings.section import Section


@dataclass(frozen=True, kw_only=True)
class LoggerSettings(Section):
    """``specs``: each logger of the chosen ``conf/logger/`` file, by name, as instantiated.

    ``identity`` (group, name, job type) and ``tags`` are what a W&B logger gets where its file
    leaves them null: a single run is grouped by its experiment; a multirun (a study, any sweep)
    is one group whose arms are job types, so the W&B UI shows the seeds of one arm together.
    ``hyperparameters``: the resolved config, which every logger records.
    """

    key = "logger"

    specs: dict[str, dict[str, Any]]
    identity: dict[str, str]
    tags: list[str]
    hyperparameters: dict[str, Any]

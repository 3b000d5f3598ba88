"""The ``data`` section: the data module a ``conf/data/`` file names, and its row length.

The source, tokenizer and mixture settings are checked by the classes they configure as
the data module is built (``data/config_checks.py``), before anything is read or tokenized;
the row length is checked here, with the rest of the settings.
"""

from dataclasses import dataclass
from typing import Any

from data.config_checks import check_seq_len
from settings.section import Section


@dataclass(frozen=True, kw_only=True)
class DataSettings(Section):
    """``spec``: the node ``TextDataModule`` is instantiated from; ``seq_len``: its row length."""

    key = "data"

    spec: dict[str, Any]

    def __post_init__(self) -> None:
        check_seq_len(self.spec.get("seq_len"))

    @property
    def seq_len(self) -> int:
        return self.spec["seq_len"]

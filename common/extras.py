"""Optional dependencies: which extra installs each, and one line when one is missing.

``pip install -e .`` (the README's install) brings what ``train.py``, its sweeps and the study
searchers need; the extras bring the rest (``pyproject.toml``). An entry point that imports
an optional library does it inside ``needs_extra``, so a user without it gets one ``error:``
line naming the extra and its install command, and exit code 2, not a traceback.
"""

import contextlib
import sys
from collections.abc import Iterator

#: The extra that installs each optional top-level module.
EXTRAS = {"lm_eval": "eval", "torchao": "float8", "torchft": "ft", "liger_kernel": "gpu"}


@contextlib.contextmanager
def needs_extra(what: str) -> Iterator[None]:
    """Imports inside this block that fail for a module of an extra exit with one line."""
    try:
        yield
    except ModuleNotFoundError as error:
        module = (error.name or "").split(".")[0]
        if module not in EXTRAS:
            raise
        extra = EXTRAS[module]
        print(
            f'error: {what} needs {module}, which the {extra} extra installs: pip install -e ".[{extra}]"',
            file=sys.stderr,
            flush=True,
        )
        raise SystemExit(2) from None

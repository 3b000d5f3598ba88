"""The one error path of the command line: a user mistake is one ``error:`` line and exit code 2.

Mistakes in the composition itself (an unknown key, a bad override, a missing config
file) are raised by Hydra before the run starts; mistakes in settings, data or checkpoints
are ``UserError``s raised by the run. Both end with one line on rank 0 and exit code 2.
Any other exception is a bug and keeps its full traceback.
"""

import os
import sys
from collections.abc import Callable

from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from launch.errors import UserError

#: Hydra's exceptions about what the user typed, as opposed to failures inside the run.
COMPOSITION_ERRORS = ("ConfigCompositionException", "OverrideParseException", "MissingConfigException")


def is_rank_zero() -> bool:
    """Whether this process is the first of the run, from the launcher's environment (also
    before any process is launched, when there is only one)."""
    for variable in ("RANK", "SLURM_PROCID"):
        if variable in os.environ:
            return os.environ[variable] == "0"
    return os.environ.get("LOCAL_RANK", "0") == "0" and os.environ.get("NODE_RANK", "0") == "0"


def one_line(error: BaseException) -> str:
    """The message of an error and of the OmegaConf error behind it, on one line."""
    parts = [str(error)]
    if isinstance(error.__cause__, OmegaConfBaseException):
        parts.append(str(error.__cause__).split("\n")[0])
    lines = [line.strip().rstrip(".") for part in parts for line in part.splitlines() if line.strip()]
    return "; ".join(lines)


def is_composition_error(error: BaseException) -> bool:
    return isinstance(error, HydraException) and type(error).__name__ in COMPOSITION_ERRORS


def run_cli(main: Callable[[], object]) -> None:
    """Run a ``@hydra.main`` function, turning user mistakes into ``error:`` lines and exit code 2."""
    os.environ.setdefault("HYDRA_FULL_ERROR", "1")  # Hydra raises instead of printing its own report
    try:
        main()
    except UserError as error:
        fail(str(error))
    except Exception as error:
        if not is_composition_error(error):
            raise
        fail(f"{one_line(error)} (`python train.py --cfg job` prints the config and its keys)")


def fail(message: str) -> None:
    """Print one line on rank 0 and exit with code 2 on every rank."""
    if is_rank_zero():
        print(f"error: {message}", file=sys.stderr, flush=True)
    sys.exit(2)


def exit_code(work: Callable[[], object]) -> int:
    """Run a script's work: 0, or 2 after one `error:` line for a user mistake (scripts' `main`)."""
    try:
        work()
    except UserError as error:
        print(f"error: {error}", file=sys.stderr, flush=True)
        return 2
    return 0

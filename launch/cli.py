"""The one error path of the command line: a user mistake is one ``error:`` line and exit code 2.

Mistakes in the composition itself (an unknown key, a bad override, a missing config
file) are raised by Hydra before the run starts; mistakes in settings, data or checkpoints
are ``UserError``s raised by the run. Both end with one line on rank 0 and exit code 2.
Any other exception is a bug and keeps its full traceback.
"""

import difflib
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path

from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from common.errors import UserError

CONF = Path(__file__).resolve().parents[1] / "conf"
HINT = "(`python train.py --cfg job` prints the config and its keys)"

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
        fail(composition_message(error, sys.argv[1:]))


def composition_message(error: BaseException, arguments: list[str]) -> str:
    """Hydra's complaint as one line: a misspelt key names the closest real one, and an
    unknown option lists the choices without Hydra's config search path."""
    text = one_line(error)
    unknown = re.search(r"Could not override '([^']+)'.*is not in struct", text)
    if unknown:
        suggestion = closest_key(unknown.group(1), [a for a in arguments if not a.startswith(unknown.group(1) + "=")])
        hint = f"; did you mean {suggestion}?" if suggestion else ""
        return f"{unknown.group(1)} is not a setting{hint} {HINT}"
    if "Available options in" in str(error):
        lines = [line.strip() for line in str(error).split("Config search path:")[0].splitlines() if line.strip()]
        at = next(i for i, line in enumerate(lines) if "Available options in" in line)
        return f"{'; '.join(lines[:at])}; {lines[at].rstrip(':').lower()}: {', '.join(lines[at + 1 :])} {HINT}"
    return f"{text} {HINT}"


def closest_key(key: str, arguments: list[str]) -> str | None:
    """The real key nearest to a misspelt one, from the config the other overrides compose."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import DictConfig

    overrides = [a for a in arguments if not a.startswith(("-", "hydra.", "hydra/", "+hydra"))]
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            cfg = compose("train", overrides=overrides)
    except Exception:  # other mistakes in the same command: keep Hydra's own message
        return None
    node, parts = cfg, []
    for part in key.split("."):  # each misspelt part replaced by the nearest real one
        if not isinstance(node, DictConfig):
            return None
        keys = [str(k) for k in node.keys()]
        match = [part] if part in keys else difflib.get_close_matches(part, keys, n=1, cutoff=0.5)
        if not match:
            return None
        parts.append(match[0])
        node = node[match[0]]
    return ".".join(parts)


def fail(message: str, code: int = 2, every_node: bool = False) -> None:
    """Print one line on rank 0 (``every_node``: on each node's first process) and exit with
    ``code`` (a user mistake's: 2) on every rank."""
    if is_rank_zero() or (every_node and os.environ.get("LOCAL_RANK", os.environ.get("SLURM_LOCALID", "0")) == "0"):
        print(f"error: {message}", file=sys.stderr, flush=True)
    sys.exit(code)


def exit_code(work: Callable[[], object]) -> int:
    """Run a script's work: 0, or 2 after one `error:` line for a user mistake (scripts' `main`)."""
    try:
        work()
    except UserError as error:
        print(f"error: {error}", file=sys.stderr, flush=True)
        return 2
    return 0

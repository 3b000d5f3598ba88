"""Run a command as if only the README's install (``pip install -e .``) had run.

The test environment has every extra installed; this runs a script (or ``-c CODE``) with
the modules of every installed distribution outside the runtime dependencies' closure
refused on import, as they would be missing after the README's install:

    python tests/readme_install.py scripts/evaluate.py CHECKPOINT
    python tests/readme_install.py -c "import lm_eval"
"""

import importlib.abc
import runpy
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]


def runtime_closure() -> set[str]:
    """The distributions ``pip install -e .`` brings: the runtime dependencies and theirs, extras left out."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pending = [Requirement(r) for r in project["dependencies"]]
    found = {canonicalize_name(project["name"])}
    while pending:
        requirement = pending.pop()
        name = canonicalize_name(requirement.name)
        if name in found or (requirement.marker and not requirement.marker.evaluate({"extra": ""})):
            continue
        found.add(name)
        try:
            pending += [Requirement(r) for r in metadata.requires(requirement.name) or []]
        except metadata.PackageNotFoundError:
            continue
    return found


def blocked_modules() -> set[str]:
    """Top-level modules only distributions outside the closure provide."""
    closure = runtime_closure()
    return {
        module
        for module, distributions in metadata.packages_distributions().items()
        if module not in sys.stdlib_module_names and not {canonicalize_name(d) for d in distributions} & closure
    }


class Refuse(importlib.abc.MetaPathFinder):
    def __init__(self, modules: set[str]) -> None:
        self.modules = modules

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.modules:
            raise ModuleNotFoundError(f"No module named {name!r} (not installed by `pip install -e .`)", name=name)
        return None


if __name__ == "__main__":
    sys.meta_path.insert(0, Refuse(blocked_modules()))
    if sys.argv[1] == "-c":
        code, sys.argv = sys.argv[2], ["-c", *sys.argv[3:]]
        exec(compile(code, "<string>", "exec"), {"__name__": "__main__"})
    else:
        sys.argv = sys.argv[1:]
        runpy.run_path(sys.argv[0], run_name="__main__")

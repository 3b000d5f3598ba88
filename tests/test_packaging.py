"""`pip install .` installs every first-party package that train.py and the scripts import.

The list of packages in pyproject.toml is checked against the imports themselves (read
with ``ast``), and every folder of a package must be a package too (setuptools skips a
folder without ``__init__.py``). No module changes ``sys.path`` to find the others.
"""

import ast
import tomllib
from fnmatch import fnmatch

from tests.run_helpers import REPO

ENTRY_POINTS = [REPO / "train.py", *sorted((REPO / "scripts").glob("*.py"))]
FIRST_PARTY = {path.name for path in REPO.iterdir() if path.is_dir() and (path / "__init__.py").is_file()}


def imported_top_level(path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def installed_patterns() -> list[str]:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    return pyproject["tool"]["setuptools"]["packages"]["find"]["include"]


def imported_packages() -> set[str]:
    """First-party packages the entry points import, directly or through each other."""
    found = set().union(*(imported_top_level(path) for path in ENTRY_POINTS)) & FIRST_PARTY
    frontier = set(found)
    while frontier:
        package = frontier.pop()
        for module in (REPO / package).rglob("*.py"):
            new = (imported_top_level(module) & FIRST_PARTY) - found
            found |= new
            frontier |= new
    return found


def test_every_imported_first_party_package_is_installed():
    patterns = installed_patterns()
    imported = imported_packages()
    assert imported >= {"launch", "lightning_modules", "callbacks", "data", "analysis", "evaluation", "benchmarks"}
    for package in imported:
        assert any(fnmatch(package, pattern) for pattern in patterns), f"{package} is not in pyproject's packages"


def test_every_folder_of_an_installed_package_is_a_package():
    for package in FIRST_PARTY:
        for folder in (REPO / package).rglob("*"):
            if folder.is_dir() and folder.name != "__pycache__" and any(folder.glob("*.py")):
                assert (folder / "__init__.py").is_file(), f"{folder} would be left out of the install"


def test_no_module_edits_sys_path():
    sources = [*ENTRY_POINTS, *REPO.glob("tests/*.py"), *(p for package in FIRST_PARTY for p in (REPO / package).rglob("*.py"))]
    offenders = [path for path in sources if "sys.path.insert" in path.read_text() and path.name != "test_packaging.py"]
    assert not offenders, offenders

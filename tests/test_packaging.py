"""`pip install .` installs every first-party package that train.py and the scripts import.

The list of packages in pyproject.toml is checked against the imports themselves (read
with ``ast``), and every folder of a package must be a package too (setuptools skips a
folder without ``__init__.py``). No module changes ``sys.path`` to find the others.
"""

import ast
import subprocess
import sys
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
    sources = [
        *ENTRY_POINTS,
        *REPO.glob("tests/*.py"),
        *(p for package in FIRST_PARTY for p in (REPO / package).rglob("*.py")),
    ]
    offenders = [path for path in sources if "sys.path.insert" in path.read_text() and path.name != "test_packaging.py"]
    assert not offenders, offenders


SEARCH_ROUNDS = """
from study.joint_search import replay
from study.search_space import Range, SearchSpace
space = SearchSpace((Range("optimizer.lr", 1e-3, 4e-3), Range("technique.diloco.sync_every", 10, 90, step=3)))
results = {}
for _ in range(3):  # the first round is random; the next two are the Gaussian process's
    pending = replay(space, "gp", 0, 12, 4, (), results).pending
    results.update({point: 2.0 + 0.01 * sum(i * i for i in point) for point in pending})
print(len(results))
"""


def run_as_after_the_readme_install(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO / "tests" / "readme_install.py"), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_default_searcher_runs_after_the_readme_install_alone() -> None:
    """`pip install -e .` brings what the Gaussian-process searcher needs (scipy among it): the
    test environment's extras are refused on import, as they would be missing."""
    done = run_as_after_the_readme_install("-c", SEARCH_ROUNDS)
    assert done.returncode == 0 and done.stdout.strip() == "12", done.stderr[-2000:]


def test_a_script_whose_extra_is_missing_says_which_in_one_line() -> None:
    done = run_as_after_the_readme_install("scripts/evaluate.py", "missing.ckpt")
    assert done.returncode == 2
    assert (
        done.stderr.strip()
        == 'error: scripts/evaluate.py needs lm_eval, which the eval extra installs: pip install -e ".[eval]"'
    )

"""Every Python file is in the formatter's style and passes the lint (both set in pyproject.toml)."""

import subprocess
import sys

import pytest

from tests.run_helpers import REPO


@pytest.mark.parametrize(("command", "fix"), [(["format", "--check"], "ruff format ."), (["check"], "ruff check .")])
def test_every_python_file_passes_ruff(command: list[str], fix: str) -> None:
    result = subprocess.run([sys.executable, "-m", "ruff", *command, "."], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, f"run `{fix}`:\n{result.stdout}{result.stderr}"

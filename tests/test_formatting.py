"""Every Python file is in the formatter's style at the project's line length (pyproject.toml)."""

import subprocess
import sys

from tests.run_helpers import REPO


def test_every_python_file_is_formatted() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", "."], cwd=REPO, capture_output=True, text=True
    )
    assert result.returncode == 0, f"run `ruff format .`:\n{result.stdout}{result.stderr}"

"""Finished training runs as Python objects, read from the CSV logger's files.

A run folder is what `python train.py logger=csv` leaves behind: `csv/metrics.csv` (one
row per logged step, every row carrying `train/tokens_seen`), `csv/hparams.yaml` (the
fully resolved config) and, from Hydra, `.hydra/overrides.yaml`. A sweep folder holds one
such run folder per job, so runs are found by searching for `csv/metrics.csv`.
"""

import csv
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
METRICS = Path("csv") / "metrics.csv"
TOKENS = "train/tokens_seen"


@dataclass(frozen=True)
class Run:
    """One finished run: where it is, how it was configured, and what it logged."""

    path: Path
    config: dict[str, Any]
    overrides: list[str]
    rows: list[dict[str, float]]

    @property
    def name(self) -> str:
        """The overrides that made this run, which is what tells sweep jobs apart."""
        return " ".join(self.overrides) or self.path.name

    def series(self, key: str) -> tuple[list[float], list[float]]:
        """Tokens seen and the value of `key`, for every row that logged it.

        Tokens are the x-axis because steps change meaning when the batch or the
        sequence length changes during a run.
        """
        points = [(row[TOKENS], row[key]) for row in self.rows if key in row and TOKENS in row]
        return [tokens for tokens, _ in points], [value for _, value in points]

    def final(self, key: str) -> float | None:
        """The last logged value of `key`, or None when the run never logged it."""
        values = [row[key] for row in self.rows if key in row]
        return values[-1] if values else None

    def setting(self, key: str) -> Any:
        """A config value by dotted key (`optimizer.lr`), or None when the config lacks it."""
        node: Any = self.config
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                return None
            node = node[part]
        return node


def _read_rows(path: Path) -> list[dict[str, float]]:
    """CSV rows as floats; empty cells (metrics not logged at that step) are left out."""
    with open(path, newline="") as file:
        return [{key: float(value) for key, value in row.items() if value} for row in csv.DictReader(file)]


def _read_yaml(path: Path, default: Any) -> Any:
    if not path.exists():
        return default
    with open(path) as file:
        return yaml.safe_load(file)


def load_run(path: str | Path) -> Run:
    """The run in folder `path` (the folder that holds `csv/metrics.csv`)."""
    path = Path(path)
    metrics = path / METRICS
    if not metrics.exists():
        raise FileNotFoundError(f"{path} is not a run folder: {metrics} does not exist (train with logger=csv).")
    return Run(
        path=path,
        config=_read_yaml(path / "csv" / "hparams.yaml", {}) or {},
        overrides=list(_read_yaml(path / ".hydra" / "overrides.yaml", []) or []),
        rows=_read_rows(metrics),
    )


def _natural_key(path: Path) -> list[tuple[int, int | str]]:
    """Sort key that puts sweep job 10 after job 9, not after job 1."""
    return [(0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", str(path)) if part]


def find_runs(paths: list[str | Path]) -> list[Run]:
    """Every run in `paths`, each a run folder or a folder searched recursively (a sweep).

    Runs come back in path order (job numbers compared as numbers), each once, so
    reports and fits do not depend on the order of the file system.
    """
    folders: set[Path] = set()
    for path in map(Path, paths):
        found = {metrics.parent.parent for metrics in path.rglob(str(METRICS))}
        if not found:
            raise FileNotFoundError(f"no runs under {path}: no {METRICS} found (train with logger=csv).")
        folders |= {folder.resolve() for folder in found}
    return [load_run(folder) for folder in sorted(folders, key=_natural_key)]


def train_run(name: str, overrides: list[str], out_dir: Path, threads: int | None = None) -> tuple[Run, float]:
    """Train one run with train.py in a subprocess, as a user would; the run and its wall time.

    The run goes to `out_dir / name`, logs CSV every optimizer step, and a failure stops
    the caller with the end of the run's stderr, where the error is. `threads` caps the
    run's CPU threads (for runs side by side).
    """
    run_dir = out_dir / name
    command = [sys.executable, str(REPO / "train.py"), f"hydra.run.dir={run_dir}", "logger=csv",
               "trainer.log_every_n_steps=1", *overrides]  # fmt: skip
    print(f"training {name}: {' '.join(overrides)}", file=sys.stderr, flush=True)
    started = time.perf_counter()
    env = {**os.environ, **({"OMP_NUM_THREADS": str(threads)} if threads else {})}
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{result.stderr[-3000:]}")
    return load_run(run_dir), time.perf_counter() - started

"""Finished training runs as Python objects, read from the CSV logger's files.

A run folder is what `python train.py logger=csv` leaves behind: `csv/metrics.csv` (one
row per logged step, every row carrying `train/tokens_seen`), `csv/hparams.yaml` (the
fully resolved config) and, from Hydra, `.hydra/overrides.yaml`. A sweep folder holds one
such run folder per job, so runs are found by searching for `csv/metrics.csv`.

A sweep job that was interrupted and resumed in its own folder appends to its
`metrics.csv`, repeating the steps between its last checkpoint and the interruption: those
rows are replaced by the resumed run's, so a run reads as if it had never stopped.
"""

import csv
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

METRICS = Path("csv") / "metrics.csv"
FINISHED = "finished.yaml"  # a finished sweep job's marker (launch/sweep_jobs.py)
TOKENS = "train/tokens_seen"
STEP = "step"
WALL_TIME = "time/train_seconds"
#: Names for a run's final values that are not logged under that name.
DERIVED = {"steps": STEP, "tokens": TOKENS, "wall_time": WALL_TIME}


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
        """The last logged value of `key` (or of a `DERIVED` name: `steps`, `tokens`,
        `wall_time`), or None when the run never logged it."""
        key = DERIVED.get(key, key)
        values = [row[key] for row in self.rows if key in row]
        return values[-1] if values else None

    def at_step(self, key: str, steps: list[float]) -> list[float]:
        """`key` at the given optimizer steps, linearly interpolated between its logged values
        (e.g. wall time at the steps of validation rows)."""
        points = [(row[STEP], row[key]) for row in self.rows if key in row and STEP in row]
        if not points:
            return []
        xs, ys = zip(*points)
        return list(np.interp(steps, xs, ys))

    @property
    def seed(self) -> int | None:
        value = self.setting("seed")
        return int(value) if value is not None else None

    def setting(self, key: str) -> Any:
        """A config value by dotted key (`optimizer.lr`), or None when the config lacks it."""
        node: Any = self.config
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                return None
            node = node[part]
        return node

    @property
    def arm(self) -> str | None:
        """The study arm this run belongs to (None outside a study)."""
        arm = self.setting("study.arm")
        return str(arm) if arm else None

    @property
    def phase(self) -> str | None:
        """``tune`` or ``judge`` in a tuned study (None elsewhere: every run judges)."""
        phase = self.setting("study.phase")
        return str(phase) if phase else None

    @property
    def finished(self) -> bool:
        """Whether this sweep job reached its budget (``launch/sweep_jobs.py`` marks it)."""
        return (self.path / FINISHED).exists()

    @property
    def group(self) -> tuple[str, ...]:
        """What this run is one seed of: its overrides less the seed."""
        return tuple(o for o in self.overrides if not o.startswith(("seed=", "+seed=")))

    def value(self, expression: str) -> float | None:
        """A final value (``Run.final``), ``max(KEY)`` / ``min(KEY)`` over every logged value,
        or ``spikes(KEY>T)``: how many times KEY rose above T (each excursion counts once, so
        a spike that lasts several steps is one; a non-finite value counts as above)."""
        reduction = parse_reduction(expression)
        if reduction is None:
            return self.final(expression)
        name, key, threshold = reduction
        values = [row[key] for row in self.rows if key in row]
        if not values:
            return None
        if name == "spikes":
            return _excursions(values, threshold)
        return max(values) if name == "max" else min(values)


def parse_reduction(expression: str) -> tuple[str, str, float | None] | None:
    """``max(KEY)`` / ``min(KEY)`` -> (name, KEY, None); ``spikes(KEY>T)`` -> ("spikes", KEY, T);
    anything else (a plain key) -> None. A ``spikes`` without a numeric threshold is a ValueError."""
    match = re.fullmatch(r"(max|min|spikes)\((.+)\)", expression)
    if not match:
        return None
    name, argument = match.groups()
    if name != "spikes":
        return name, argument, None
    key, _, threshold = argument.partition(">")
    try:
        return name, key, float(threshold)
    except ValueError:
        raise ValueError(f"{expression!r} needs a threshold, e.g. spikes(stability/loss_spike_ratio>1.2)") from None


def _excursions(values: list[float], threshold: float) -> float:
    """How many times the series rises above ``threshold`` from at or below it (or starts above)."""
    above = [not value <= threshold for value in values]  # NaN and inf are above
    return float(sum(now and not before for before, now in zip([False, *above], above)))


def read_rows(path: Path) -> list[dict[str, float]]:
    """CSV rows as floats; empty cells (metrics not logged at that step) are left out. Where
    the step goes back (a resumed run), the rows it repeats are dropped in favour of the new."""
    rows: list[dict[str, float]] = []
    with open(path, newline="") as file:
        for row in csv.DictReader(file):
            values = {key: float(value) for key, value in row.items() if value}
            step = values.get(STEP)
            if step is not None and rows and rows[-1].get(STEP, -1) > step:
                rows = [kept for kept in rows if kept.get(STEP, -1) < step]
            elif step is not None and rows and rows[-1].get(STEP) == step:  # the same row logged again
                rows = [kept for kept in rows if kept.get(STEP) != step or kept.keys() != values.keys()]
            rows.append(values)
    return rows


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
        overrides=recorded_overrides(path) or [],
        rows=read_rows(metrics),
    )


def recorded_overrides(path: Path) -> list[str] | None:
    """The overrides a run folder was run with: its ``finished.yaml``'s (which only a run of
    the same overrides rewrites), else Hydra's record of the run's start; None for a folder
    no run has started in."""
    finished = _read_yaml(path / FINISHED, {}) or {}
    if "overrides" in finished:
        return list(finished["overrides"])
    started = path / ".hydra" / "overrides.yaml"
    return list(_read_yaml(started, []) or []) if started.exists() else None


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

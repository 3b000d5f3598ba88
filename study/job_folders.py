"""Where a tuned study's jobs run: one folder number per job's overrides, kept for the study's life.

A tuned study's jobs are planned round by round, so they cannot be numbered by position as
a plain study's are: a preset that gains an arm, or a worker that plans a moment later, would
move jobs to other folders. Each job's overrides get a number once, in ``job_folders.yaml``.
"""

import fcntl
from pathlib import Path

import yaml

from analysis.runs import recorded_overrides

REGISTRY = "job_folders.yaml"


def job_folders(sweep_dir: Path, batch: list[list[str]]) -> list[int]:
    """Each job's folder number: the one given to the same overrides before, else the next
    number no folder or earlier job has.

    The numbers given are kept in ``job_folders.yaml`` in the sweep folder, read and
    extended under a file lock, so workers planning at different moments (or with a preset
    that gained an arm since) agree on jobs no worker has started yet. Folders of runs
    started before the registry existed are found by their recorded overrides.
    """
    sweep_dir.mkdir(parents=True, exist_ok=True)
    with open(sweep_dir / f"{REGISTRY}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        registry = sweep_dir / REGISTRY
        given = (
            {tuple(entry["overrides"]): int(entry["folder"]) for entry in (yaml.safe_load(registry.read_text()) or [])}
            if registry.is_file()
            else {}
        )
        numbered = [int(folder.name) for folder in sweep_dir.iterdir() if folder.name.isdigit()]
        for number in sorted(numbered):
            overrides = recorded_overrides(sweep_dir / str(number))
            if overrides is not None:
                given.setdefault(tuple(overrides), number)
        next_free = max([*numbered, *given.values()], default=-1) + 1
        numbers = []
        for overrides in batch:
            if tuple(overrides) not in given:
                given[tuple(overrides)], next_free = next_free, next_free + 1
            numbers.append(given[tuple(overrides)])
        entries = [
            {"folder": number, "overrides": list(overrides)}
            for overrides, number in sorted(given.items(), key=lambda item: item[1])
        ]
        registry.write_text(yaml.safe_dump(entries, sort_keys=False))
    return numbers

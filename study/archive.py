"""A study's results as a small folder of text that outlives the machine it ran on.

A study resumes with the command that started it, but only where its sweep folder still is:
a study of several core-hours on a machine that is replaced between sessions (a preemptible
cloud node, a laptop's scratch disk) loses its finished runs with the folder. An archive
keeps what the study's decisions and reports read, in a few hundred bytes a run, so that it
can be committed beside the report it backs:

- ``runs.jsonl``: one line per finished run: its folder number, ``finished.yaml`` (overrides
  and final metrics), its resolved config as the keys that differ from ``base_config.yaml``
  (the first run's), and its logged rows thinned to the validation rows and one last row
  holding every other key's last value;
- the study's own files that are not runs: the search record (Optuna's journal, which holds
  every round a search asked) and a held-out size's prediction, written before that size
  trained (``analysis/ladder.py``).

``restore`` lays the runs back as finished run folders (with ``restored.yaml`` saying where
from) and the files beside them, so the same ``train.py -m`` command skips those jobs and
continues the search from its record, and the reports read the same finals. What a restored
run no longer has: checkpoints, and the training rows between validations (curves of
training metrics show the validation steps only).
"""

import functools
import json
import os
import platform
import shutil
from pathlib import Path
from typing import Any

import torch
import yaml

from analysis.ladder import PREDICTION
from analysis.runs import FINISHED, METRICS, read_rows
from common.errors import ConfigError
from launch.sweep_jobs import LOCK, lock_is_live
from study.search_record import JOURNAL

RUNS, BASE, RESTORED = "runs.jsonl", "base_config.yaml", "restored.yaml"
HPARAMS = Path("csv") / "hparams.yaml"
#: The study's files beside its runs that an archive carries (the append-only journal may grow).
STUDY_FILES = (JOURNAL, PREDICTION)
ConfigKey = tuple[str, ...]
_ABSENT = object()


def save(sweep_dir: Path, archive_dir: Path) -> int:
    """Write the archive of every finished run in ``sweep_dir``; the number of runs.

    Refuses, before writing, an archive that holds a run this folder lacks or has otherwise
    (saving a partial or another study's folder over it would lose results), and a folder
    with no finished run.
    """
    runs = _finished_runs(sweep_dir)
    if not runs:
        raise ConfigError(
            f"{sweep_dir} holds no finished run (finished.yaml): nothing to archive; name a study's sweep folder."
        )
    records = [_record(folder) for folder in runs]
    base = _flat(_hparams(runs[0]))
    lines = {record["folder"]: record for record in (_with_config(record, base) for record in records)}
    _check_kept(archive_dir, lines)
    archive_dir.mkdir(parents=True, exist_ok=True)
    _write(archive_dir / BASE, yaml.safe_dump(_nested(base), sort_keys=False))
    _write(
        archive_dir / RUNS, "".join(json.dumps(lines[number], separators=(",", ":")) + "\n" for number in sorted(lines))
    )
    for name in STUDY_FILES:
        if (sweep_dir / name).is_file():
            text = (sweep_dir / name).read_text()
            _write(archive_dir / name, _whole_lines(text) if name == JOURNAL else text)
    return len(lines)


def _whole_lines(text: str) -> str:
    """The text up to its last line end: a worker may be appending to the journal as it is
    read, and half an entry would make the restored record unreadable."""
    return text[: text.rfind("\n") + 1] if "\n" in text else text


def restore(archive_dir: Path, sweep_dir: Path) -> int:
    """Lay the archive's runs and study files into ``sweep_dir``; the number of runs laid.

    Every check runs before the first write: a folder that holds another run than the
    archive's, or a study file that is not the archived one or (the journal) one it extends,
    is refused and nothing is written.
    """
    base, records = _read_archive(archive_dir)
    todo = [record for record in records if _needs_laying(sweep_dir / str(record["folder"]), record)]
    files = [name for name in STUDY_FILES if _needs_copy(archive_dir / name, sweep_dir / name)]
    for record in todo:
        _lay_run(sweep_dir / str(record["folder"]), record, base, archive_dir)
    for name in files:
        _write(sweep_dir / name, (archive_dir / name).read_text())
    return len(todo)


def _finished_runs(sweep_dir: Path) -> list[Path]:
    if not sweep_dir.is_dir():
        raise ConfigError(f"{sweep_dir} is not a folder: name the study's hydra.sweep.dir.")
    numbered = sorted((folder for folder in sweep_dir.iterdir() if folder.name.isdigit()), key=lambda f: int(f.name))
    return [folder for folder in numbered if (folder / FINISHED).is_file() and (folder / METRICS).is_file()]


def _record(folder: Path) -> dict[str, Any]:
    return {
        "folder": int(folder.name),
        "finished": yaml.safe_load((folder / FINISHED).read_text()),
        "rows": _thinned(read_rows(folder / METRICS)),
        "hparams": _flat(_hparams(folder)),
        "machine": machine_of(folder),
    }


def machine_of(folder: Path) -> str:
    """Where the run trained: a restored run's recorded machine, else this one's CPU and the
    kernels PyTorch picked on it. Seeded runs repeat exactly on one kind of CPU, not across
    kinds (AVX2 and AVX-512 kernels sum in other orders), so a study that crossed machines says
    which runs ran where."""
    if (folder / RESTORED).is_file():
        return str((yaml.safe_load((folder / RESTORED).read_text()) or {}).get("machine", "unrecorded"))
    return _this_machine()


@functools.cache
def _this_machine() -> str:
    """This CPU's name and PyTorch's kernel level on it, read once per process."""
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.is_file() else []
    name = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "")
    return f"{name or platform.processor() or platform.machine()}, {torch.backends.cpu.get_cpu_capability()} kernels"


def _with_config(record: dict[str, Any], base: dict[ConfigKey, Any]) -> dict[str, Any]:
    """The record with its config as the differences from ``base`` (keys as lists of names,
    since a key may hold dots: the searched settings' names do)."""
    config = record.pop("hparams")
    record["config"] = [[list(key), value] for key, value in config.items() if base.get(key, _ABSENT) != value]
    record["removed"] = [list(key) for key in base if key not in config]
    return record


def _thinned(rows: list[dict[str, float]]) -> list[dict[str, float]]:
    """The validation rows, then one row of the last value of every key the other rows logged:
    every key's final value reads as before, and so do the validation curves."""
    kept = [row for row in rows if any(key.startswith("val/") for key in row)]
    validation = {id(row) for row in kept}
    others = {key for row in rows if id(row) not in validation for key in row}
    last: dict[str, float] = {}
    for row in rows:
        last.update(row)
    final = {key: value for key, value in last.items() if key in others}
    return [*kept, final] if final else kept


def _hparams(folder: Path) -> dict[str, Any]:
    return yaml.safe_load((folder / HPARAMS).read_text()) if (folder / HPARAMS).is_file() else {}


def _flat(config: Any, prefix: ConfigKey = ()) -> dict[ConfigKey, Any]:
    if not isinstance(config, dict) or not config:
        return {prefix: config} if prefix else {}
    return {key: value for name, child in config.items() for key, value in _flat(child, (*prefix, str(name))).items()}


def _nested(flat: dict[ConfigKey, Any]) -> dict[str, Any]:
    nested: dict[str, Any] = {}
    for key, value in flat.items():
        node = nested
        for name in key[:-1]:
            node = node.setdefault(name, {})
        node[key[-1]] = value
    return nested


def _check_kept(archive_dir: Path, lines: dict[int, dict[str, Any]]) -> None:
    if not (archive_dir / RUNS).is_file():
        return
    _, archived = _read_archive(archive_dir)
    for record in archived:
        ours = lines.get(record["folder"])
        if ours is None or ours["finished"]["overrides"] != record["finished"]["overrides"]:
            raise ConfigError(
                f"{archive_dir} holds run {record['folder']} ({' '.join(record['finished']['overrides'])}), which this"
                " sweep folder lacks or ran otherwise: restore the archive into it first, or archive to a new folder."
            )


def _read_archive(archive_dir: Path) -> tuple[dict[ConfigKey, Any], list[dict[str, Any]]]:
    if not (archive_dir / RUNS).is_file() or not (archive_dir / BASE).is_file():
        raise ConfigError(f"{archive_dir} is not a study archive (no {RUNS} and {BASE}): name one `save` wrote.")
    base = _flat(yaml.safe_load((archive_dir / BASE).read_text()))
    records = [json.loads(line) for line in (archive_dir / RUNS).read_text().splitlines() if line.strip()]
    return base, records


def _needs_laying(folder: Path, record: dict[str, Any]) -> bool:
    """Whether the archived run must be laid at ``folder``: not when the folder holds the same
    finished run; refused when it holds a finished run of other overrides."""
    if not (folder / FINISHED).is_file():
        if lock_is_live(folder / LOCK):
            raise ConfigError(
                f"a worker is training in {folder}: restore before starting the study's workers, or after they end."
            )
        return True
    held = (yaml.safe_load((folder / FINISHED).read_text()) or {}).get("overrides", [])
    if held != record["finished"]["overrides"]:
        raise ConfigError(
            f"{folder} holds a finished run of other overrides ({' '.join(held)}) than the archive's run"
            f" {record['folder']}: restore into the study's own sweep folder or a new one."
        )
    return False


def _needs_copy(archived: Path, present: Path) -> bool:
    """Whether an archived study file must be copied; refused where the folder holds another
    (the journal is append-only: one that the archived one extends, or that extends it, agrees)."""
    if not archived.is_file():
        return False
    if not present.is_file():
        return True
    ours, theirs = archived.read_text(), present.read_text()
    if ours.startswith(theirs):
        return ours != theirs
    if present.name == JOURNAL and theirs.startswith(ours):
        return False
    raise ConfigError(
        f"{present} differs from the archive's {archived.name}: it belongs to another study; restore into a new folder."
    )


def _lay_run(folder: Path, record: dict[str, Any], base: dict[ConfigKey, Any], archive_dir: Path) -> None:
    if folder.exists():  # an unfinished attempt of the same job: the archived run replaces it
        shutil.rmtree(folder)
    config = dict(base)
    for key in record.get("removed", []):
        config.pop(tuple(key), None)
    config.update({tuple(key): value for key, value in record["config"]})
    (folder / "csv").mkdir(parents=True)
    columns = list(dict.fromkeys(key for row in record["rows"] for key in row))
    table = [",".join(columns)] + [",".join(_cell(row.get(key)) for key in columns) for row in record["rows"]]
    (folder / METRICS).write_text("\n".join(table) + "\n")
    (folder / HPARAMS).write_text(yaml.safe_dump(_nested(config), sort_keys=False))
    (folder / RESTORED).write_text(
        yaml.safe_dump(
            {
                "archive": str(archive_dir),
                "machine": record.get("machine", "unrecorded"),
                "rows": "validation rows and each key's last value",
            }
        )
    )
    (folder / FINISHED).write_text(yaml.safe_dump(record["finished"], sort_keys=False))


def _cell(value: float | None) -> str:
    return "" if value is None else repr(float(value))


def _write(path: Path, text: str) -> None:
    """Replace ``path`` whole or not at all: a stopped save never leaves half an archive file."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    os.replace(partial, path)

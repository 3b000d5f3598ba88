"""Resumable sweeps: a multirun job that finished is skipped, one that was interrupted resumes.

Running the same ``-m`` command again with the same ``hydra.sweep.dir`` gives every job the
same folder (Hydra numbers jobs in a fixed order). A job that finished there left
``finished.yaml`` (its overrides and final metrics): it is skipped, and its metrics are
returned to the sweeper as if it had run. A job that was interrupted (preempted, killed,
the machine rebooted) resumes from its newest readable checkpoint: ``last.ckpt``, written
on SIGTERM and with every periodic checkpoint, else the newest periodic one. A job folder
that holds a finished run of other overrides is refused, since its results would be
mixed with this command's.

This works with any sweeper and launcher (basic, study, SLURM through submitit), because
it runs inside the job. Single runs (no ``-m``) always start a new folder and are untouched.

The same command started twice on one machine runs the sweep with two workers: a job being
trained holds ``running.lock`` (host and process id), and a worker that finds the lock of a
live process on its host passes the job by. A lock left by a process that died, or written
on another host (a requeued SLURM job), is taken over, so resuming never waits on it. Only
one-process jobs are locked: every rank of a multi-process job (SLURM tasks, or Lightning's
relaunched ranks) enters the same folder and would find its own ranks' lock.
"""

import logging
import os
import socket
import zipfile
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import yaml
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode

from analysis.runs import FINISHED
from common.errors import ConfigError

log = logging.getLogger(__name__)

MARKER = FINISHED
LOCK = "running.lock"


@dataclass(frozen=True)
class SweepJob:
    """This process's multirun job: its folder, number and overrides."""

    folder: Path
    number: int
    overrides: list[str]

    @classmethod
    def current(cls) -> "SweepJob | None":
        """The running job, or None outside a multirun."""
        if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
            return None
        hydra = HydraConfig.get()
        return cls(Path(hydra.runtime.output_dir), int(hydra.job.num), list(hydra.overrides.task))

    @property
    def label(self) -> str:
        return f"job {self.number}"  # Hydra has just printed the job's number and overrides

    def finished_metrics(self) -> dict[str, float] | None:
        """The metrics of a finished earlier run of this job, or None when it must (still) run."""
        marker = self.folder / MARKER
        if not marker.exists():
            return None
        record = yaml.safe_load(marker.read_text()) or {}
        if list(record.get("overrides", [])) != self.overrides:
            raise ConfigError(
                f"{self.folder} holds a finished run of other overrides ({' '.join(record.get('overrides', []))});"
                " this command's job would mix with it: use a new hydra.sweep.dir."
            )
        return dict(record.get("metrics", {}))

    def checkpoint(self) -> Path | None:
        """The newest readable checkpoint an interrupted earlier run of this job left, if any.

        A checkpoint cut short by a hard kill is not a complete zip file; it is passed over.
        """
        folder = self.folder / "checkpoints"
        candidates = [folder / "last.ckpt", *sorted(folder.glob("step*.ckpt"), reverse=True)]
        return next((path for path in candidates if path.is_file() and zipfile.is_zipfile(path)), None)

    def claim(self, processes: int | None) -> "AbstractContextManager[str | None]":
        """Hold this job for this process while the block runs (``claim_folder``)."""
        return claim_folder(self.folder, processes)

    def mark_finished(self, metrics: dict[str, float]) -> None:
        record = {"overrides": self.overrides, "metrics": {key: float(value) for key, value in metrics.items()}}
        (self.folder / MARKER).write_text(yaml.safe_dump(record, sort_keys=False))


@contextmanager
def claim_folder(folder: Path, processes: int | None) -> Iterator[str | None]:
    """Hold a run or job folder for this process while the block runs.

    Yields None when the folder is this process's, else the lock of the live process on this
    host that holds it (then nothing is written: a sweep passes the job by, a single run
    stops). A run of ``processes`` other than one (or an unknown count) is not locked: its
    ranks share the folder.
    """
    if processes != 1:
        yield None
        return
    lock, mine = folder / LOCK, f"{socket.gethostname()} {os.getpid()}"
    for _ in range(2):  # a second try after removing a dead worker's lock
        try:
            descriptor = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            holder = _read(lock)
            if holder is not None and _alive_here(holder):
                yield holder
                return
            lock.unlink(missing_ok=True)
            continue
        with os.fdopen(descriptor, "w") as file:
            file.write(mine)
        try:
            yield None
        finally:
            if _read(lock) == mine:
                lock.unlink()
        return
    yield _read(lock) or "another worker"  # lost the race for a dead worker's lock


def _read(lock: Path) -> str | None:
    try:
        return lock.read_text().strip()
    except FileNotFoundError:
        return None


def lock_is_live(lock: Path) -> bool:
    """Whether a live worker on this host holds the lock file."""
    holder = _read(lock)
    return holder is not None and _alive_here(holder)


def _alive_here(holder: str) -> bool:
    """Whether the lock's writer is a live process on this host (another host's cannot be
    checked: its lock is treated as left over)."""
    host, _, pid = holder.rpartition(" ")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def report_busy(job: SweepJob, holder: str) -> None:
    log.info("passed %s by: another worker (%s) is training it", job.label, holder)


def report_skip(job: SweepJob, metrics: dict[str, float]) -> None:
    loss = metrics.get("val/loss")
    log.info(
        "skipped %s: finished in an earlier run%s", job.label, f" (val/loss {loss:.4f})" if loss is not None else ""
    )


def report_resume(job: SweepJob, checkpoint: Path) -> None:
    log.info("resuming %s from %s", job.label, checkpoint)


def report_stopped(job: SweepJob) -> None:
    log.info(
        "stopped %s before its end (SIGTERM or Ctrl-C): the sweep ends here; the same command resumes it", job.label
    )

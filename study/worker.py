"""One worker's loop over a tuned study's plan: run the open jobs no other worker holds, wait
only when there are none.

The plan (``study/plan.py``) lays out each search's rounds from the finished jobs
alone. Workers started with the same command share them through the job folders' locks
(``launch/sweep_jobs.py``): a worker launches every open job no live worker holds, records
the final metrics of those that finished, and asks the plan again. So a search whose round
has ended proposes its next one while another search's last job still trains on the other
worker, instead of every worker waiting for the slowest job of all searches' rounds. A worker
waits only when every open job is another's, and only until one of them ends: finished (then
recorded), or its worker gone (then it is run here, resuming from its checkpoint).
"""

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from launch.sweep_jobs import LOCK, MARKER, SweepJob, lock_is_live
from study.job_folders import job_folders
from study.plan import StudyPlan, TunedJob

log = logging.getLogger(__name__)
#: Seconds between two looks at jobs other workers are training.
POLL_S = 5.0

#: Runs one job (its overrides, its folder number) here, or passes it by if a live worker holds it.
Launch = Callable[[list[str], int], Any]


def run_rounds(
    plan: StudyPlan, sweep_dir: Path, launch: Launch, prepare: Callable[[list[TunedJob]], None] = lambda jobs: None
) -> list[Any]:
    """Run the plan to its end; returns what ``launch`` returned for each job launched here.

    ``prepare`` sees each batch of open jobs before any of it is launched (the held-out size's
    loss prediction is written there, before its runs start).
    """
    launched = []
    while jobs := plan.next_round():
        prepare(jobs)
        batch = [plan.overrides(job) for job in jobs]
        numbers = job_folders(sweep_dir, batch)
        folders = [sweep_dir / str(number) for number in numbers]
        free = [i for i, folder in enumerate(folders) if not lock_is_live(folder / LOCK)]
        if not free:
            log.info(
                "tuned study: the %d open %s jobs (folders %s) are other workers'; waiting for one to end",
                len(jobs),
                jobs[0].phase,
                ", ".join(map(str, numbers)),
            )
            wait_for_any(folders)
            continue
        held = len(jobs) - len(free)
        log.info(
            "tuned study: %d %s jobs (folders %s)%s",
            len(free),
            jobs[0].phase,
            ", ".join(str(numbers[i]) for i in free),
            f"; {held} more held by another worker" if held else "",
        )
        for i in free:
            launched.append(launch(batch[i], numbers[i]))
            metrics = SweepJob(folders[i], numbers[i], batch[i]).finished_metrics()
            if metrics is not None:
                plan.record(jobs[i], metrics)
            elif not lock_is_live(folders[i] / LOCK):  # neither finished nor another worker's
                raise RuntimeError(
                    f"job {numbers[i]} ended without {MARKER} in {folders[i]}: it did not reach its budget"
                )
    return launched


def wait_for_any(folders: list[Path]) -> None:
    """Wait until one of these jobs, each held by another live worker, is let go: its worker
    releases the lock once the job's marker is written, or died."""
    while all(lock_is_live(folder / LOCK) for folder in folders):
        time.sleep(POLL_S)

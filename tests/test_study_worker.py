"""A worker's loop over a tuned study: while the other worker trains one search's last job,
this one goes on with the searches whose round has ended, and a job the other worker
finished is recorded from its folder, not trained again."""

import math
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from launch.sweep_jobs import LOCK, MARKER, lock_is_live
from study import worker as study_worker
from study.job_folders import job_folders
from study.plan import TUNE, StudyPlan
from study.preset import StudySpec

SPEC = {
    "searcher": "gp",
    "budget": 4,
    "round_size": 2,
    "tuning_seeds": [1],
    "seeds": [2, 3],
    "search": {"optimizer.lr": {"low": 1e-3, "high": 4e-3, "scale": "log", "step": 2, "min": 2.5e-4, "max": 3.2e-2}},
    "arms": {"base": [], "other": ["optimizer.beta2=0.95"]},
    "claims": [{"arm": "other", "baseline": "base", "expect": {"val/loss": {"no_worse_than": 0.01}}}],
}

# The other worker: holds its job until told to go on, then finishes it as train.py does (its
# marker written, then its lock released). Not told within 20 s, it lets the job go
# unfinished: a loop that waited for it then trains the job itself and fails the test.
OTHER_WORKER = """
import pathlib, sys, time, yaml
folder, go, overrides = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), sys.argv[3:]
deadline = time.time() + 20
while not go.exists():
    if time.time() > deadline:
        (folder / "running.lock").unlink()
        sys.exit(1)
    time.sleep(0.01)
(folder / "finished.yaml").write_text(yaml.safe_dump({"overrides": overrides, "metrics": {"val/loss": 9.0}}))
(folder / "running.lock").unlink()
time.sleep(600)
"""


def setting(overrides: list[str], key: str) -> str:
    return next(o.split("=", 1)[1] for o in overrides if o.lstrip("+").startswith(f"{key}="))


def loss(overrides: list[str]) -> float:
    lr = float(setting(overrides, "optimizer.lr"))
    return 2.0 + 0.05 * math.log2(lr / 4e-3) ** 2 + 0.001 * int(setting(overrides, "seed"))


def test_a_worker_goes_on_with_other_searches_and_records_what_the_other_worker_finished(
    tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setattr(study_worker, "POLL_S", 0.01)
    plan = StudyPlan(StudySpec.from_config(SPEC), [([], ["base", "other"])])
    first = plan.next_round()
    assert [(job.arm, job.phase) for job in first] == [("base", TUNE)] * 2 + [("other", TUNE)] * 2
    # The other worker planned the same round and took other's second point.
    numbers = job_folders(tmp_path, [plan.overrides(job) for job in first])
    held = tmp_path / str(numbers[3])
    held.mkdir()
    go = tmp_path / "go"
    other = subprocess.Popen([sys.executable, "-c", OTHER_WORKER, str(held), str(go), *plan.overrides(first[3])])
    (held / LOCK).write_text(f"{socket.gethostname()} {other.pid}")
    trained: list[tuple[str, str]] = []

    def launch(overrides: list[str], number: int) -> None:
        """What train.py does with a job: pass it by, skip it, or train it (here: its loss)."""
        folder = tmp_path / str(number)
        if lock_is_live(folder / LOCK) or (folder / MARKER).is_file():
            return
        folder.mkdir(exist_ok=True)
        trained.append((setting(overrides, "study.arm"), setting(overrides, "study.phase")))
        (folder / MARKER).write_text(yaml.safe_dump({"overrides": overrides, "metrics": {"val/loss": loss(overrides)}}))
        if trained.count(("base", TUNE)) == 4:  # base's search is over: the other worker finishes its job
            go.touch()

    try:
        study_worker.run_rounds(plan, tmp_path, launch)
    finally:
        other.kill()
        other.wait()
    # Base's second round ran here while other's first round was still open on the other worker.
    assert trained[:5] == [("base", TUNE)] * 2 + [("other", TUNE)] + [("base", TUNE)] * 2
    assert trained.count(("other", TUNE)) == 3  # its held point was not trained again
    assert plan.finished[first[3]] == {"val/loss": 9.0}  # recorded from the other worker's marker
    assert plan.next_round() == [] and len(plan.tuning(0, "other").results) == 4


def test_a_job_that_ends_without_its_marker_and_without_a_worker_stops_the_loop(tmp_path: Path) -> None:
    plan = StudyPlan(StudySpec.from_config(SPEC), [([], ["base", "other"])])
    with pytest.raises(RuntimeError, match=r"job 0 ended without finished.yaml in .*/0: it did not reach its budget"):
        study_worker.run_rounds(plan, tmp_path, lambda overrides, number: None)

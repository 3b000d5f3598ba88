"""A study preset end to end: arms x seeds through `train.py -m`, the report's groups and
verdicts, and a sweep that resumes (finished jobs skipped, an interrupted one resumed exactly)
and runs with two workers (a job held by a live worker passed by)."""

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import pytest
import yaml

from analysis.runs import load_run
from launch.sweep_jobs import LOCK, SweepJob
from study.report import study_report
from tests.run_helpers import REPO, TINY, finished_study, run_sweep, run_train, tiny_study

# The arms set optimizer.lr: TINY's own LR is left out.
STUDY = [
    *tiny_study("tiny_study", searched=("optimizer.lr=",)),
    "callbacks.validation_schedule.every_n_steps=3",
    "callbacks.progress_bar.line_interval_s=0.01",
]


sweep = partial(run_sweep, STUDY)


def finished(job: Path) -> dict:
    return yaml.safe_load((job / "finished.yaml").read_text())


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> tuple[Path, Path, subprocess.CompletedProcess]:
    return finished_study(STUDY, tmp_path_factory, "study")


def test_arms_times_seeds_run_as_numbered_jobs(study) -> None:
    folder, _, result = study
    arms = [(load_run(folder / str(job)).arm, load_run(folder / str(job)).seed) for job in range(4)]
    assert arms == [("low_lr", 1), ("low_lr", 2), ("high_lr", 1), ("high_lr", 2)]
    assert load_run(folder / "2").setting("optimizer.lr") == 4e-3
    # Not a terminal: progress comes as log lines, never as carriage-return redraws.
    output = result.stdout + result.stderr
    assert "\r" not in output and " tokens (" in output and "elapsed" in output


def test_the_report_groups_seeds_and_judges_the_claims(study, tmp_path: Path) -> None:
    folder, _, _ = study
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "report.py"), str(folder), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr
    rows = {line.split(" | ")[0].strip("| "): line for line in result.stdout.splitlines() if line.startswith("| ")}
    assert "± " in rows["low_lr"] and "2 (1, 2)" in rows["high_lr"]
    report = study_report([folder])
    losses = {group.name: group.spread("val/loss") for group in report.groups}
    by_hand = [finished(folder / str(job))["metrics"]["val/loss"] for job in (2, 3)]
    assert losses["high_lr"].values == pytest.approx(tuple(by_hand), abs=1e-6)
    # 1e-4 against 4e-3 for 6 steps: the high LR is decisively lower, in every seed.
    assert max(losses["high_lr"].values) < min(losses["low_lr"].values)
    verdicts = {v.claim.claim: v.verdict for v in report.verdicts}
    assert verdicts == {"the higher LR ends lower": "holds", "the low LR is below the high LR's front": "fails"}
    assert "| the higher LR ends lower | val/loss difference" in result.stdout and "| holds |" in result.stdout
    for plot in ("val_loss.png", "val_loss_vs_steps.png", "val_loss_vs_time.png"):
        assert (tmp_path / plot).read_bytes().startswith(b"\x89PNG")


def test_the_same_command_skips_finished_jobs_and_resumes_an_interrupted_one(study, tmp_path: Path) -> None:
    original, cache, _ = study
    folder = tmp_path / "sweep"
    shutil.copytree(original, folder)
    # Job 3 "was killed" after its checkpoint at step 4: no marker, no later checkpoint.
    for leftover in ("finished.yaml", "checkpoints/last.ckpt", "checkpoints/step000006.ckpt"):
        (folder / "3" / leftover).unlink()
    result = sweep(folder, cache)
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr
    for job in (0, 1, 2):
        assert f"skipped job {job}: finished in an earlier run" in output
    assert "resuming job 3 from" in output and "step000004.ckpt" in output
    assert output.count("finished at step") == 1
    # The resumed job ends exactly where the uninterrupted one did, and its log reads as one run.
    assert finished(folder / "3")["metrics"]["val/loss"] == finished(original / "3")["metrics"]["val/loss"]
    assert [row["step"] for row in load_run(folder / "3").rows if "train/loss" in row] == [1, 2, 3, 4, 5, 6]


def test_a_job_folder_of_other_overrides_is_refused(study, tmp_path: Path) -> None:
    original, cache, _ = study
    folder = tmp_path / "sweep"
    shutil.copytree(original, folder)
    result = sweep(folder, cache, "optimizer.betas=[0.9,0.99]")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith("error: ")
    assert "holds a finished run of other overrides" in result.stderr and "new hydra.sweep.dir" in result.stderr


def test_a_job_held_by_a_live_worker_is_passed_by_and_a_dead_workers_lock_is_taken_over(study, tmp_path: Path) -> None:
    original, cache, _ = study
    folder = tmp_path / "sweep"
    shutil.copytree(original, folder)
    for job in (1, 2):  # to be trained again
        (folder / str(job) / "finished.yaml").unlink()
        shutil.rmtree(folder / str(job) / "checkpoints")
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:  # job 1 is "being trained" by a live process on this host
        (folder / "1" / LOCK).write_text(f"{socket.gethostname()} {other.pid}")
        result = sweep(folder, cache)
    finally:
        other.kill()
        other.wait()
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr
    assert f"passed job 1 by: another worker ({socket.gethostname()} {other.pid}) is training it" in output
    assert output.count("finished at step") == 1 and not (folder / "1" / "finished.yaml").exists()
    assert not (folder / "2" / LOCK).exists()  # released after training
    # Its process died without releasing the lock: the same command takes the job over.
    result = sweep(folder, cache)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (result.stdout + result.stderr).count("finished at step") == 1 and not (folder / "1" / LOCK).exists()
    assert finished(folder / "1")["metrics"]["val/loss"] == finished(original / "1")["metrics"]["val/loss"]


def test_a_lock_written_on_another_host_is_taken_over(tmp_path: Path) -> None:
    job = SweepJob(tmp_path, 0, [])
    (tmp_path / LOCK).write_text(f"not-{socket.gethostname()} {os.getpid()}")  # a requeued SLURM job's
    with job.claim(processes=1) as holder:
        assert holder is None and (tmp_path / LOCK).read_text() == f"{socket.gethostname()} {os.getpid()}"
        with job.claim(processes=1) as second:  # the same command's second worker, here
            assert second == f"{socket.gethostname()} {os.getpid()}"
    assert not (tmp_path / LOCK).exists()


def test_the_ranks_of_a_multi_process_job_do_not_lock_it(tmp_path: Path) -> None:
    """Every SLURM task of a job enters its folder: rank 1 must not pass by rank 0's job."""
    job, rank_zero = SweepJob(tmp_path, 0, []), f"{socket.gethostname()} {os.getppid()}"
    (tmp_path / LOCK).write_text(rank_zero)  # a live process on this host
    for processes in (2, None):
        with job.claim(processes=processes) as holder:
            assert holder is None
    assert (tmp_path / LOCK).read_text() == rank_zero  # neither taken nor removed


def test_a_single_run_refuses_a_folder_a_live_run_holds(tmp_path: Path) -> None:
    """Two jobs started in one second (torchft groups, SLURM array tasks) get the same
    time-stamped folder: the second stops with one line instead of mixing its logs in."""
    folder = tmp_path / "run"
    folder.mkdir()
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        (folder / LOCK).write_text(f"{socket.gethostname()} {other.pid}")
        result = run_train([*TINY, "trainer.max_steps=2", "logger=csv"], folder, tmp_path / "cache")
    finally:
        other.kill()
        other.wait()
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: {folder} is in use by another run ({socket.gethostname()} {other.pid}): give this run its own hydra.run.dir."
    ]
    assert not (folder / "csv").exists()


def test_sigterm_during_a_sweep_job_ends_the_sweep_and_the_same_command_resumes(tmp_path: Path) -> None:
    """A preempted sweep stops after the job in training saved its checkpoint; it does not go
    on to the next job (nor, in a tuned study, run the stopped one again)."""
    folder, cache = tmp_path / "sweep", tmp_path / "cache"
    command = [
        sys.executable,
        str(REPO / "train.py"),
        *STUDY,
        f"hydra.sweep.dir={folder}",
        f"paths.cache_dir={cache}",
        "+callbacks.pace._target_=benchmarks.pace.Pace",
        "+callbacks.pace.seconds=0.5",
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline", "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    checkpoint = folder / "0" / "checkpoints" / "step000002.ckpt"
    deadline = time.monotonic() + 120
    while not checkpoint.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 0, output[-3000:]
    assert "stopped job 0 before its end (SIGTERM or Ctrl-C): the sweep ends here" in output
    assert "finished at step" not in output  # its last line says "stopped at step", if any
    assert not (folder / "0" / "finished.yaml").exists() and not (folder / "1").exists()
    resumed = sweep(folder, cache)
    assert resumed.returncode == 0 and (folder / "3" / "finished.yaml").exists()
    assert "resuming job 0 from" in resumed.stdout + resumed.stderr

"""A tuned study end to end through `train.py -m`: the search extends the grid to the winner,
the winner is judged on other seeds with a paired interval, the same command resumes, and a
searched key that does not exist is one line before any job starts."""

import json
import os
import shutil
import socket
import subprocess
from functools import partial
from pathlib import Path

import pytest
import yaml

from analysis.runs import load_run
from study.report import study_report, write_report
from tests.run_helpers import REPO, finished_study, run_script, run_sweep, run_train, tiny_study

STUDY = tiny_study("tiny_tuned")


sweep = partial(run_sweep, STUDY)


def val_loss(job: Path) -> float:
    return yaml.safe_load((job / "finished.yaml").read_text())["metrics"]["val/loss"]


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> tuple[Path, Path]:
    return finished_study(STUDY, tmp_path_factory, "tuned")[:2]


def test_the_search_extends_past_the_edge_then_judges_the_winner_on_other_seeds(study) -> None:
    folder, _ = study
    runs = [load_run(folder / str(job)) for job in range(7)]
    tried = [(run.arm, run.phase, run.seed, run.setting("optimizer.lr")) for run in runs]
    # Round 1: the first grid (1e-3, 4e-3) on the tuning seed; 4e-3 won on the edge, so round 2
    # tries one step beyond (1.6e-2, the hard limit); then the winner and the fixed arm on 2, 3.
    assert tried == [
        ("tuned", "tune", 1, 1e-3),
        ("tuned", "tune", 1, 4e-3),
        ("tuned", "tune", 1, 1.6e-2),
        ("tuned", "judge", 2, 1.6e-2),
        ("tuned", "judge", 3, 1.6e-2),
        ("fixed", "judge", 2, 1e-4),
        ("fixed", "judge", 3, 1e-4),
    ]
    losses = [val_loss(folder / str(job)) for job in range(3)]
    assert losses[2] < losses[1] < losses[0]


def test_the_report_reads_the_search_back_and_judges_on_the_judging_seeds_only(study, tmp_path: Path) -> None:
    folder, _ = study
    report = study_report([folder])
    tuning = report.tunings[("tuned", "")]
    assert tuning.statuses == {"optimizer.lr": "at limit"} and tuning.tuned and len(tuning.results) == 3
    assert [group.name for group in report.judged_groups] == ["tuned optimizer.lr=0.016", "fixed"]
    (verdict,) = report.verdicts
    by_seed = {seed: val_loss(folder / str(job)) - val_loss(folder / str(job + 2)) for seed, job in ((2, 3), (3, 4))}
    mean = sum(by_seed.values()) / 2
    assert (
        verdict.verdict == "holds"
        and f"paired {mean:.4g} [" in verdict.measured[0]
        and "unpaired" in verdict.measured[0]
    )
    result = subprocess.run(
        ["python", str(REPO / "scripts" / "report.py"), str(folder), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr
    assert "| tuned | coordinate | 3 | optimizer.lr=0.016 |" in result.stdout and "lr: at limit" in result.stdout
    assert (tmp_path / "tuning_optimizer_lr.png").read_bytes().startswith(b"\x89PNG")


def test_the_same_command_resumes_a_study_stopped_mid_search(study, tmp_path: Path) -> None:
    original, cache = study
    folder = stopped_mid_search(original, tmp_path / "sweep")
    result = sweep(folder, cache)
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr
    assert "skipped job 0" in output and "skipped job 1" in output and "resuming job 2 from" in output
    assert output.count("finished at step") == 5  # job 2's rest and the four judging jobs
    assert [val_loss(folder / str(job)) for job in range(7)] == [val_loss(original / str(job)) for job in range(7)]


def stopped_mid_search(original: Path, folder: Path) -> Path:
    """A copy of the study as it stood during round 2: job 2 killed after its step-4
    checkpoint, no judging job yet."""
    shutil.copytree(original, folder)
    for leftover in ("finished.yaml", "checkpoints/last.ckpt", "checkpoints/step000006.ckpt"):
        (folder / "2" / leftover).unlink()
    for job in range(3, 7):
        shutil.rmtree(folder / str(job))
    return folder


def archive(*arguments: Path | str) -> subprocess.CompletedProcess:
    return run_script(REPO / "scripts" / "study_archive.py", [str(argument) for argument in arguments])


def test_a_study_archived_then_restored_on_a_new_machine_resumes_its_search_and_ends_the_same(
    study, tmp_path: Path
) -> None:
    """Only the archive crosses: job 2 (unfinished) reruns from scratch in the new folder, the
    judging jobs follow the search's record, and every loss equals the uninterrupted study's."""
    original, cache = study
    stopped = stopped_mid_search(original, tmp_path / "old_machine")
    assert archive("save", stopped, tmp_path / "archive").returncode == 0
    folder = tmp_path / "new_machine"
    restored = archive("restore", tmp_path / "archive", folder)
    assert restored.returncode == 0 and "restored 2 runs" in restored.stdout, restored.stderr
    result = sweep(folder, cache)
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr
    assert "skipped job 0" in output and "skipped job 1" in output and output.count("finished at step") == 5
    assert [val_loss(folder / str(job)) for job in range(7)] == [val_loss(original / str(job)) for job in range(7)]


def test_a_restored_study_reads_every_final_value_and_verdict_as_the_original(study, tmp_path: Path) -> None:
    original, _ = study
    assert archive("save", original, tmp_path / "archive").returncode == 0
    assert archive("restore", tmp_path / "archive", tmp_path / "restored").returncode == 0
    for job in range(7):
        before, after = load_run(original / str(job)), load_run(tmp_path / "restored" / str(job))
        keys = {key for row in before.rows for key in row}
        assert {key: after.final(key) for key in keys} == {key: before.final(key) for key in keys}
        assert after.config == before.config and after.overrides == before.overrides
        assert after.series("val/loss") == before.series("val/loss")
    # Saved again from the restored folder, the archive is the same, runs' machines included.
    assert archive("save", tmp_path / "restored", tmp_path / "again").returncode == 0
    lines = [(tmp_path / name / "runs.jsonl").read_text().splitlines() for name in ("archive", "again")]
    assert [json.loads(line) for line in lines[1]] == [json.loads(line) for line in lines[0]]
    old, new = study_report([original]), study_report([tmp_path / "restored"])
    assert [v.measured for v in new.verdicts] == [v.measured for v in old.verdicts] and new.verdicts
    assert new.tunings[("tuned", "")].statuses == old.tunings[("tuned", "")].statuses


def test_an_archive_refuses_to_drop_runs_or_to_mix_with_another_run_and_writes_nothing(study, tmp_path: Path) -> None:
    original, _ = study
    assert archive("save", original, tmp_path / "archive").returncode == 0
    runs = (tmp_path / "archive" / "runs.jsonl").read_text()
    partial = archive("save", stopped_mid_search(original, tmp_path / "partial"), tmp_path / "archive")
    assert partial.returncode == 2 and partial.stderr.startswith("error: ") and len(partial.stderr.splitlines()) == 1
    assert "holds run 2 " in partial.stderr and (tmp_path / "archive" / "runs.jsonl").read_text() == runs
    other = tmp_path / "other"
    record(other / "0", ["a=1"], finished=True)
    refused = archive("restore", tmp_path / "archive", other)
    assert refused.returncode == 2 and "holds a finished run of other overrides (a=1)" in refused.stderr
    assert sorted(path.name for path in other.iterdir()) == ["0"]
    training = tmp_path / "training"
    (training / "2").mkdir(parents=True)  # a live worker (this process) holds job 2's folder
    (training / "2" / "running.lock").write_text(f"{socket.gethostname()} {os.getpid()}")
    busy = archive("restore", tmp_path / "archive", training)
    assert busy.returncode == 2 and "a worker is training in" in busy.stderr and not (training / "0").exists()
    empty = archive("save", tmp_path / "partial" / "2", tmp_path / "nowhere")
    assert empty.returncode == 2 and "holds no finished run" in empty.stderr and not (tmp_path / "nowhere").exists()


def test_a_report_mid_search_says_the_curves_wait_for_judging_runs(study, tmp_path: Path) -> None:
    """Mid-search every finished run is a tuning run: the curve plots are skipped because no
    judging run has finished, not because the runs logged no loss (they did)."""
    original, _ = study
    folder = tmp_path / "sweep"
    shutil.copytree(original, folder)
    for job in range(3, 7):
        shutil.rmtree(folder / str(job))
    report = study_report([folder])
    assert report.tunings and not report.judged_groups and report.runs[0].series("val/loss")[1]
    skipped = write_report(report, tmp_path / "report")
    assert "val/loss against tokens seen: no judging run has finished yet, so val_loss.png was not written" in skipped
    assert (
        not any("no run logged it" in line for line in skipped) and not (tmp_path / "report" / "val_loss.png").exists()
    )


def test_a_searched_key_that_does_not_exist_is_one_line_before_any_job(tmp_path: Path) -> None:
    folder = tmp_path / "sweep"
    result = sweep(folder, tmp_path / "cache", "+study.search={optimizer.lrr:{low:0.001,high:0.004}}")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: study.search: optimizer.lrr is not a setting of arm tuned (`python train.py --cfg job` lists the keys);"
        " fix the key, or add the group that defines it to the arm's overrides."
    ]
    assert not folder.exists()


def test_a_study_crossed_with_sizes_tunes_each_size_and_budgets_tokens_per_parameter(tmp_path: Path) -> None:
    """Two widths on the command line: each is searched on its own, and its token budget is
    study.tokens_per_parameter x its parameter count."""
    folder = tmp_path / "sweep"
    overrides = [o for o in STUDY if not o.startswith("token_budget=")]  # the rule sets it; the command line would win
    result = run_train(
        [
            *overrides,
            f"hydra.sweep.dir={folder}",
            "model.vocab_size=320",
            "model.d_model=32,48",
            "+study.tokens_per_parameter=0.05",
            "study.arm=tuned",
        ],
        tmp_path / "unused",
        tmp_path / "cache",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    runs = [
        load_run(path) for path in sorted((p for p in folder.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    ]
    budgets = {run.setting("model.d_model"): run.setting("token_budget") for run in runs}
    from lightning_modules.llama import count_parameters
    from lightning_modules.llama_settings import LlamaSettings

    for width, budget in budgets.items():
        model = {k: v for k, v in runs[0].setting("model").items() if k not in ("_target_", "d_model")}
        assert budget == round(0.05 * count_parameters(LlamaSettings(**model, d_model=width)))
    report = study_report([folder])
    assert sorted(crossing for _, crossing in report.tunings) == [
        f"model.d_model={w} token_budget={budgets[w]}" for w in (32, 48)
    ]
    assert all(tuning.tuned for tuning in report.tunings.values())
    judged = [run for run in runs if run.phase == "judge"]
    assert sorted((run.setting("model.d_model"), run.seed) for run in judged) == [(32, 2), (32, 3), (48, 2), (48, 3)]


def test_a_study_that_gains_an_arm_keeps_its_finished_jobs_where_they_are(study, tmp_path: Path) -> None:
    """The new arm's judging jobs take the next free folders; no finished job is rerun or moved."""
    original, cache = study
    folder = tmp_path / "sweep"
    shutil.copytree(original, folder)
    preset = (REPO / "tests" / "configs" / "sweep" / "tiny_tuned.yaml").read_text()
    (tmp_path / "configs" / "sweep").mkdir(parents=True)  # the preset edited, the command line unchanged
    # The new arm first: numbered by position, every judging job would move to another folder.
    (tmp_path / "configs" / "sweep" / "tiny_tuned.yaml").write_text(
        preset.replace("  arms:\n", "  arms:\n    slow: [optimizer.lr=2e-4]\n")
    )
    study_here = [
        f"hydra.searchpath=[file://{tmp_path / 'configs'}]" if o.startswith("hydra.searchpath=") else o for o in STUDY
    ]
    result = run_train([*study_here, f"hydra.sweep.dir={folder}"], tmp_path / "unused", cache)
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr
    assert output.count("finished at step") == 2 and all(f"skipped job {job}:" in output for job in range(7))
    assert [load_run(folder / str(job)).arm for job in (7, 8)] == ["slow", "slow"]
    assert [val_loss(folder / str(job)) for job in range(7)] == [val_loss(original / str(job)) for job in range(7)]


def record(folder: Path, overrides: list[str], finished: bool) -> None:
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    if finished:
        (folder / "finished.yaml").write_text(yaml.safe_dump({"overrides": overrides, "metrics": {"val/loss": 1.0}}))


def test_job_folders_reuse_the_folder_of_the_same_overrides_and_number_new_jobs_after_all(tmp_path: Path) -> None:
    from study.job_folders import job_folders

    record(tmp_path / "0", ["a=1"], finished=True)
    record(tmp_path / "1", ["a=2"], finished=False)  # started, not finished: resumed in place
    (tmp_path / "3").mkdir()  # a folder no job started in still takes its number
    assert job_folders(tmp_path, [["a=3"], ["a=2"], ["a=1"], ["a=4"]]) == [4, 1, 0, 5]
    assert job_folders(tmp_path / "new", [["a=1"], ["a=2"]]) == [0, 1]
    # Planned, none started yet; a worker whose preset gained a job in front still agrees.
    assert job_folders(tmp_path / "new", [["n=1"], ["a=1"], ["a=2"]]) == [2, 0, 1]


def test_a_plain_study_whose_jobs_changed_stops_before_any_job_touches_a_folder(tmp_path: Path) -> None:
    from common.errors import ConfigError
    from study.jobs import refuse_other_runs

    record(tmp_path / "0", ["a=1"], finished=True)
    refuse_other_runs(tmp_path, [["a=1"], ["a=2"]])  # the same job 0: resumes
    with pytest.raises(ConfigError, match=r"/0 holds a finished run of other overrides \(a=1\), not job 0's \(b=1\)"):
        refuse_other_runs(tmp_path, [["b=1"], ["a=1"]])


def test_a_run_reads_the_overrides_it_finished_with_even_after_a_refused_job_rewrote_hydras_record(
    tmp_path: Path,
) -> None:
    record(tmp_path, ["a=1"], finished=True)
    (tmp_path / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(["b=1"]))  # a plain sweep's refused job
    (tmp_path / "csv").mkdir()
    (tmp_path / "csv" / "metrics.csv").write_text("step,train/tokens_seen,val/loss\n1,100,2.0\n")
    assert load_run(tmp_path).overrides == ["a=1"]

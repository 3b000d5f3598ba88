"""A study with the joint searcher end to end through `train.py -m`: the anchor runs in the
first round, the budget is spent in rounds, a study stopped mid-search resumes into the same
jobs and folders, and bad search settings are one line before any job starts."""

import shutil
from functools import partial
from pathlib import Path

import pytest
import yaml

from analysis.runs import load_run
from study.report import study_report
from tests.run_helpers import finished_study, run_sweep, tiny_study

STUDY = tiny_study("tiny_joint")


sweep = partial(run_sweep, STUDY)


def jobs(folder: Path) -> list[tuple[str, str, int, float]]:
    runs = [
        load_run(path) for path in sorted((p for p in folder.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    ]
    return [(run.arm, run.phase, run.seed, run.setting("optimizer.lr")) for run in runs]


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> tuple[Path, Path]:
    return finished_study(STUDY, tmp_path_factory, "joint")[:2]


def test_the_anchor_runs_first_and_the_budget_is_spent_before_judging(study) -> None:
    folder, _ = study
    tried = jobs(folder)
    tuning = [job for job in tried if job[1] == "tune"]
    assert tuning[0] == ("tuned", "tune", 1, 1e-3) and len(tuning) == 3 == len({lr for *_, lr in tuning})
    assert all(2.5e-4 <= lr <= 1.6e-2 for *_, lr in tuning)
    report = study_report([folder])
    search = report.tunings[("tuned", "")]
    judged = {(arm, seed) for arm, phase, seed, _ in tried if phase == "judge"}
    # The winner is judged only if tuned; the fixed arm always.
    assert {("fixed", 2), ("fixed", 3)} <= judged and (("tuned", 2) in judged) == search.tuned
    if search.tuned:
        winner = search.space.labels(search.winner)["optimizer.lr"]
        assert {lr for arm, phase, _, lr in tried if (arm, phase) == ("tuned", "judge")} == {float(winner)}


def test_a_study_stopped_mid_search_resumes_into_the_same_jobs(study, tmp_path: Path) -> None:
    original, cache = study
    folder = tmp_path / "sweep"
    shutil.copytree(original, folder)
    # Stopped in round 2: its job (folder 2) unfinished, nothing after it.
    for job in (p for p in folder.iterdir() if p.name.isdigit() and int(p.name) >= 2):
        shutil.rmtree(job)
    registry = yaml.safe_load((folder / "job_folders.yaml").read_text())
    (folder / "job_folders.yaml").write_text(yaml.safe_dump([entry for entry in registry if entry["folder"] < 2]))
    result = sweep(folder, cache)
    assert result.returncode == 0, result.stderr[-3000:]
    assert jobs(folder) == jobs(original)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            ["study.searcher=bayes"],
            "error: study.searcher='bayes' is not a searcher; use one of gp, tpe, random, coordinate (gp is the default).",
        ),
        (
            ["study.budget=1"],
            "error: study.budget=1 leaves no point to search beside the arm's 1 anchor(s); give at least 2.",
        ),
        (
            ["study.arms.tuned.anchors=[{optimizer.lr:0.003}]"],
            "error: study.arms.tuned.anchors[0]: optimizer.lr=0.003 is not a point of the search space; use a grid value within the"
            " search's span (0.00025, 0.001, 0.004, 0.016).",
        ),
        (
            ["study.arms.tuned.anchors=[{optimizer.beta2:0.95}]"],
            "error: study.arms.tuned.anchors[0] names ['optimizer.beta2'], which the arm does not search (it searches ['optimizer.lr']):"
            " drop it or search it.",
        ),
        (
            ["+study.previous_size_anchor=true"],
            "error: study.previous_size_anchor (arm tuned) anchors each size on the next smaller one's winner, but this study"
            " runs one model: cross it with sizes (model=a,b,...) or drop previous_size_anchor.",
        ),
    ],
)
def test_bad_search_settings_are_one_line_before_any_job(tmp_path: Path, extra: list[str], message: str) -> None:
    folder = tmp_path / "sweep"
    result = sweep(folder, tmp_path / "cache", *extra)
    assert result.returncode == 2 and result.stderr.strip().splitlines() == [message]
    assert not folder.exists()


def test_a_seed_cap_below_the_seeds_already_judged_is_refused(study, tmp_path: Path) -> None:
    original, cache = study
    folder = tmp_path / "sweep"
    shutil.copytree(original, folder)
    result = sweep(folder, cache, "study.seeds={first:[2],max:1}")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: study.seeds.max=1 is below the 2 judging seeds this study already ran (2, 3); raise it to at least 2."
    ]

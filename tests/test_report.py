"""The report command on a real multirun sweep of the tiny model, and on hand-made runs."""

import csv
import statistics
from pathlib import Path

import numpy as np
import pytest
import yaml

from analysis.runs import FINISHED, find_runs, load_run
from common.errors import ConfigError
from study.preset import StudySpec
from study.report import PLOTS, band, build_report, pareto_front, study_report, write_report
from tests.run_helpers import REPO, TINY, run_script

SWEEP = [
    *TINY,
    "trainer.max_steps=4",
    "token_budget=null",
    "lr_schedule.name=constant",
    "logger=csv",
    "callbacks.throughput.peak_flops_per_device=1e11",
]


def last_logged(metrics: Path, key: str) -> float:
    """The last non-empty value of a column, read with the csv module alone."""
    with open(metrics, newline="") as file:
        return [float(row[key]) for row in csv.DictReader(file) if row[key]][-1]


def table_rows(markdown: str) -> dict[str, list[str]]:
    """Row label -> cells, for the data rows of the first markdown table."""
    lines = markdown.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| "))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    rows = [line.strip("|").split(" | ") for line in lines[start:end] if line.startswith("| ")]
    return {cells[0].strip(): [cell.strip() for cell in cells[1:]] for cells in rows[1:]}


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    """Two jobs of `python train.py -m`, differing only in the seed."""
    tmp = tmp_path_factory.mktemp("sweep")
    cache = tmp_path_factory.getbasetemp() / "cache"
    arguments = ["-m", f"hydra.sweep.dir={tmp / 'sweep'}", f"paths.cache_dir={cache}", *SWEEP, "seed=1,2"]
    result = run_script(REPO / "train.py", arguments)
    assert result.returncode == 0, result.stderr[-3000:]
    return tmp / "sweep"


def test_report_on_a_sweep_groups_the_seeds_and_plots_every_metric(sweep: Path, tmp_path: Path) -> None:
    out = tmp_path / "report"
    result = run_script(REPO / "scripts" / "report.py", [str(sweep), "--out", str(out)])
    assert result.returncode == 0, result.stderr
    for plot in PLOTS:
        assert (out / plot.file).read_bytes().startswith(b"\x89PNG"), plot.file
    groups = table_rows(result.stdout)
    assert len(groups) == 1  # the two jobs differ only in their seed
    (cells,) = groups.values()
    assert cells[0] == "2 (1, 2)"
    losses = [last_logged(sweep / job / "csv" / "metrics.csv", "val/loss") for job in ("0", "1")]
    mean, std = (float(part) for part in cells[1].split(" ± "))
    assert (mean, std) == pytest.approx((statistics.fmean(losses), statistics.stdev(losses)), abs=5e-5)
    assert cells[2] == "4 ± 0" and cells[3] == "1,024 ± 0"  # optimizer steps, tokens
    assert float(cells[4].split(" ± ")[0]) > 0  # training wall time
    assert table_rows((out / "report.md").read_text()) == groups


def test_runs_read_the_csv_logs_and_the_hydra_overrides(sweep: Path) -> None:
    runs = find_runs([sweep])
    assert [run.path.name for run in runs] == ["0", "1"]
    run = runs[1]
    assert "seed=2" in run.overrides and run.setting("seed") == 2
    assert run.setting("model.d_model") == 32 and run.setting("no.such.key") is None
    tokens, losses = run.series("train/loss")
    assert tokens == [256.0, 512.0, 768.0, 1024.0] and len(losses) == 4
    assert run.final("val/loss") == last_logged(run.path / "csv" / "metrics.csv", "val/loss")
    assert run.final("not/logged") is None


def write_run(folder: Path, header: str, rows: list[str], overrides: list[str]) -> None:
    """A run folder by hand: metrics.csv, an empty config and the Hydra overrides."""
    (folder / "csv").mkdir(parents=True)
    (folder / "csv" / "metrics.csv").write_text("\n".join([header, *rows]) + "\n")
    (folder / "csv" / "hparams.yaml").write_text("{}\n")
    (folder / ".hydra").mkdir()
    (folder / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))


def test_a_metric_no_run_logged_is_skipped_and_jobs_sort_numerically(tmp_path: Path) -> None:
    header = "step,train/tokens_seen,train/loss,val/loss"
    for job in (10, 2):
        write_run(tmp_path / "sweep" / str(job), header, ["1,100,5.0,", f"2,200,4.0,{job}.5"], ["x=1", f"job={job}"])
    runs = find_runs([tmp_path / "sweep", tmp_path / "sweep" / "2"])
    assert [run.path.name for run in runs] == ["2", "10"]
    assert runs[0].series("val/loss") == ([200.0], [2.5]) and runs[0].name == "x=1 job=2"
    report = build_report(runs)
    assert [group.name for group in report.groups] == ["job=2", "job=10"]
    skipped = write_report(report, tmp_path / "out")
    assert (tmp_path / "out" / "val_loss.png").exists() and (tmp_path / "out" / "val_loss_vs_steps.png").exists()
    missing = [plot for plot in PLOTS if plot.key != "val/loss" or plot.x == "time/train_seconds"]
    assert [message.split(" against ")[0] for message in skipped] == [plot.key for plot in missing]
    assert set(table_rows((tmp_path / "out" / "report.md").read_text())) == {"job=2", "job=10"}


def test_a_sweep_job_that_has_not_finished_is_left_out_and_named(tmp_path: Path) -> None:
    """Jobs 0 and 1 finished (their ``finished.yaml``); job 2 was interrupted at a high loss:
    its group would read 6.0 if it counted. A folder of single runs (no marker) is read whole."""
    header = "step,train/tokens_seen,val/loss"
    for job, loss in ((0, 2.0), (1, 3.0), (2, 6.0)):
        write_run(tmp_path / "sweep" / str(job), header, [f"1,100,{loss}"], ["arm=a", f"seed={job}"])
    for job in (0, 1):
        (tmp_path / "sweep" / str(job) / FINISHED).write_text("overrides: []\n")
    report = study_report([tmp_path / "sweep"])
    assert [run.path.name for run in report.unfinished] == ["2"]
    assert [[run.final("val/loss") for run in group.runs] for group in report.groups] == [[2.0, 3.0]]
    assert "Left out: 1 sweep job(s) that have not finished (interrupted or still training): 2." in report.markdown()
    (tmp_path / "sweep" / "0" / FINISHED).unlink()
    (tmp_path / "sweep" / "1" / FINISHED).unlink()
    assert len(study_report([tmp_path / "sweep"]).groups[0].runs) == 3


def test_the_rows_a_resumed_run_logged_again_are_replaced_by_the_new_ones(tmp_path: Path) -> None:
    """Logged to step 4, resumed from step 2: steps 3 and 4 were logged twice, the later rows count."""
    rows = ["1,1.0,", "2,2.0,", "2,,9.0", "3,3.0,", "4,4.0,", "3,3.5,", "4,4.5,", "4,,8.0", "5,5.0,"]
    write_run(tmp_path / "run", "step,train/loss,val/loss", rows, [])
    run = load_run(tmp_path / "run")
    assert [(row["step"], row.get("train/loss"), row.get("val/loss")) for row in run.rows] == [
        (1, 1.0, None),
        (2, 2.0, None),
        (2, None, 9.0),
        (3, 3.5, None),
        (4, 4.5, None),
        (4, None, 8.0),
        (5, 5.0, None),
    ]


def test_spikes_count_each_rise_above_the_threshold_once(tmp_path: Path) -> None:
    """Two excursions above 1.2 (one lasting two steps), then a diverged step: three spikes."""
    ratios = [1.0, 1.0, 1.3, 1.25, 1.0, 1.2, 1.1, 1.5, 1.0, "nan"]
    write_run(tmp_path / "run", "step,stability/loss_spike_ratio", [f"{i},{r}" for i, r in enumerate(ratios)], [])
    run = load_run(tmp_path / "run")
    assert run.value("spikes(stability/loss_spike_ratio>1.2)") == 3.0
    assert run.value("spikes(stability/loss_spike_ratio>1.4)") == 2.0
    assert run.value("spikes(train/loss>1.2)") is None


def test_a_spike_column_without_a_threshold_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="needs a threshold"):
        StudySpec.from_config({"arms": {"a": ["x=1"]}, "seeds": [1], "columns": ["spikes(stability/loss_spike_ratio)"]})


def test_a_study_whose_preset_gained_an_arm_is_judged_by_its_newest_block(tmp_path: Path) -> None:
    """Jobs 0-1 ran before arm `b` and its claim were appended; job 2 ran after: the report
    names b as an arm and judges the claim (it reads the last job's study block)."""
    old = {"arms": {"a": ["x=1"]}, "seeds": [1]}
    new = {
        "arms": {"a": ["x=1"], "b": ["x=2"]},
        "seeds": [1],
        "claims": [{"arm": "b", "baseline": "a", "expect": {"val/loss": {"lower_than": 0.0}}}],
    }
    for job, (arm, seed, block) in enumerate([("a", 1, old), ("a", 2, old), ("b", 1, new)]):
        folder = tmp_path / "sweep" / str(job)
        write_run(
            folder, "step,val/loss", [f"1,{2.0 + job}"], [f"x={1 + (arm == 'b')}", f"study.arm={arm}", f"seed={seed}"]
        )
        (folder / "csv" / "hparams.yaml").write_text(yaml.safe_dump({"seed": seed, "study": {**block, "arm": arm}}))
    report = build_report(find_runs([tmp_path / "sweep"]))
    assert [group.name for group in report.groups] == ["a", "b"]
    assert [v.claim.arm for v in report.verdicts] == ["b"]


def test_the_pareto_front_keeps_the_points_nothing_beats() -> None:
    points = {
        "a": (10.0, 3.0),
        "b": (20.0, 2.5),
        "c": (20.0, 2.7),
        "d": (40.0, 2.6),
        "e": (80.0, 2.0),
        "f": (10.0, 3.0),
    }
    # brute force: c is beaten by b (same x, lower y), d by b (less x, lower y); a and f tie
    assert pareto_front(points) == ["a", "f", "b", "e"]


def test_a_study_with_a_front_claim_plots_the_front(tmp_path: Path) -> None:
    study = {
        "arms": {"c16": ["b=16"], "c64": ["b=64"], "adaptive": ["t=a"]},
        "seeds": [1, 2],
        "claims": [{"arm": "adaptive", "front": ["c16", "c64"]}],
    }
    runs = [("c16", 100, 2.0), ("c64", 25, 2.3), ("adaptive", 40, 2.1)]
    for job, ((arm, steps, loss), seed) in enumerate((r, seed) for r in runs for seed in (1, 2)):
        folder = tmp_path / "sweep" / str(job)
        rows = [f"1,{loss + 1},", f"{steps},,{loss + 0.01 * seed}"]
        write_run(folder, "step,train/loss,val/loss", rows, [*study["arms"][arm], f"study.arm={arm}", f"seed={seed}"])
        (folder / "csv" / "hparams.yaml").write_text(yaml.safe_dump({"seed": seed, "study": {**study, "arm": arm}}))
    report = build_report(find_runs([tmp_path / "sweep"]))
    write_report(report, tmp_path / "out")
    assert (tmp_path / "out" / "front.png").read_bytes().startswith(b"\x89PNG")
    assert (
        "![final loss against optimizer steps, with the front](front.png)"
        in (tmp_path / "out" / "report.md").read_text()
    )


def test_band_interpolates_seeds_onto_the_x_values_they_share() -> None:
    first = (np.array([0.0, 10.0, 20.0]), np.array([3.0, 2.0, 1.0]))
    second = (np.array([0.0, 5.0, 15.0]), np.array([4.0, 3.0, 2.0]))  # ends at 15
    grid, mean, low, high = band([first, second])
    assert grid.tolist() == [0.0, 5.0, 10.0, 15.0]
    second_on_grid = [4.0, 3.0, 2.5, 2.0]  # 10 lies halfway between 5 and 15
    first_on_grid = [3.0, 2.5, 2.0, 1.5]
    assert mean.tolist() == pytest.approx([(a + b) / 2 for a, b in zip(first_on_grid, second_on_grid)])
    assert low.tolist() == pytest.approx(list(map(min, first_on_grid, second_on_grid)))
    assert high.tolist() == pytest.approx(list(map(max, first_on_grid, second_on_grid)))


def test_missing_runs_are_an_error_that_names_the_folder(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="logger=csv"):
        load_run(tmp_path)
    with pytest.raises(FileNotFoundError, match=str(tmp_path)):
        find_runs([tmp_path])


def test_a_study_crossed_with_one_number_gets_its_headline_figure(tmp_path: Path) -> None:
    """Two arms x three learning rates x two seeds, made by hand: the figure's axis is the
    learning rate, and each point is the arm's mean at that rate."""
    from study.report import crossed_axis

    study = {
        "arms": {"base": [], "warm": ["+technique=seq_len_warmup"]},
        "seeds": [1, 2],
        "columns": ["max(stability/loss_spike_ratio)"],
    }
    losses = {}
    for job, (arm, lr, seed) in enumerate(
        (a, lr, s) for a in ("base", "warm") for lr in (1e-3, 4e-3, 1.6e-2) for s in (1, 2)
    ):
        folder = tmp_path / "sweep" / str(job)
        (folder / "csv").mkdir(parents=True)
        (folder / ".hydra").mkdir()
        loss = 3.0 + lr * 10 * (1 if arm == "base" else 2) + seed * 0.01
        losses.setdefault((arm, lr), []).append(loss)
        overrides = [*study["arms"][arm], f"optimizer.lr={lr}", f"study.arm={arm}", f"seed={seed}"]
        (folder / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
        (folder / "csv" / "hparams.yaml").write_text(yaml.safe_dump({"seed": seed, "study": {"arm": arm, **study}}))
        (folder / "csv" / "metrics.csv").write_text(
            f"step,train/tokens_seen,val/loss,stability/loss_spike_ratio\n5,100,{loss},1.1\n"
        )
    report = build_report(find_runs([tmp_path / "sweep"]))
    key, values = crossed_axis(report.judged_groups, report.spec)
    assert key == "optimizer.lr" and sorted(set(values.values())) == [1e-3, 4e-3, 1.6e-2]
    for group in report.judged_groups:
        assert group.spread("val/loss").mean == pytest.approx(statistics.fmean(losses[(group.arm, values[group.name])]))
    write_report(report, tmp_path / "out")
    assert (tmp_path / "out" / "crossed.png").read_bytes().startswith(b"\x89PNG")
    assert "crossed.png" in (tmp_path / "out" / "report.md").read_text()

"""The report command on a real multirun sweep of the tiny model, and on hand-made runs."""

import csv
import subprocess
import sys
from pathlib import Path

import pytest

from analysis.report import PLOTS, write_report
from analysis.runs import find_runs, load_run
from tests.run_helpers import REPO, TINY, run_train

SWEEP = [*TINY, "trainer.max_steps=4", "token_budget=null", "lr_schedule.name=constant", "logger=csv",
         "callbacks.throughput.peak_flops_per_device=1e11"]  # fmt: skip


def last_logged(metrics: Path, key: str) -> float:
    """The last non-empty value of a column, read with the csv module alone."""
    with open(metrics, newline="") as file:
        return [float(row[key]) for row in csv.DictReader(file) if row[key]][-1]


def table_rows(markdown: str) -> dict[str, list[str]]:
    """Run label -> cells, for the data rows of the first markdown table."""
    rows = [line.strip("|").split(" | ") for line in markdown.splitlines() if line.startswith("| ")]
    return {cells[0].strip(): [cell.strip() for cell in cells[1:]] for cells in rows[1:]}


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    """Two jobs of `python train.py -m`, differing only in the seed."""
    tmp = tmp_path_factory.mktemp("sweep")
    # hydra.mode=MULTIRUN is `-m` as an override: run_train puts its own overrides first.
    result = run_train(["hydra.mode=MULTIRUN", f"hydra.sweep.dir={tmp / 'sweep'}", *SWEEP, "seed=1,2"],
                       tmp / "unused", tmp_path_factory.getbasetemp() / "cache")  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return tmp / "sweep"


def test_report_on_a_sweep_plots_every_metric_and_tables_final_losses(sweep: Path, tmp_path: Path) -> None:
    out = tmp_path / "report"
    result = subprocess.run([sys.executable, str(REPO / "scripts" / "report.py"), str(sweep), "--out", str(out)],
                            capture_output=True, text=True, cwd=REPO)  # fmt: skip
    assert result.returncode == 0, result.stderr
    for plot in PLOTS:
        assert (out / plot.file).read_bytes().startswith(b"\x89PNG"), plot.file
    rows = table_rows((out / "report.md").read_text())
    assert set(rows) == {"seed=1", "seed=2"}
    for job, label in (("0", "seed=1"), ("1", "seed=2")):
        expected = last_logged(sweep / job / "csv" / "metrics.csv", "val/loss")
        assert float(rows[label][0]) == pytest.approx(expected, abs=5e-5)
    assert table_rows(result.stdout) == rows


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
    header = "train/tokens_seen,train/loss,val/loss"
    for job in (10, 2):
        write_run(tmp_path / "sweep" / str(job), header, ["100,5.0,", f"200,4.0,{job}.5"], ["x=1", f"job={job}"])
    runs = find_runs([tmp_path / "sweep", tmp_path / "sweep" / "2"])
    assert [run.path.name for run in runs] == ["2", "10"]
    assert runs[0].series("val/loss") == ([200.0], [2.5]) and runs[0].name == "x=1 job=2"
    skipped = write_report(runs, tmp_path / "out")
    assert (tmp_path / "out" / "val_loss.png").exists()
    missing = [plot for plot in PLOTS if plot.key != "val/loss"]
    assert [message.split(":")[0] for message in skipped] == [plot.key for plot in missing]
    assert not any((tmp_path / "out" / plot.file).exists() for plot in missing)
    assert set(table_rows((tmp_path / "out" / "report.md").read_text())) == {"job=2", "job=10"}


def test_missing_runs_are_an_error_that_names_the_folder(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="logger=csv"):
        load_run(tmp_path)
    with pytest.raises(FileNotFoundError, match=str(tmp_path)):
        find_runs([tmp_path])

"""A run under a parallel layout against one process: the same steps and the same rows.

Shared by the tensor- and pipeline-parallel tests: ten AdamW steps of the tiny model at a
global batch of 8, logged every step and validated at steps 5 and 10, each rank writing the
content hashes of the rows it trains on.
"""

import csv
from collections.abc import Callable
from pathlib import Path

import pytest

from benchmarks.row_log import rows_by_step
from common.errors import ConfigError
from launch.from_config import read_settings
from tests.run_helpers import REPO, compose_config, run_to_completion, train_in_process

STEPS = [
    "trainer.max_steps=10",
    "logger=csv",
    "callbacks.validation_schedule.every_n_steps=5",
    "trainer.log_every_n_steps=1",
]
# perf/model_flops_per_token: MFU counts the whole model's FLOPs, whatever the layout.
COMPARED = ("train/loss", "train/grad_norm", "train/sequences_seen", "perf/model_flops_per_token")
# The adaptive batch's augmented inner-product test (its norm-test, inner-product and
# orthogonality statistics, summed over the ranks that split the model), growing the batch.
ADAPTIVE_BATCH = (
    "+experiment=adaptive_bs",
    "technique.adaptive_batch.test=augmented_inner_product",
    "batch.max_global_batch_size=32",  # from 16: the batch grows, and the steps stay small
)
# Sequence-length warmup from 8 to 32 tokens over the ten steps (lengths of 8, 16, 24, 32).
SEQ_LEN_WARMUP = (
    "+technique=seq_len_warmup",
    "technique.seq_len_warmup.total_curriculum_step=8",
    "technique.seq_len_warmup.preallocate=false",
)
Steps = dict[int, dict[str, float]]
Rows = dict[int, list[str]]


def row_log(run_dir: Path) -> list[str]:
    """Each rank writes the content hashes of the rows it trains on (``benchmarks/row_log.py``)."""
    return ["+callbacks.row_log._target_=benchmarks.row_log.RowLog", f"+callbacks.row_log.path={run_dir / 'rows'}"]


def logged(run_dir: Path) -> Steps:
    """Each step's loss, gradient norm, sequences seen, FLOPs per token, adaptive-batch
    statistics and (at steps 5 and 10) validation loss."""
    steps: Steps = {}
    with open(run_dir / "csv" / "metrics.csv") as file:
        for row in csv.DictReader(file):
            names = COMPARED + ("adaptive_bs/",) if row.get("train/loss") else ("val/loss",)
            values = {name: float(value) for name, value in row.items() if value and name.startswith(names)}
            steps.setdefault(int(row["step"]), {}).update(values)
    return steps


def one_process_runs(tmp_path_factory, base: list[str]) -> Callable[[tuple[str, ...]], tuple[Steps, Rows]]:
    """The one-process run of ``base`` plus a set of overrides (each set run once): its steps and rows."""
    runs: dict[tuple[str, ...], tuple[Steps, Rows]] = {}

    def run(extra: tuple[str, ...]) -> tuple[Steps, Rows]:
        if extra not in runs:
            run_dir = tmp_path_factory.mktemp("one")
            cache = tmp_path_factory.getbasetemp() / "cache"
            run_to_completion(base + STEPS + list(extra) + row_log(run_dir), run_dir, cache)
            runs[extra] = logged(run_dir), rows_by_step(run_dir / "rows")
        return runs[extra]

    return run


def assert_one_process_s_steps(
    run_dir: Path, reference: tuple[Steps, Rows], model_parallel: int, processes: int
) -> None:
    """The ranks of each model-parallel group (``model_parallel`` consecutive ranks) read the
    same rows, the groups together one process's; every step's metrics within 1e-5 relative;
    the per-device rate the global rate over every process."""
    reference_steps, reference_rows = reference
    ranks = sorted((run_dir / "rows").glob("rank*.txt"), key=lambda path: int(path.stem.removeprefix("rank")))
    for first in range(0, len(ranks), model_parallel):
        group = [ranks[first + offset].read_text() for offset in range(model_parallel)]
        assert group == [group[0]] * model_parallel
        for path in ranks[first + 1 : first + model_parallel]:
            path.unlink()
    assert rows_by_step(run_dir / "rows") == reference_rows
    steps = logged(run_dir)
    assert steps.keys() == reference_steps.keys() and len(steps) == 10
    for step, metrics in steps.items():
        assert metrics.keys() == reference_steps[step].keys()
        assert metrics == pytest.approx(reference_steps[step], rel=1e-5), (step, metrics, reference_steps[step])
    with open(run_dir / "csv" / "metrics.csv") as file:
        rates = [row for row in csv.DictReader(file) if row.get("perf/tokens_per_sec")]
    assert rates and all(
        float(row["perf/tokens_per_sec_per_device"]) == pytest.approx(float(row["perf/tokens_per_sec"]) / processes)
        for row in rates
    )


def assert_refused_in_one_line(overrides: list[str], message: str, tmp_path: Path) -> None:
    """Exit code 2, the last line the error naming ``message``, and no run folder left."""
    code, stderr = train_in_process(overrides, tmp_path / "run", tmp_path / "cache")
    lines = stderr.strip().splitlines()
    assert code == 2 and lines[-1].startswith("error: ") and message in lines[-1], stderr[-2000:]
    assert not (tmp_path / "run").exists()


EXPERIMENTS = sorted(path.stem for path in (REPO / "conf" / "experiment").glob("*.yaml"))


def assert_composes_or_refuses_in_one_line(overrides: list[str], key: str, tmp_path: Path) -> None:
    """The settings of ``overrides`` are accepted, or refused in one line naming ``key``."""
    try:
        read_settings(compose_config(overrides, tmp_path))
    except ConfigError as error:
        assert "\n" not in str(error) and key in str(error), str(error)

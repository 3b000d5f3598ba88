"""The critical-batch measurement: branches continue the base run's checkpoints at the
planned batch and sqrt-scaled learning rate for the window, and the report's critical batch
is the rule applied to the branches' own final losses."""

import math
import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from analysis.critical_batch import critical_batch
from analysis.runs import find_runs
from benchmarks.tiny_run import TINY_MODEL
from common.errors import ConfigError
from tests.run_helpers import REPO, compose_config

SMALL = [
    *TINY_MODEL,
    "model.n_layers=1",
    "lr_schedule.warmup_steps=1",
    "callbacks.model_checkpoint.every_n_train_steps=2",
    "trainer.num_sanity_val_steps=0",
    "trainer.log_every_n_steps=1",
]
BASE_LR, BASE_BATCH, SEQ_LEN, WINDOW = 8e-3, 16, 32, 1024  # the default peak LR


def script(folder: Path, cache: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, str(REPO / "scripts" / "critical_batch.py"), "--dir", str(folder), *extra]
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


def test_the_rule_takes_the_largest_batch_within_the_tolerance() -> None:
    losses = {16: 2.000, 32: 2.004, 64: 2.030, 128: 2.009, 256: 2.2}
    assert critical_batch(losses, 0.01) == 128  # the largest within 0.01, even past a worse one
    assert critical_batch(losses, 0.001) == 16
    assert critical_batch({16: 2.0, 32: 1.9}, 0.0) == 32  # a larger batch may also be better


def test_overrides_the_script_sets_are_refused(tmp_path: Path) -> None:
    result = script(tmp_path / "cb", tmp_path / "cache", "optimizer.lr=1e-3")
    assert result.returncode == 2 and result.stderr.strip().startswith("error: optimizer.lr=1e-3: the script sets")
    assert not (tmp_path / "cb").exists()


def test_a_folder_that_cannot_be_created_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "a_file").write_text("")
    result = script(tmp_path / "a_file" / "cb", tmp_path / "cache")
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip() == (
        f"error: --dir {tmp_path / 'a_file' / 'cb'}: cannot create this folder (Not a directory); give a folder you can write to."
    )


def test_the_branches_continue_the_base_runs_model_and_data(tmp_path: Path) -> None:
    """Without overrides the branch preset composes the base preset's model and data, so a
    branch can load a base checkpoint."""
    script = runpy.run_path(str(REPO / "scripts" / "critical_batch.py"))  # its functions, main not run
    preset = script["BRANCH_PRESET"]
    script["write_branch_preset"](tmp_path / "conf" / "sweep" / f"{preset}.yaml", {"b": ["seed=1"]})
    base = compose_config(["+sweep=critical_batch"], tmp_path)
    branches = compose_config([f"hydra.searchpath=[file://{tmp_path / 'conf'}]", f"+sweep={preset}"], tmp_path)
    assert branches.model == base.model and branches.data == base.data


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("critical") / "cb"
    cache = tmp_path_factory.getbasetemp() / "cache"
    arguments = ["--seeds", "3", "--steps", "2", "4", "--batches", "16", "32", "--window", str(WINDOW)]
    result = script(folder, cache, *arguments, *SMALL, f"paths.cache_dir={cache}")
    assert result.returncode == 0, result.stderr[-3000:]
    return folder


def test_branches_continue_the_checkpoint_at_their_batch_and_scaled_lr(measured: Path) -> None:
    branches = find_runs([measured / "branches"])
    assert sorted(run.arm for run in branches) == [f"seed3_step0000{s}_b00{b}" for s in (2, 4) for b in (16, 32)]
    for run in branches:
        step, batch = int(run.arm.split("_")[1][4:]), int(run.arm.split("_")[2][1:])
        start = step * BASE_BATCH * SEQ_LEN
        assert run.seed == 3 and run.setting("ckpt_path").endswith(f"base/0/checkpoints/step{step:06d}.ckpt")
        rows = [row for row in run.rows if "train/lr" in row]
        assert rows[0]["step"] == step + 1  # the first step after the checkpoint
        assert {row["train/global_batch_size"] for row in rows} == {batch}
        assert rows[-1]["train/lr"] == pytest.approx(BASE_LR * math.sqrt(batch / BASE_BATCH))
        assert run.final("tokens") == start + WINDOW


def test_the_report_applies_the_rule_to_the_branches_losses(measured: Path) -> None:
    losses: dict[int, dict[int, float]] = {}
    for marker in (measured / "branches").glob("*/finished.yaml"):
        record = yaml.safe_load(marker.read_text())
        arm = next(o for o in record["overrides"] if o.startswith("study.arm="))
        step, batch = int(arm.split("_")[1][4:]), int(arm.split("_")[2][1:])
        losses.setdefault(step, {})[batch] = record["metrics"]["val/loss"]
    report = (measured / "report" / "critical_batch.md").read_text()
    for step, by_batch in losses.items():
        best = max(b for b, loss in by_batch.items() if loss <= by_batch[16] + 0.01)
        row = next(line for line in report.splitlines() if line.startswith(f"| 3 | {step} |"))
        assert row.split("|")[6].strip() == (f">= {best}" if best == 32 else str(best))
    assert (measured / "report" / "critical_batch.png").stat().st_size > 10_000


def test_the_growth_fit_recovers_known_exponents_in_tokens_and_size(tmp_path: Path) -> None:
    """B* = 2 t^0.5 N^0 (powers of two, as the grid measures them, up to rounding) at two
    sizes and three seeds: the token exponent is found, the size exponent is not."""
    from analysis.critical_batch import BranchPoint, growth, plot_by_size

    def points(n: float, wobble: float) -> list:
        return [
            BranchPoint(seed, step, tokens, {}, round(2 * tokens**0.5 * (1 + wobble * (seed - 2))), False, None, None)
            for seed in (1, 2, 3)
            for step, tokens in ((25, 102_400), (50, 204_800), (100, 409_600), (200, 819_200))
        ]

    found = growth({3e5: points(3e5, 0.01), 1.2e6: points(1.2e6, -0.01)})
    assert found.tokens[0] == pytest.approx(0.5, abs=0.01) and found.tokens[1] > 0.45
    assert found.size[1] < 0 < found.size[2] and found.points == 24
    floor = [
        BranchPoint(seed, 25, tokens, {4: 2.0, 8: 2.1}, 4, False, None, None)
        for seed in (1, 2)
        for tokens in (1e5, 2e5)
    ]
    assert growth({1e5: floor, 1e6: floor}).at_floor == 8  # B* at the smallest batch: at most that, counted
    assert found.verdict() == "grows with tokens; does not change measurably with model size"
    with pytest.raises(ConfigError, match="two or more model sizes"):
        growth({3e5: points(3e5, 0.01)})
    plot_by_size({300_000: points(3e5, 0.01), 1_200_000: points(1.2e6, -0.01)}, tmp_path / "by_size.png")
    assert (tmp_path / "by_size.png").read_bytes().startswith(b"\x89PNG")

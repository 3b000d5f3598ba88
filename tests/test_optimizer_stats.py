"""The instability signals against direct computations from the optimizer state and the losses.

In process: Adam second-moment statistics against the optimizer's own state, the loss-spike
ratio against the loss series, and a resumed run against one that never stopped.
Subprocesses: 2-process FSDP2 (sharded states, reduced across ranks) and DDP (replicated
states, never reduced) against their checkpoints' full optimizer state and the in-process
1-process run (same settings and global batch).
"""

import csv
import math
from pathlib import Path

import pytest
import torch

from callbacks.infrastructure.optimizer_stats import OptimizerStatistics
from tests.run_helpers import (
    TINY,
    MemoryLogger,
    compose_config,
    fit_in_process,
    run_to_completion,
    training_state,
)

ADAM_KEYS = ("stability/adam_v_l1", "stability/adam_v_l2", "stability/adam_v_max")
RATIO = "stability/loss_spike_ratio"
# A learning rate so small that batch-to-batch noise beats the trend: the loss rises above
# its running minimum on some steps, so the ratio is not always 1.
SETTINGS = TINY + ["trainer.max_steps=4", "optimizer.lr=1e-5"]


def second_moment_reference(states) -> dict[str, float]:
    """l1, l2 and max of all exp_avg_sq, concatenated and reduced in float64."""
    moments = torch.cat([state["exp_avg_sq"].flatten().double() for state in states])
    return dict(zip(ADAM_KEYS, (moments.abs().sum().item(), moments.norm().item(), moments.max().item())))


def assert_close(actual: dict[str, float], expected: dict[str, float], rel: float) -> None:
    for key, value in expected.items():
        assert actual[key] == pytest.approx(value, rel=rel), key


# ---------------------------------------------------------------- in process
def fit(tmp_path: Path, overrides: list[str], ckpt_path: Path | None = None):
    """Train with the default callbacks (optimizer_stats among them); returns trainer and logged rows by step."""
    cfg = compose_config(
        SETTINGS + ["logger=none"] + overrides + ([f"ckpt_path={ckpt_path}"] if ckpt_path else []), tmp_path
    )
    logger = MemoryLogger()
    _, trainer = fit_in_process(cfg, loggers=[logger])
    return trainer, {step: row for step, row in logger.rows if RATIO in row}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    return fit(tmp_path_factory.mktemp("uninterrupted"), [])


def test_second_moment_statistics_equal_the_optimizer_state(uninterrupted):
    trainer, rows = uninterrupted
    last = rows[max(rows)]
    assert_close(last, second_moment_reference(trainer.optimizers[0].state.values()), rel=1e-6)


def test_loss_spike_ratio_is_loss_over_running_minimum(uninterrupted):
    _, rows = uninterrupted
    losses = [rows[step]["train/loss"] for step in sorted(rows)]
    expected = [loss / min(losses[: index + 1]) for index, loss in enumerate(losses)]
    assert [rows[step][RATIO] for step in sorted(rows)] == pytest.approx(expected, rel=1e-12)
    assert max(expected) > 1.0  # the series has spikes, so the minimum matters


def test_resumed_run_reports_the_same_signals(uninterrupted, tmp_path):
    """The running minimum travels in the checkpoint: ratios after resuming are unchanged."""
    _, reference = uninterrupted
    first, _ = fit(tmp_path / "first", ["trainer.max_steps=2"])
    checkpoint = Path(first.checkpoint_callback.dirpath) / "last.ckpt"
    saved = torch.load(checkpoint, map_location="cpu", weights_only=False)["callbacks"]["OptimizerStatistics"]
    assert saved == {"min_loss": min(reference[1]["train/loss"], reference[2]["train/loss"])}

    _, resumed = fit(tmp_path / "resumed", [], ckpt_path=checkpoint)
    assert sorted(resumed) == [3, 4]
    for step, metrics in resumed.items():
        assert {key: metrics[key] for key in (*ADAM_KEYS, RATIO)} == {
            key: reference[step][key] for key in (*ADAM_KEYS, RATIO)
        }, step
    assert reference[3][RATIO] > 1.0  # step 3 measures against a loss from before the resume


# ---------------------------------------------------------------- the callback alone
def fake_step(callback: OptimizerStatistics, state, loss: float, optimizer) -> dict:
    """One optimizer step's end on the training state; returns what the callback recorded."""
    state.metrics.clear()
    state.clock.advance(sequences=1, tokens=1)
    state.optimizer, state.step_loss = optimizer, torch.tensor(loss)
    callback.on_step_end(state)
    return {key: float(value) for key, value in state.metrics.values.items()}


def test_the_minimum_is_tracked_on_unlogged_steps_too():
    weight = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.AdamW([weight])
    callback, state = OptimizerStatistics(), training_state(log_every_n_steps=2)
    assert fake_step(callback, state, 2.0, optimizer) == {}  # step 1: not logged, minimum 2
    assert fake_step(callback, state, 3.0, optimizer) == {RATIO: 1.5}  # no optimizer state yet: ratio only
    weight.grad = torch.tensor([1.0, -2.0, 0.0])
    optimizer.step()
    fake_step(callback, state, 1.0, optimizer)  # step 3: new minimum, unlogged
    metrics = fake_step(callback, state, 3.0, optimizer)
    v = (1 - 0.999) * weight.grad.square()  # AdamW's second moment after one step
    assert metrics[RATIO] == 3.0
    assert_close(metrics, dict(zip(ADAM_KEYS, (v.sum().item(), v.norm().item(), v.max().item()))), rel=1e-6)


def test_state_round_trip_and_nan_losses():
    callback, state = OptimizerStatistics(), training_state()
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.ones(1))])
    fake_step(callback, state, 2.0, optimizer)
    assert math.isnan(fake_step(callback, state, math.nan, optimizer)[RATIO])
    restored = OptimizerStatistics()
    restored.load_state_dict(callback.state_dict())
    assert (
        fake_step(restored, training_state(), 3.0, optimizer)
        == fake_step(callback, state, 3.0, optimizer)
        == {RATIO: 1.5}
    )


# ---------------------------------------------------------------- 2 processes
def logged_signals(run_dir: Path) -> dict[int, dict[str, float]]:
    """The stability metrics of each logged step in the run's CSV log."""
    with open(run_dir / "csv" / "metrics.csv") as file:
        rows = [row for row in csv.DictReader(file) if row.get(ADAM_KEYS[0])]
    return {int(row["step"]): {key: float(row[key]) for key in (*ADAM_KEYS, RATIO)} for row in rows}


@pytest.mark.parametrize(
    "strategy",
    [["strategy=ddp"], ["strategy=fsdp2", "strategy.save_distributed_checkpoint=false"]],
    ids=["ddp", "fsdp2"],
)
def test_two_processes_report_whole_model_statistics(strategy, uninterrupted, tmp_path, tmp_path_factory):
    """FSDP2 sums its shards; DDP's replicated states are not summed again."""
    run_dir = tmp_path / "run"
    overrides = SETTINGS + strategy + ["trainer.devices=2", "trainer.accelerator=cpu", "logger=csv"]
    run_to_completion(overrides, run_dir, tmp_path_factory.getbasetemp() / "cache")
    signals, (_, single_process) = logged_signals(run_dir), uninterrupted
    assert sorted(signals) == sorted(single_process) == [1, 2, 3, 4]

    checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    full_states = checkpoint["optimizer_states"][0]["state"].values()  # gathered, unsharded
    assert_close(signals[4], second_moment_reference(full_states), rel=1e-5)
    for step, expected in single_process.items():
        assert_close(signals[step], {key: expected[key] for key in (*ADAM_KEYS, RATIO)}, rel=1e-4)

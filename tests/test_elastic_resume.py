"""A sharded FSDP2 checkpoint resumes on another number of processes (2 -> 1, 1 -> 2, 2 -> 4):
the same sequences at every step (by content hash, read back from what each rank trained),
the same losses within float reduction-order noise, and one line saying that the world
size changed. Real DiLoCo replicas on another process count are refused in one line."""

import csv
import re
from pathlib import Path

import pytest

from benchmarks.row_log import rows_by_step
from tests.run_helpers import TINY, run_train

# 4 steps of 8 sequences; sharded checkpoints every 2 steps; one validation, at the end, of 14
# rows in micro-batches of 2 (one process runs 7 full batches, each of two processes 3 and a
# last one of 1 row).
RUN = [
    *TINY,
    "trainer.max_steps=4",
    "logger=csv",
    "callbacks.validation_schedule.every_n_steps=100",
    "data.val_max_rows=14",
    "strategy=fsdp2",
    "trainer.accelerator=cpu",
    "callbacks.model_checkpoint.every_n_train_steps=2",
]
# Float sums over 1, 2 or 4 ranks add in another order: measured up to 1e-7 relative here.
LOSS_RTOL = 1e-6


def train(folder: Path, cache: Path, devices: int, *extra: str):
    log = ["+callbacks.row_log._target_=benchmarks.row_log.RowLog", f"+callbacks.row_log.path={folder / 'rows'}"]
    result = run_train([*RUN, f"trainer.devices={devices}", *log, *extra], folder, cache)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def losses(folder: Path) -> dict[int, float]:
    rows = csv.DictReader(open(folder / "csv" / "metrics.csv"))
    return {int(row["step"]): float(row["train/loss"]) for row in rows if row.get("train/loss")}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict[int, Path]:
    """The whole run on 1 and on 2 processes."""
    cache = tmp_path_factory.getbasetemp() / "cache"
    runs = {devices: tmp_path_factory.mktemp(f"full{devices}") for devices in (1, 2)}
    for devices, folder in runs.items():
        train(folder, cache, devices)
    return runs


def test_one_and_two_processes_train_the_same_sequences(uninterrupted) -> None:
    assert rows_by_step(uninterrupted[1] / "rows") == rows_by_step(uninterrupted[2] / "rows")
    assert len(rows_by_step(uninterrupted[1] / "rows")[1]) == 8


@pytest.mark.parametrize(("written_by", "resumed_on"), [(2, 1), (1, 2), (2, 4)])
def test_a_sharded_checkpoint_resumes_on_another_world_size(
    uninterrupted, written_by, resumed_on, tmp_path, tmp_path_factory
) -> None:
    full = uninterrupted[written_by]
    checkpoint = full / "checkpoints" / "step000002.ckpt"
    assert checkpoint.is_dir()  # sharded: one file per rank
    result = train(tmp_path, tmp_path_factory.getbasetemp() / "cache", resumed_on, f"ckpt_path={checkpoint}")
    on = f"{resumed_on} process" + ("es" if resumed_on > 1 else "")
    assert (
        f"resuming on {on} (the checkpoint's run had {written_by}): the weights and optimizer"
        " state are resharded, the data continues at sequence 16"
    ) in result.stdout + result.stderr
    # Progress lines time this process (before the fix a resumed run counted from boot).
    assert [int(m) for m in re.findall(r"(\d+)m\d+s elapsed", result.stdout + result.stderr)] == [0]
    before, after = rows_by_step(full / "rows"), rows_by_step(tmp_path / "rows")
    assert after == {step: before[step] for step in (3, 4)}  # no sequence trained twice or skipped
    expected = losses(full)
    assert losses(tmp_path) == {step: pytest.approx(expected[step], rel=LOSS_RTOL) for step in (3, 4)}


def test_real_diloco_replicas_resume_only_on_their_process_count(tmp_path, tmp_path_factory) -> None:
    cache = tmp_path_factory.getbasetemp() / "cache"
    diloco = ["+technique=diloco", "technique.diloco.sync_every=2", "strategy.save_distributed_checkpoint=false"]
    train(tmp_path / "run", cache, 2, *diloco)
    checkpoint = tmp_path / "run" / "checkpoints" / "step000002.ckpt"
    result = run_train([*RUN, "trainer.devices=4", *diloco, f"ckpt_path={checkpoint}"], tmp_path / "resumed", cache)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: ckpt_path={checkpoint} holds the DiLoCo replica states of 2 processes, but this run has 4;"
        " resume real DiLoCo replicas on 2 processes (trainer.devices x trainer.num_nodes)."
    )


def test_validation_loss_is_the_token_mean_whatever_the_process_count(uninterrupted) -> None:
    """val/loss weighs every validation token once: on two processes the last batch of one row
    counts as one row, where a mean of batch means would weigh it as much as a full one (that
    gave 0.02-0.06 nats apart on the nano model)."""
    one, two = (values(uninterrupted[devices], "val/loss") for devices in (1, 2))
    assert len(one) == 1 and one == pytest.approx(two, rel=1e-6)


def values(folder: Path, key: str) -> list[float]:
    return [float(row[key]) for row in csv.DictReader(open(folder / "csv" / "metrics.csv")) if row.get(key)]

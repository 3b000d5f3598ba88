"""All three techniques in one run: sequence-length warmup, the adaptive batch and DiLoCo.

`+experiment=combined` with 2 simulated replicas and with 2 real ones (2 processes):
the batch grows (the replicas agreeing on the largest proposal), the length grows with the
global step, the replicas sync; and a run resumed mid-round and mid-warmup ends on the
same weights and logs the same schedule.
"""

import csv

import pytest
import torch

from tests.run_helpers import TINY, checkpoint_weights, run_to_completion

COMBINED = TINY + [
    "+experiment=combined",
    "batch.global_batch_size=16",  # 8 per replica: 4 micro-batch samples of 2 per turn
    "batch.max_global_batch_size=32",
    "technique.adaptive_batch.eta=0.3",
    "technique.seq_len_warmup.total_curriculum_step=4",  # 8 -> 32 tokens over 4 global steps
    "technique.seq_len_warmup.preallocate=false",
    "technique.diloco.sync_every=3",
    "technique.diloco.outer_lr=0.7",  # an outer momentum, so resuming must restore its buffer
    "technique.diloco.outer_optimizer.momentum=0.9",
    "technique.diloco.outer_optimizer.nesterov=true",
    "logger=csv",
    "callbacks.validation_schedule.every_n_steps=1000",
]
REAL = ["strategy=fsdp2", "strategy.save_distributed_checkpoint=false", "trainer.accelerator=cpu", "trainer.devices=2"]


def schedule(run_dir) -> dict[int, tuple[float, ...]]:
    """Per logged step: global batch, trained sequence length, DiLoCo round."""
    with open(run_dir / "csv" / "metrics.csv") as file:
        rows = [row for row in csv.DictReader(file) if row.get("train/global_batch_size")]
    return {
        int(r["step"]): (float(r["train/global_batch_size"]), float(r["train/seq_len"]), r.get("diloco/round") or "")
        for r in rows
    }


def train(overrides, run_dir, tmp_path_factory):
    run_to_completion(COMBINED + overrides, run_dir, tmp_path_factory.getbasetemp() / "cache")
    return checkpoint_weights(run_dir / "checkpoints" / "last.ckpt"), schedule(run_dir)


@pytest.mark.parametrize(
    ("overrides", "resume_step"),
    [
        (["trainer.max_steps=12", "callbacks.model_checkpoint.every_n_train_steps=4"], 4),
        (REAL + ["trainer.max_steps=6", "callbacks.model_checkpoint.every_n_train_steps=2"], 2),
    ],
    ids=["simulated", "real"],
)
def test_all_three_grow_sync_and_resume_exactly(overrides, resume_step, tmp_path, tmp_path_factory):
    weights, logged = train(overrides, tmp_path / "full", tmp_path_factory)
    batches = [batch for batch, _, _ in logged.values()]
    lengths = [length for _, length, _ in logged.values()]
    assert batches[0] == 16 and max(batches) > 16, logged  # the adaptive batch grew
    assert lengths[0] == 8 and lengths[-1] == 32 and lengths == sorted(lengths), logged  # warmup by global step
    assert {r for _, _, r in logged.values() if r} >= {"1.0"}, logged  # at least one full DiLoCo round
    checkpoint = tmp_path / f"full/checkpoints/step{resume_step:06d}.ckpt"  # global step 2: mid-round, mid-warmup
    resumed, resumed_logged = train(overrides + [f"ckpt_path={checkpoint}"], tmp_path / "resumed", tmp_path_factory)
    assert resumed_logged == {step: row for step, row in logged.items() if step > resume_step}
    for name, value in weights.items():
        assert torch.equal(resumed[name], value), name

"""2-process DDP and FSDP2 on CPU (gloo) train the same weights as one process.

Same global batch of 8 and the same data order: one process accumulates 4 micro-batches
of 2; two processes accumulate 2 micro-batches of 2 each. After several AdamW steps the
weights must agree up to float reduction-order noise.
"""

import pytest
import torch

from lightning_modules.hf_interop import load_lightning_checkpoint
from tests.run_helpers import TINY, checkpoint_weights, run_to_completion, run_train

STEPS = ["trainer.max_steps=4", "logger=none", "callbacks.validation_schedule.every_n_steps=100"]


@pytest.fixture(scope="module")
def single_process_weights(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("single")
    run_to_completion(TINY + STEPS, run_dir, tmp_path_factory.getbasetemp() / "cache")
    return checkpoint_weights(run_dir / "checkpoints" / "last.ckpt")


@pytest.mark.parametrize(
    "strategy",
    [
        ["strategy=ddp"],
        ["strategy=fsdp2", "strategy.save_distributed_checkpoint=false"],
    ],
    ids=["ddp", "fsdp2"],
)
def test_two_processes_match_one(strategy, single_process_weights, tmp_path, tmp_path_factory):
    run_dir = tmp_path / "run"
    overrides = TINY + STEPS + strategy + ["trainer.devices=2", "trainer.accelerator=cpu"]
    run_to_completion(overrides, run_dir, tmp_path_factory.getbasetemp() / "cache")
    weights = checkpoint_weights(run_dir / "checkpoints" / "last.ckpt")
    assert weights.keys() == single_process_weights.keys()
    for name, value in single_process_weights.items():
        torch.testing.assert_close(weights[name], value, rtol=1e-4, atol=2e-5, msg=name)


def test_fsdp2_sharded_checkpoint_resumes_exactly(tmp_path, tmp_path_factory):
    """Each rank writes its shard; resuming from step 2 of 4 ends on the same weights."""
    cache = tmp_path_factory.getbasetemp() / "cache"
    fsdp2 = (
        TINY
        + STEPS
        + [
            "strategy=fsdp2",
            "trainer.devices=2",
            "trainer.accelerator=cpu",
            "callbacks.model_checkpoint.every_n_train_steps=2",
        ]
    )
    full = run_train(fsdp2, tmp_path / "full", cache)
    assert full.returncode == 0, full.stderr[-3000:]
    resumed = run_train(
        fsdp2 + [f"ckpt_path={tmp_path / 'full/checkpoints/step000002.ckpt'}"], tmp_path / "resumed", cache
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    _, expected = load_lightning_checkpoint(tmp_path / "full/checkpoints/last.ckpt")
    _, weights = load_lightning_checkpoint(tmp_path / "resumed/checkpoints/last.ckpt")
    assert (tmp_path / "resumed/checkpoints/last.ckpt").is_dir()  # sharded: a folder
    for name, value in expected.items():
        assert torch.equal(weights[name], value), name


WARMUP = [
    "+experiment=seqlen_warmup",
    "technique.seq_len_warmup.total_curriculum_step=3",
    "technique.seq_len_warmup.mode=reshape",
]


@pytest.fixture(scope="module")
def single_process_warmup_weights(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("single_warmup")
    run_to_completion(TINY + STEPS + WARMUP, run_dir, tmp_path_factory.getbasetemp() / "cache")
    return checkpoint_weights(run_dir / "checkpoints" / "last.ckpt")


@pytest.mark.parametrize(
    "strategy",
    [["strategy=ddp"], ["strategy=fsdp2", "strategy.save_distributed_checkpoint=false"]],
    ids=["ddp", "fsdp2"],
)
def test_sequence_length_warmup_under_two_processes_matches_one(
    strategy, single_process_warmup_weights, tmp_path, tmp_path_factory
):
    overrides = TINY + STEPS + WARMUP + strategy + ["trainer.devices=2", "trainer.accelerator=cpu"]
    run_to_completion(overrides, tmp_path / "run", tmp_path_factory.getbasetemp() / "cache")
    weights = checkpoint_weights(tmp_path / "run" / "checkpoints" / "last.ckpt")
    for name, value in single_process_warmup_weights.items():
        torch.testing.assert_close(weights[name], value, rtol=1e-4, atol=2e-5, msg=name)

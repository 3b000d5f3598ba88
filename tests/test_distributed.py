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


def assert_close_to_one_process(weights: dict[str, torch.Tensor], one_process: dict[str, torch.Tensor]) -> None:
    assert weights.keys() == one_process.keys()
    for name, value in one_process.items():
        torch.testing.assert_close(weights[name], value, rtol=1e-4, atol=2e-5, msg=name)


def test_two_ddp_processes_match_one(single_process_weights, tmp_path, tmp_path_factory):
    overrides = TINY + STEPS + ["strategy=ddp", "trainer.devices=2", "trainer.accelerator=cpu"]
    run_to_completion(overrides, tmp_path / "run", tmp_path_factory.getbasetemp() / "cache")
    assert_close_to_one_process(
        checkpoint_weights(tmp_path / "run" / "checkpoints" / "last.ckpt"), single_process_weights
    )


#: Two FSDP2 processes, each rank writing its shard of a checkpoint every 2 steps.
FSDP2 = [
    *TINY,
    *STEPS,
    "strategy=fsdp2",
    "trainer.devices=2",
    "trainer.accelerator=cpu",
    "callbacks.model_checkpoint.every_n_train_steps=2",
]


@pytest.fixture(scope="module")
def fsdp2_run(tmp_path_factory):
    """The folder of the two-process FSDP2 run."""
    run_dir = tmp_path_factory.mktemp("fsdp2") / "run"
    run_to_completion(FSDP2, run_dir, tmp_path_factory.getbasetemp() / "cache")
    return run_dir


def test_two_fsdp2_processes_match_one(fsdp2_run, single_process_weights):
    _, weights = load_lightning_checkpoint(fsdp2_run / "checkpoints" / "last.ckpt")  # gathered from the shards
    assert_close_to_one_process({f"model.{name}": value for name, value in weights.items()}, single_process_weights)


def test_fsdp2_sharded_checkpoint_resumes_exactly(fsdp2_run, tmp_path, tmp_path_factory):
    """Each rank writes its shard; resuming from step 2 of 4 ends on the same weights."""
    checkpoint = fsdp2_run / "checkpoints" / "step000002.ckpt"
    resumed = run_train(
        FSDP2 + [f"ckpt_path={checkpoint}"], tmp_path / "resumed", tmp_path_factory.getbasetemp() / "cache"
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    _, expected = load_lightning_checkpoint(fsdp2_run / "checkpoints" / "last.ckpt")
    _, weights = load_lightning_checkpoint(tmp_path / "resumed" / "checkpoints" / "last.ckpt")
    assert (tmp_path / "resumed" / "checkpoints" / "last.ckpt").is_dir()  # sharded: a folder
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
    assert_close_to_one_process(weights, single_process_warmup_weights)

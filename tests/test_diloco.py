"""DiLoCo: the outer step by hand, and exactness against plain training and across ways to run replicas.

- a two-round example computed by hand (sign and order of the pseudo-gradient, Nesterov);
- M=1 with outer lr 1 and momentum 0 equals plain training, and so does M=1 at H=1 and outer lr
  0.5 at half the inner lr;
- M=2 fed identical data equals M=1;
- simulated M=2 (one process) equals 2 real replicas (2 processes, gloo), also with int8 exchange;
- 2 replicas x FSDP2 (4 processes) equal 2 unsharded replicas (2 processes), and so do 2
  replicas of 2 tensor-parallel ranks;
- resuming mid-round (and mid global step) continues exactly, simulated and real.
"""

import copy
from pathlib import Path

import pytest
import torch

from callbacks.diloco.exchange import average_in_process, quantize
from callbacks.diloco.outer_step import OuterStep
from tests.run_helpers import TINY, checkpoint_weights, compose_config, fit_in_process, run_to_completion, run_train

DILOCO = TINY + [
    "+technique=diloco",
    "batch.micro_batch_size=2",
    "batch.global_batch_size=4",
    "technique.diloco.sync_every=2",
    "logger=none",
    "callbacks.validation_schedule.every_n_steps=1000",
]


def nesterov(lr: float, momentum: float = 0.9):
    """The default outer optimizer (torch.optim.SGD with Nesterov momentum), as the settings build it."""
    return lambda anchors: torch.optim.SGD(anchors, lr=lr, momentum=momentum, nesterov=momentum > 0)


REAL = ["strategy=fsdp2", "strategy.save_distributed_checkpoint=false", "trainer.accelerator=cpu"]


def test_two_rounds_by_hand():
    """Anchor 1.0; replicas end round 1 at 0.5 and 0.7, round 2 at 0.3 and 0.4 (lr 0.7, Nesterov 0.9).

    Round 1: delta = 1 - 0.6 = 0.4; buf = 0.4; update = 0.4 + 0.9 * 0.4 = 0.76; anchor = 1 - 0.532 = 0.468.
    Round 2: delta = 0.468 - 0.35 = 0.118; buf = 0.36 + 0.118 = 0.478; update = 0.118 + 0.4302 = 0.5482;
    anchor = 0.468 - 0.38374 = 0.08426.
    """
    anchor = [torch.tensor([1.0])]
    outer = OuterStep(anchor, nesterov(lr=0.7))
    for replicas, expected in (([0.5, 0.7], 0.468), ([0.3, 0.4], 0.08426)):
        deltas = [anchor[0] - torch.tensor([value]) for value in replicas]
        outer.step([0], [average_in_process(deltas, "none")])
        assert anchor[0].item() == pytest.approx(expected, abs=1e-6)


def test_plain_outer_sgd_moves_the_anchor_to_the_replica_mean():
    anchor = [torch.tensor([2.0, -1.0])]
    deltas = [anchor[0] - torch.tensor([1.0, 0.0]), anchor[0] - torch.tensor([0.0, 1.0])]
    OuterStep(anchor, nesterov(lr=1.0, momentum=0.0)).step([0], [average_in_process(deltas, "none")])
    torch.testing.assert_close(anchor[0], torch.tensor([0.5, 0.5]))


def test_compression_rounds_like_its_format():
    delta = torch.linspace(-3, 1, 101)
    step = 3 / 127
    assert (quantize(delta, "int8") - delta).abs().max() <= step / 2 + 1e-7
    torch.testing.assert_close(quantize(delta, "bf16"), delta.bfloat16().float())
    two = [delta, delta * 0.5]
    torch.testing.assert_close(
        average_in_process(two, "int8"), (quantize(two[0], "int8") + quantize(two[1], "int8")) / 2
    )


def final_weights(run_dir) -> dict[str, torch.Tensor]:
    return checkpoint_weights(run_dir / "checkpoints" / "last.ckpt")


def assert_same_weights(actual, expected, atol: float) -> None:
    assert actual.keys() == expected.keys()
    for name, value in expected.items():
        torch.testing.assert_close(actual[name], value, rtol=0, atol=atol, msg=name)


def train(overrides, run_dir, tmp_path_factory):
    run_to_completion(overrides, run_dir, tmp_path_factory.getbasetemp() / "cache")
    return final_weights(run_dir)


@pytest.mark.parametrize(
    ("outer_lr", "sync_every", "plain_lr"),
    [(1.0, 2, 4e-3), (0.5, 1, 2e-3)],
    ids=["unit_outer_lr", "every_step_at_half_outer_lr"],
)
def test_one_replica_without_outer_momentum_is_plain_training(
    outer_lr, sync_every, plain_lr, tmp_path, tmp_path_factory
):
    """M = 1 with plain outer SGD: at outer LR 1 any H is plain training; at H = 1 an outer LR
    scales the step, so it is plain training at the inner LR times the outer LR (AdamW's
    decoupled decay included), which a search that lands on H = 1 has found."""
    common = TINY + ["batch.micro_batch_size=2", "batch.global_batch_size=4", "trainer.max_steps=4", "logger=none"]
    plain = train([*common, f"optimizer.lr={plain_lr}"], tmp_path / "plain", tmp_path_factory)
    diloco = train(
        DILOCO
        + [
            "trainer.max_steps=4",
            "optimizer.lr=4e-3",
            "technique.diloco.replicas=1",
            f"technique.diloco.outer_lr={outer_lr}",
            f"technique.diloco.sync_every={sync_every}",
            "technique.diloco.outer_optimizer.momentum=0",
            "technique.diloco.outer_optimizer.nesterov=false",
        ],
        tmp_path / "diloco",
        tmp_path_factory,
    )
    assert_same_weights(diloco, plain, atol=1e-6)


class EachBatchTwice:
    """A training loader that serves every micro-batch twice: replicas taking turns see the same data."""

    def __init__(self, loader) -> None:
        self.loader = loader

    def __iter__(self):
        for batch in self.loader:
            yield batch
            yield {key: value.clone() for key, value in batch.items()}

    def __len__(self) -> int:
        return 2 * len(self.loader)


def fit_weights(tmp_path, overrides, duplicate: bool) -> dict[str, torch.Tensor]:
    common = ["lr_schedule.name=constant", "token_budget=null", "technique.diloco.outer_lr=0.7"]
    cfg = compose_config(DILOCO + common + overrides, tmp_path)

    def serve_twice(datamodule) -> None:
        original = datamodule.train_dataloader
        datamodule.train_dataloader = lambda: EachBatchTwice(original())

    module, _ = fit_in_process(cfg, datamodule_hook=serve_twice if duplicate else None)
    return {name: value.detach().clone() for name, value in module.model.state_dict().items()}


def test_two_replicas_fed_identical_data_equal_one(tmp_path):
    """Same outer lr for both (the default depends on M); 5 global steps: 2 rounds and a partial one."""
    one = fit_weights(
        tmp_path / "one", ["technique.diloco.replicas=1", "batch.global_batch_size=2", "trainer.max_steps=5"], False
    )
    two = fit_weights(
        tmp_path / "two", ["technique.diloco.replicas=2", "batch.global_batch_size=4", "trainer.max_steps=10"], True
    )
    assert_same_weights(two, one, atol=1e-6)


@pytest.fixture(scope="module")
def simulated_two_replicas(tmp_path_factory):
    """Simulated M=2, 4 global steps (8 turns), 2 rounds; each replica trains on 2 sequences per step."""
    run_dir = tmp_path_factory.mktemp("simulated")
    return train(DILOCO + ["trainer.max_steps=8"], run_dir, tmp_path_factory)


#: Real M = 2 on 2 processes, 4 global steps, a checkpoint after each: the run that the
#: simulated, sharded and resumed runs are compared with.
REAL_TWO = [
    *DILOCO,
    *REAL,
    "trainer.devices=2",
    "trainer.max_steps=4",
    "callbacks.model_checkpoint.every_n_train_steps=1",
]


@pytest.fixture(scope="module")
def real_two_replicas(tmp_path_factory) -> Path:
    """The folder of the real M = 2 run."""
    run_dir = tmp_path_factory.mktemp("real") / "run"
    run_to_completion(REAL_TWO, run_dir, tmp_path_factory.getbasetemp() / "cache")
    return run_dir


def test_simulated_replicas_equal_real_ones(simulated_two_replicas, real_two_replicas):
    assert_same_weights(final_weights(real_two_replicas), simulated_two_replicas, atol=1e-5)


def test_int8_exchange_matches_its_simulation(tmp_path, tmp_path_factory):
    """The real all-gather of int8 values and scales rounds exactly as the simulation does."""
    int8 = DILOCO + ["technique.diloco.compression=int8"]
    simulated = train(int8 + ["trainer.max_steps=8"], tmp_path / "simulated", tmp_path_factory)
    real = train(int8 + REAL + ["trainer.devices=2", "trainer.max_steps=4"], tmp_path / "real", tmp_path_factory)
    assert_same_weights(real, simulated, atol=1e-5)


def test_sharded_replicas_equal_unsharded_ones(real_two_replicas, tmp_path, tmp_path_factory):
    """2 replicas of 2 FSDP2 shards (micro-batch 1 per rank) against 2 replicas of one rank (micro-batch 2)."""
    unsharded = final_weights(real_two_replicas)
    sharded = train(
        DILOCO + REAL + ["trainer.devices=4", "trainer.max_steps=4", "batch.micro_batch_size=1"],
        tmp_path / "four",
        tmp_path_factory,
    )
    assert_same_weights(sharded, unsharded, atol=1e-5)


def test_tensor_parallel_replicas_equal_simulated_ones(simulated_two_replicas, tmp_path, tmp_path_factory):
    """2 real replicas, each a pair of tensor-parallel ranks (4 processes): the pseudo-gradients,
    the outer step and the exchange on DTensor shards give one process's weights."""
    split = ["trainer.devices=4", "strategy.tensor_parallel_size=2", "trainer.max_steps=4"]
    real = train(DILOCO + REAL + split, tmp_path / "split", tmp_path_factory)
    assert_same_weights(real, simulated_two_replicas, atol=1e-5)


def assert_resumes_exactly(full: Path, step: int, overrides: list[str], resumed: Path, tmp_path_factory) -> None:
    """``full``'s run resumed from its checkpoint of ``step`` ends on its weights, to the bit."""
    checkpoint = full / "checkpoints" / f"step{step:06d}.ckpt"
    weights = train([*overrides, f"ckpt_path={checkpoint}"], resumed, tmp_path_factory)
    for name, value in final_weights(full).items():
        assert torch.equal(weights[name], value), name


@pytest.mark.parametrize(
    "overrides, resume_step",
    [
        (["trainer.max_steps=8"], 3),
        (["trainer.max_steps=8", "optimizer=muon"], 3),
        (REAL + ["trainer.devices=2", "trainer.max_steps=4", "optimizer=muon"], 1),
    ],
    ids=["simulated_mid_global_step", "muon_simulated", "muon_real"],
)
def test_resume_mid_round_is_exact(overrides, resume_step, tmp_path, tmp_path_factory):
    checkpoints = DILOCO + overrides + [f"callbacks.model_checkpoint.every_n_train_steps={resume_step}"]
    train(checkpoints, tmp_path / "full", tmp_path_factory)
    assert_resumes_exactly(tmp_path / "full", resume_step, checkpoints, tmp_path / "resumed", tmp_path_factory)


def test_real_replicas_resumed_mid_round_are_exact(real_two_replicas, tmp_path, tmp_path_factory):
    assert_resumes_exactly(real_two_replicas, 1, REAL_TWO, tmp_path / "resumed", tmp_path_factory)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["trainer.max_steps=3"], "make it a multiple of technique.diloco.replicas"),
        (
            ["batch.global_batch_size=6"],
            "micro_batch_size=2 does not divide each rank's share of the global batch (6 over"
            " 1 data-parallel rank(s) x 2 simulated replicas = 3 sequences)",
        ),
        (
            ["strategy=ddp", "trainer.devices=2", "trainer.accelerator=cpu", "technique.diloco.simulated=false"],
            "needs strategy=fsdp2",
        ),
        (["technique.diloco.compression=fp8"], "compression='fp8' is unknown"),
        (["technique.diloco.outer_optimizer._target_=torch.optim.Nope"], "is not a torch.optim optimizer class"),
        (["technique.diloco.outer_optimizer.momentum=abc"], "technique.diloco.outer_optimizer"),
        (["technique.diloco.fragments=3"], "fragments=3 must be >= 1 and divide technique.diloco.sync_every=2"),
    ],
)
def test_impossible_settings_fail_with_a_message(overrides, message, tmp_path, tmp_path_factory):
    result = run_train(DILOCO + overrides, tmp_path / "run", tmp_path_factory.getbasetemp() / "cache")
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    assert message in result.stdout + result.stderr


def test_a_partial_round_ends_at_the_replica_mean_without_momentum():
    anchor = [torch.tensor([1.0])]
    outer = OuterStep(anchor, nesterov(lr=0.7))
    outer.step([0], [torch.tensor([0.4])])  # a full round: anchor 0.468, momentum 0.4
    outer.average([0], [average_in_process([anchor[0] - 0.3, anchor[0] - 0.4], "none")])
    momentum = outer.optimizer.state[anchor[0]]["momentum_buffer"]
    assert anchor[0].item() == pytest.approx(0.35) and momentum.item() == pytest.approx(0.4)


def test_any_torch_optimizer_is_the_outer_optimizer_and_checkpoints_through_its_state_dict():
    """Adam as the outer optimizer: one step by hand, and a restored copy continues identically."""
    anchor = [torch.tensor([1.0, 2.0])]
    outer = OuterStep(anchor, lambda anchors: torch.optim.Adam(anchors, lr=0.1))
    outer.step([0], [torch.tensor([0.5, -0.5])])
    torch.testing.assert_close(anchor[0], torch.tensor([0.9, 2.1]))  # Adam's first step is lr * sign
    restored = OuterStep([torch.zeros(2)], lambda anchors: torch.optim.Adam(anchors, lr=0.1))
    restored.load_state_dict(copy.deepcopy(outer.state_dict()))  # as through a checkpoint file
    for each in (outer, restored):
        each.step([0], [torch.tensor([0.2, 0.1])])
    torch.testing.assert_close(restored.anchors[0], anchor[0], rtol=0, atol=0)


def test_the_count_of_discarded_rounds_is_kept_across_a_resume(tmp_path, tmp_path_factory):
    """A checkpoint says 3 rounds were discarded before it (as torchft groups record them);
    the run resumed from it carries the count on into its own checkpoints."""
    first = DILOCO + ["trainer.max_steps=4", "callbacks.model_checkpoint.every_n_train_steps=2"]
    train(first, tmp_path / "first", tmp_path_factory)
    path = tmp_path / "first/checkpoints/step000002.ckpt"
    checkpoint = torch.load(path, weights_only=False)
    (key,) = [key for key in checkpoint["callbacks"] if key.startswith("DiLoCo")]
    assert checkpoint["callbacks"][key]["discarded_rounds"] == 0
    checkpoint["callbacks"][key]["discarded_rounds"] = 3
    torch.save(checkpoint, path)
    train(first + [f"ckpt_path={path}"], tmp_path / "resumed", tmp_path_factory)
    resumed = torch.load(tmp_path / "resumed/checkpoints/last.ckpt", weights_only=False)
    assert resumed["callbacks"][key]["discarded_rounds"] == 3

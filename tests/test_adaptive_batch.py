"""The adaptive batch-size statistics against a brute-force computation from per-sequence gradients.

Reference: ``torch.func`` per-sequence gradients of the initial model on the step's 8
sequences, grouped into the samples each strategy uses, and the formulas of docs/techniques/adaptive_batch.md
applied to them directly (sample means, deviations, projections) in float64.

- one device, 4 micro-batches of 2: samples are micro-batches (positions 0-1, 2-3, ...);
- 2-process FSDP2, 2 micro-steps of 2 per rank: samples are micro-steps over both ranks
  (positions 0-3, 4-7), which is also one device with micro-batches of 4;
- 2-process DDP, 2 micro-batches of 2 per rank: samples are ranks; rank r reads positions
  2r, 2r+1 of each group of 4 (0, 1, 4, 5 and 2, 3, 6, 7).
"""

import copy
import csv
from pathlib import Path

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call, grad, vmap

from callbacks.batch_size.adaptive import AdaptiveBatchSize
from launch.builders import build_callbacks, build_datamodule, build_module, build_trainer
from launch.from_config import read_settings
from tests.run_helpers import TINY, checkpoint_weights, compose_config, run_to_completion, run_train, train_losses

STATISTICS = {
    "variance": "adaptive_bs/variance",
    "g_sq": "adaptive_bs/grad_sq_norm",
    "noise_scale": "adaptive_bs/noise_scale",
    "inner_product": "adaptive_bs/inner_product_variance",
    "orthogonal": "adaptive_bs/orthogonal_variance",
}
# Every statistic is logged by the augmented test; a huge eta/theta/nu keeps the batch at 8.
ADAPTIVE = TINY + [
    "+experiment=adaptive_bs",
    "batch.global_batch_size=8",
    "technique.adaptive_batch.test=augmented_inner_product",
    "trainer.max_steps=1",
]


def per_sequence_gradients(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """[sequences, parameters]: the flattened gradient of each sequence's mean token loss."""
    params = {name: p.detach() for name, p in model.named_parameters()}

    def loss(p, input_ids, labels):
        logits = functional_call(model, p, (input_ids[None],))
        return F.cross_entropy(logits.float().flatten(0, 1), labels)

    grads = vmap(grad(loss), in_dims=(None, 0, 0))(params, batch["input_ids"], batch["labels"])
    return torch.cat([grads[name].flatten(1) for name in params], dim=1).double()


def reference(per_sequence: torch.Tensor, samples: list[list[int]]) -> dict[str, float]:
    """The statistics as docs/techniques/adaptive_batch.md defines them, from the sample gradients themselves."""
    g_j = torch.stack([per_sequence[rows].mean(0) for rows in samples])
    n, b_s = len(samples), len(samples[0])
    g = g_j.mean(0)
    variance = b_s * (g_j - g).square().sum() / (n - 1)
    dots = g_j @ g
    orthogonal = g_j - dots[:, None] / g.dot(g) * g
    return {
        "variance": variance.item(),
        "g_sq": g.dot(g).item(),
        "noise_scale": (variance / g.dot(g)).item(),
        "inner_product": (b_s * dots.var(unbiased=True)).item(),
        "orthogonal": (b_s * orthogonal.square().sum() / (n - 1)).item(),
    }


@pytest.fixture(scope="module")
def one_device(tmp_path_factory):
    """One training step on one device; the initial model, the step's 8 rows, the logged statistics."""
    cfg = compose_config(ADAPTIVE + ["logger=none"], tmp_path_factory.mktemp("one_device"))
    settings = read_settings(cfg, processes=1)
    L.seed_everything(cfg.seed, verbose=False)
    datamodule = build_datamodule(settings)
    module = build_module(settings, datamodule.vocab_size)
    callbacks = build_callbacks(settings)
    trainer = build_trainer(settings, [], callbacks)
    module.configure_model()
    initial = copy.deepcopy(module.model)
    trainer.fit(module, datamodule=datamodule)
    adaptive = next(cb for cb in callbacks if isinstance(cb, AdaptiveBatchSize))

    fresh = build_datamodule(settings)
    fresh.setup("fit")
    loader = iter(fresh.train_dataloader())
    micro_batches = [next(loader) for _ in range(4)]
    rows = {key: torch.cat([mb[key] for mb in micro_batches]) for key in ("input_ids", "labels")}
    return per_sequence_gradients(initial, rows), {name: adaptive.last[key] for name, key in STATISTICS.items()}


def assert_matches(actual: dict[str, float], expected: dict[str, float]) -> None:
    """1e-5 relative: the sums are taken in float64, so DDP's whole-bucket norms are as exact as one device's."""
    for name, value in expected.items():
        assert actual[name] == pytest.approx(value, rel=1e-5), name


def test_one_device_micro_batches_match_brute_force(one_device):
    per_sequence, logged = one_device
    assert_matches(logged, reference(per_sequence, [[0, 1], [2, 3], [4, 5], [6, 7]]))


def logged_statistics(run_dir: Path, step: int = 1) -> dict[str, float]:
    with open(run_dir / "csv" / "metrics.csv") as file:
        row = next(r for r in csv.DictReader(file) if r.get(STATISTICS["variance"]) and int(r["step"]) == step)
    return {name: float(row[key]) for name, key in STATISTICS.items()}


@pytest.mark.parametrize(
    "strategy, samples",
    [
        (["strategy=ddp"], [[0, 1, 4, 5], [2, 3, 6, 7]]),
        (["strategy=fsdp2", "strategy.save_distributed_checkpoint=false"], [[0, 1, 2, 3], [4, 5, 6, 7]]),
    ],
    ids=["ddp", "fsdp2"],
)
def test_two_processes_match_brute_force(strategy, samples, one_device, tmp_path, tmp_path_factory):
    per_sequence, _ = one_device
    run_dir = tmp_path / "run"
    overrides = ADAPTIVE + strategy + ["trainer.devices=2", "trainer.accelerator=cpu", "logger=csv"]
    run_to_completion(overrides, run_dir, tmp_path_factory.getbasetemp() / "cache")
    assert_matches(logged_statistics(run_dir), reference(per_sequence, samples))


def test_fsdp2_and_one_device_agree_on_the_same_samples(tmp_path, tmp_path_factory):
    """Micro-batches of 4 on one device are the same samples as FSDP2's micro-steps of 2 x 2 ranks."""
    cache = tmp_path_factory.getbasetemp() / "cache"
    run_to_completion(ADAPTIVE + ["batch.micro_batch_size=4", "logger=csv"], tmp_path / "one", cache)
    two = ADAPTIVE + ["strategy=fsdp2", "trainer.devices=2", "trainer.accelerator=cpu", "logger=csv"]
    run_to_completion(two, tmp_path / "two", cache)
    assert_matches(logged_statistics(tmp_path / "two"), logged_statistics(tmp_path / "one"))


def batch_sizes(run_dir: Path) -> dict[int, float]:
    with open(run_dir / "csv" / "metrics.csv") as file:
        rows = [r for r in csv.DictReader(file) if r.get("train/global_batch_size")]
    return {int(r["step"]): float(r["train/global_batch_size"]) for r in rows}


def learning_rates(run_dir: Path) -> dict[int, float]:
    with open(run_dir / "csv" / "metrics.csv") as file:
        return {int(r["step"]): float(r["train/lr"]) for r in csv.DictReader(file) if r.get("train/lr")}


def test_resume_mid_schedule_continues_exactly(tmp_path, tmp_path_factory):
    """Stopped after the first test asked for a larger batch: the same batch sizes, learning
    rates (scaled by sqrt(B / 8), the starting batch) and weights."""
    cache = tmp_path_factory.getbasetemp() / "cache"
    growing = TINY + [
        "+experiment=adaptive_bs",
        "technique.adaptive_batch.eta=0.3",
        "technique.adaptive_batch.lr_scaling=sqrt",
        "lr_schedule.name=constant",
        "lr_schedule.warmup_steps=0",
        "batch.max_global_batch_size=40",
        "trainer.max_steps=6",
        "callbacks.model_checkpoint.every_n_train_steps=1",
        "logger=csv",
    ]
    run_to_completion(growing, tmp_path / "full", cache)
    sizes = batch_sizes(tmp_path / "full")
    assert sizes[1] == 8 and sizes[2] > 8, sizes  # step 1's test asked for more, applied from step 2
    rates = learning_rates(tmp_path / "full")
    assert rates == pytest.approx({step: 4e-3 * (size / 8) ** 0.5 for step, size in sizes.items()}, rel=1e-12)

    resumed = run_train(
        growing + [f"ckpt_path={tmp_path / 'full/checkpoints/step000001.ckpt'}"], tmp_path / "resumed", cache
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert batch_sizes(tmp_path / "resumed") == {step: size for step, size in sizes.items() if step > 1}
    assert learning_rates(tmp_path / "resumed") == {step: rate for step, rate in rates.items() if step > 1}
    expected = checkpoint_weights(tmp_path / "full/checkpoints/last.ckpt")
    for name, value in checkpoint_weights(tmp_path / "resumed/checkpoints/last.ckpt").items():
        assert torch.equal(value, expected[name]), name


def test_the_documented_fail_fast_command_exits_2_before_any_work(tmp_path):
    """One device needs >= 2 micro-batches per step: refused before tokenizing or starting anything."""
    result = run_train(["+experiment=adaptive_bs", "batch.micro_batch_size=16"], tmp_path / "run", tmp_path / "cache")
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.strip().splitlines() == [
        "error: technique.adaptive_batch: the starting global batch 16 is 1 micro-step(s) of micro_batch x ranks = 16;"
        " the norm test needs >= 2 samples. Start at 32 or set batch.micro_batch_size=8."
    ]
    assert not (tmp_path / "cache").exists() and not (tmp_path / "run").exists()


def test_the_console_shows_the_batch_once_it_moves_and_says_when_it_reaches_its_cap(tmp_path, tmp_path_factory):
    # eta 0.1 (the authors' tolerance) asks for far more than 16 sequences at once
    overrides = [
        *TINY,
        "+experiment=adaptive_bs",
        "technique.adaptive_batch.eta=0.1",
        "batch.global_batch_size=4",
        "batch.max_micro_batch_size=4",
        "batch.max_global_batch_size=16",
        "token_budget=4096",
        "callbacks.progress_bar.lines=true",
        "callbacks.progress_bar.line_interval_s=0.01",
    ]
    result = run_train(overrides, tmp_path / "run", tmp_path_factory.getbasetemp() / "cache")
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr
    capped = [line for line in output.splitlines() if "adaptive batch reached its cap" in line]
    assert len(capped) == 1 and "reached its cap of 16 at step" in capped[0] and "the norm test asks for" in capped[0]
    asked = int(capped[0].rsplit(" ", 1)[1].replace(",", ""))
    assert asked > 16
    lines = [line for line in output.splitlines() if "progress_bar" in line and " tokens (" in line]
    assert "batch=" not in lines[0] and any("batch=16" in line for line in lines)


UNTESTED_STEPS = TINY + ["trainer.max_steps=3", "logger=csv", "batch.global_batch_size=8"]


@pytest.fixture(scope="module")
def untested_run(tmp_path_factory):
    """Three steps of the batch the tests below keep, without any test."""
    run_dir = tmp_path_factory.mktemp("untested")
    run_to_completion(
        UNTESTED_STEPS + ["batch.max_micro_batch_size=4"], run_dir, tmp_path_factory.getbasetemp() / "cache"
    )
    return run_dir


@pytest.mark.parametrize("test", ["norm", "augmented_inner_product"])
def test_taking_the_micro_steps_gradients_leaves_training_unchanged(test, untested_run, tmp_path, tmp_path_factory):
    """The samples are taken out of ``.grad`` and summed back by the callback: the weights
    must come out bitwise as when autograd accumulates (the batch is kept at 8 here)."""
    kept = [
        "+experiment=adaptive_bs",
        f"technique.adaptive_batch.test={test}",
        "technique.adaptive_batch.eta=1e6",
        "technique.adaptive_batch.theta=1e6",
        "technique.adaptive_batch.nu=1e6",
    ]
    run_to_completion(UNTESTED_STEPS + kept, tmp_path / "tested", tmp_path_factory.getbasetemp() / "cache")
    assert train_losses(tmp_path / "tested") == train_losses(untested_run)
    expected = checkpoint_weights(untested_run / "checkpoints/last.ckpt")
    for name, value in checkpoint_weights(tmp_path / "tested/checkpoints/last.ckpt").items():
        assert torch.equal(value, expected[name]), name


def statistics(run_dir: Path) -> dict[int, dict[str, float]]:
    with open(run_dir / "csv" / "metrics.csv") as file:
        rows = [row for row in csv.DictReader(file) if row.get("adaptive_bs/variance")]
    return {int(row["step"]): {name: float(row[name]) for name in STATISTICS.values()} for row in rows}


def test_read_next_step_decides_a_step_later_on_the_same_statistics_and_resumes_exactly(tmp_path, tmp_path_factory):
    """Read a step later, step 1's statistics (logged at step 2) are those read at step 1's end,
    and the batch they ask for arrives a step later; a run stopped with step 1's statistics
    unread reads them after resuming, as the uninterrupted run did."""
    cache = tmp_path_factory.getbasetemp() / "cache"
    growing = TINY + [
        "+experiment=adaptive_bs",
        "technique.adaptive_batch.test=augmented_inner_product",
        "technique.adaptive_batch.eta=0.3",
        "batch.max_global_batch_size=40",
        "callbacks.model_checkpoint.every_n_train_steps=1",
        "logger=csv",
    ]
    run_to_completion(growing + ["trainer.max_steps=2"], tmp_path / "now", cache)
    later_overrides = growing + ["trainer.max_steps=4", "technique.adaptive_batch.read_next_step=true"]
    run_to_completion(later_overrides, tmp_path / "later", cache)
    now_sizes, later_sizes = batch_sizes(tmp_path / "now"), batch_sizes(tmp_path / "later")
    assert now_sizes[1] == 8 and now_sizes[2] > 8, now_sizes
    assert later_sizes[1] == later_sizes[2] == 8 and later_sizes[3] == now_sizes[2], later_sizes
    assert statistics(tmp_path / "later")[2] == statistics(tmp_path / "now")[1]
    assert 1 not in statistics(tmp_path / "later")

    checkpoint = tmp_path / "later/checkpoints/step000001.ckpt"
    resumed = run_train(later_overrides + [f"ckpt_path={checkpoint}"], tmp_path / "resumed", cache)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert batch_sizes(tmp_path / "resumed") == {step: size for step, size in later_sizes.items() if step > 1}
    assert statistics(tmp_path / "resumed") == statistics(tmp_path / "later")

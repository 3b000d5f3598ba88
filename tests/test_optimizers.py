"""The optimizer group: AdamW as it was (bit for bit), Muon against a float64 reference, resume rules."""

import copy
import json
import math
from pathlib import Path

import pytest
import torch
from torch import nn

from analysis.runs import load_run
from lightning_modules.llama import Llama
from lightning_modules.llama_settings import LlamaSettings
from lightning_modules.optimizers.muon import Muon, hidden_matrices
from lightning_modules.optimizers.muon_settings import MuonSettings
from lightning_modules.optimizers.parameter_groups import group_settings, restore_group_settings
from tests.run_helpers import REPO, TINY, compose_config, run_to_completion, run_train

REFERENCE = json.loads((REPO / "tests" / "data" / "default_recipe_reference.json").read_text())


def test_optimizer_adamw_is_the_old_default_recipe(tmp_path, tmp_path_factory):
    """The first 8 steps of the default run as it was before the optimizer group existed (now
    ``+experiment=tiny_recipe``), against values stored then. They were equal bit for bit on
    the machine that stored them; another CPU's float32 kernels may round differently (an
    AVX-512 machine's gradient norm differed by 7e-8 relative at step 6), so the check allows
    5e-7 relative: weight decay 0.09 instead of 0.1 already moves the loss of step 8 by 6e-6.
    The stored val/loss was recorded again on 2026-11-26, when validation became the mean over
    tokens instead of over batches (4.0358 before); the training values are the original ones."""
    run_dir = tmp_path / "run"
    overrides = ["optimizer=adamw", "+experiment=tiny_recipe", *REFERENCE["overrides"]]
    run_to_completion(overrides, run_dir, tmp_path_factory.getbasetemp() / "default_cache")
    rows = [row for row in load_run(run_dir).rows if "train/loss" in row]
    for key in ("train/loss", "train/grad_norm", "train/lr"):
        assert [row[key] for row in rows] == pytest.approx(REFERENCE[key], rel=5e-7, abs=0), key
    last_val = [row for row in load_run(run_dir).rows if "val/loss" in row][-1]["val/loss"]
    assert last_val == pytest.approx(REFERENCE["val/loss"], rel=5e-7, abs=0)


NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)  # Jordan et al.'s quintic iteration


def newton_schulz_float64(update: torch.Tensor, steps: int = 5, eps: float = 1e-7) -> torch.Tensor:
    """X <- a X + b (X X^T) X + c (X X^T)^2 X from X = U / ||U||_F, on the wide orientation."""
    a, b, c = NS_COEFFICIENTS
    x = update.double()
    tall = x.shape[0] > x.shape[1]
    x = x.T if tall else x
    x = x / max(x.norm().item(), eps)
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if tall else x


def tiny_model() -> Llama:
    torch.manual_seed(0)
    return Llama(LlamaSettings(vocab_size=64, n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, mlp_hidden=96))


def muon_settings(**overrides) -> MuonSettings:
    values = dict(
        lr=0.02,
        weight_decay=0.1,
        grad_clip=1.0,
        momentum=0.95,
        nesterov=True,
        ns_steps=5,
        adjust_lr_fn="match_rms_adamw",
        ns_dtype="bfloat16",
        betas=[0.9, 0.95],
        eps=1e-8,
    )
    return MuonSettings(**{**values, **overrides})


@pytest.mark.parametrize(("ns_dtype", "tolerance"), [("bfloat16", 0.03), ("float32", 1e-5)])
def test_two_muon_steps_equal_the_float64_reference_and_adamw_its_own(ns_dtype, tolerance):
    """Two steps on random (well-conditioned) gradients, so momentum and Nesterov matter. Each
    Muon matrix's update is within 3% (relative Frobenius) of the float64 iteration when
    Newton-Schulz runs in bfloat16, within 1e-5 in float32; the other parameters equal a plain
    AdamW exactly."""
    model, twin = tiny_model(), tiny_model()
    generator = torch.Generator().manual_seed(1)
    steps = [
        {name: torch.randn(p.shape, generator=generator) for name, p in model.named_parameters()} for _ in range(2)
    ]
    optimizer = muon_settings(ns_dtype=ns_dtype).build(model, fused=False)
    names = {id(p): name for name, p in model.named_parameters()}
    hidden = {names[id(p)] for p in hidden_matrices(model)}
    assert len(hidden) == 2 * 7  # q, k, v, o, gate, up, down in each of 2 blocks
    plain = torch.optim.AdamW(
        [
            {
                "params": [p for n, p in twin.named_parameters() if n not in hidden and "norm" not in n],
                "weight_decay": 0.1,
            },
            {"params": [p for n, p in twin.named_parameters() if "norm" in n], "weight_decay": 0.0},
        ],
        lr=0.02,
        betas=(0.9, 0.95),
        eps=1e-8,
    )
    expected = {name: p.detach().double().clone() for name, p in model.named_parameters() if name in hidden}
    momentum = {name: torch.zeros_like(w) for name, w in expected.items()}
    for grads in steps:
        for name, p in [*model.named_parameters(), *twin.named_parameters()]:
            p.grad = grads[name].clone()
        optimizer.step()
        plain.step()
        for name, weight in expected.items():
            grad = grads[name].double()
            momentum[name] = 0.95 * momentum[name] + 0.05 * grad  # torch's lerp towards the gradient
            nesterov = grad + 0.95 * (momentum[name] - grad)
            adjusted = 0.02 * 0.2 * math.sqrt(max(weight.shape))  # Moonlight's RMS match
            expected[name] = weight * (1 - 0.02 * 0.1) - adjusted * newton_schulz_float64(nesterov)
    for name, p in model.named_parameters():
        if name in hidden:
            step = p.detach().double() - steps_start(twin, name)
            reference = expected[name] - steps_start(twin, name)
            assert (step - reference).norm() <= tolerance * reference.norm(), name
        else:
            assert torch.equal(p, dict(twin.named_parameters())[name]), name


@pytest.mark.parametrize("adjust_lr_fn", ["match_rms_adamw", "original"])
def test_muon_in_bfloat16_steps_as_torch_muon(adjust_lr_fn):
    """The framework's Muon, iterating in bfloat16, against ``torch.optim.Muon``: equal bit for
    bit over three steps on wide, tall and square matrices (so checkpoints and the numbers
    measured with torch's optimizer carry over)."""
    generator = torch.Generator().manual_seed(2)
    shapes = [(32, 96), (96, 32), (48, 48)]
    ours = [nn.Parameter(torch.randn(shape, generator=generator)) for shape in shapes]
    theirs = [nn.Parameter(p.detach().clone()) for p in ours]
    settings = {
        "lr": 0.02,
        "weight_decay": 0.1,
        "momentum": 0.95,
        "nesterov": True,
        "ns_steps": 5,
        "adjust_lr_fn": adjust_lr_fn,
    }
    optimizers = [Muon(ours, ns_dtype="bfloat16", **settings), torch.optim.Muon(theirs, **settings)]
    for _ in range(3):
        for mine, torchs in zip(ours, theirs, strict=True):
            mine.grad = torch.randn(mine.shape, generator=generator)
            torchs.grad = mine.grad.clone()
        for optimizer in optimizers:
            optimizer.step()
    assert all(torch.equal(mine, torchs) for mine, torchs in zip(ours, theirs, strict=True))


def test_muon_auto_iterates_in_float32_on_cpu_and_keeps_it_on_resume():
    """``ns_dtype: auto`` on a CPU model iterates in float32 (bfloat16 is fast only on some
    CPUs). A restored optimizer whose groups came back bare (distributed checkpointing on a
    pipeline rank whose blocks the saved groups do not name) cannot step; given the built
    groups' settings back, it takes the built optimizer's step."""
    model = tiny_model()
    restored_model = copy.deepcopy(model)
    optimizer = muon_settings(ns_dtype="auto").build(model, fused=False)
    assert optimizer.param_groups[0]["ns_dtype"] == "float32"
    state = optimizer.state_dict()
    state["param_groups"] = [{"params": group["params"]} for group in state["param_groups"]]
    restored = muon_settings(ns_dtype="auto").build(restored_model, fused=False)
    restored.load_state_dict(state)
    with pytest.raises(KeyError):
        restored.step()
    restore_group_settings(restored, group_settings(optimizer))
    for first, second in zip(model.parameters(), restored_model.parameters(), strict=True):
        first.grad = torch.randn(first.shape, generator=torch.Generator().manual_seed(first.numel()))
        second.grad = first.grad.clone()
    optimizer.step()
    restored.step()
    for first, second in zip(model.parameters(), restored_model.parameters(), strict=True):
        torch.testing.assert_close(second, first, rtol=0, atol=0)


def steps_start(twin: Llama, name: str) -> torch.Tensor:
    """The hidden matrix before any step (the twin's Muon matrices are never stepped)."""
    return dict(twin.named_parameters())[name].detach().double()


def test_muon_takes_the_hidden_matrices_and_adamw_the_rest():
    model = tiny_model()
    optimizer = muon_settings().build(model, fused=False)
    muon, decayed, gains = optimizer.param_groups
    names = {id(p): name for name, p in model.named_parameters()}
    assert all(".attention." in names[id(p)] or ".mlp." in names[id(p)] for p in muon["params"])
    assert sorted(names[id(p)] for p in decayed["params"]) == ["output.weight", "tok_embeddings.weight"]
    assert all(names[id(p)].endswith("norm.weight") for p in gains["params"]) and gains["weight_decay"] == 0.0
    assert len(muon["params"]) + len(decayed["params"]) + len(gains["params"]) == len(list(model.parameters()))


MUON = [
    *TINY,
    "optimizer=muon",
    "trainer.max_steps=4",
    "logger=csv",
    "callbacks.model_checkpoint.every_n_train_steps=2",
]


def losses(run_dir: Path) -> list[float]:
    return [row["train/loss"] for row in load_run(run_dir).rows if "train/loss" in row]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("muon") / "one"
    run_to_completion(MUON, run_dir, tmp_path_factory.getbasetemp() / "cache")
    return run_dir


@pytest.mark.parametrize(("strategy", "atol"), [("ddp", 1e-5), ("fsdp2", 1e-4)])
def test_two_ranks_take_the_steps_of_one_process(strategy, atol, one_process, tmp_path, tmp_path_factory):
    """DDP steps whole matrices on the averaged gradient, summed in another order than one
    process's (in bfloat16, on an AVX-512 BF16 machine, a flipped rounding inside Newton-Schulz
    moved a loss of 5.5 by 4.8e-6; on CPU ``auto`` now iterates in float32); FSDP2 runs
    Newton-Schulz on row-sharded DTensors (products over gathered shards: equal to 1e-4)."""
    overrides = [*MUON, f"strategy={strategy}", "trainer.devices=2", "trainer.accelerator=cpu"]
    run_to_completion(overrides, tmp_path / "two", tmp_path_factory.getbasetemp() / "cache")
    assert losses(tmp_path / "two") == pytest.approx(losses(one_process), abs=atol)
    rates = [row for row in load_run(tmp_path / "two").rows if "train/lr/muon" in row]
    assert rates and all(row["train/lr/muon"] == row["train/lr/adamw"] == row["train/lr"] for row in rates)


def test_a_muon_run_resumes_exactly_and_refuses_another_optimizer(one_process, tmp_path, tmp_path_factory):
    cache = tmp_path_factory.getbasetemp() / "cache"
    checkpoint = one_process / "checkpoints" / "step000002.ckpt"
    resumed = run_train([*MUON, f"ckpt_path={checkpoint}"], tmp_path / "resumed", cache)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert losses(tmp_path / "resumed") == losses(one_process)[2:]
    other = run_train([*MUON, "optimizer=adamw", f"ckpt_path={checkpoint}"], tmp_path / "other", cache)
    assert other.returncode == 2
    assert other.stderr.strip().splitlines()[-1] == (
        f"error: ckpt_path={checkpoint} was trained with optimizer=muon, but this run has optimizer=adamw;"
        " resume with optimizer=muon, or start a new run without ckpt_path."
    )


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["optimizer=muon", "optimizer.adjust_lr_fn=spectral"], "optimizer.adjust_lr_fn='spectral' is unknown"),
        (["optimizer=muon", "optimizer.momentum=1.5"], "optimizer.momentum=1.5 must lie in [0, 1)"),
        (["optimizer=muon", "optimizer.ns_dtype=float16"], "optimizer.ns_dtype='float16' is unknown"),
        (["optimizer=muon", "strategy=fsdp", "trainer=gpu"], "optimizer=muon (the default) needs whole matrices"),
        (["optimizer.lr=-1"], "optimizer.lr=-1.0 must be > 0"),
    ],
)
def test_optimizer_mistakes_name_the_key(overrides, message, tmp_path):
    from common.errors import ConfigError
    from launch.from_config import read_settings

    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        read_settings(compose_config(TINY + overrides, tmp_path))

"""Float8 training (``layout.float8``) through torchao's emulation on CPU.

The layers are checked against float8 quantisation written out in float64 (scale =
e4m3's largest value / amax, per tensor or per row; torchao's rowwise recipe rounds its
scales down to powers of two), training runs against fp32 and against each other, and a
float8 checkpoint resumes exactly.
"""

import pytest
import torch
from torch import nn

from lightning_modules.float8 import convert_to_float8, float8_linear_config
from lightning_modules.layout_settings import LayoutSettings
from lightning_modules.llama import Llama
from lightning_modules.llama_settings import LlamaSettings
from lightning_modules.parallelism import apply_layout
from tests.run_helpers import (
    OBSERVED,
    TINY,
    checkpoint_weights,
    default_settings,
    run_to_completion,
    train_losses,
)

torchao_float8 = pytest.importorskip("torchao.float8")
Float8Linear = pytest.importorskip("torchao.float8.float8_linear").Float8Linear
E4M3_MAX = torch.finfo(torch.float8_e4m3fn).max
EMULATED = ["layout.float8_emulate=true"]
# Float8 against fp32 over 6 steps of the tiny model measured 3e-5 to 2.7e-3 (rowwise): a
# wrong cast (no scale, e5m2 for e4m3, a layer left out of the backward) moves it by > 0.1.
FLOAT8_LOSS_TOLERANCE = 1e-2
STEPS = 6


def quantised(t: torch.Tensor, amax: torch.Tensor, power_of_two: bool) -> torch.Tensor:
    """``t`` through e4m3 with scale e4m3_max / amax, back in float64."""
    scale = E4M3_MAX / amax.clamp(min=1e-12)
    if power_of_two:
        scale = torch.exp2(torch.floor(torch.log2(scale)))
    return (t * scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).double() / scale.double()


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_a_float8_layer_multiplies_the_float8_values_of_its_input_and_weight(recipe):
    torch.manual_seed(0)
    x = torch.randn(6, 32) * torch.logspace(-2, 1, 6)[:, None]  # rows of very different ranges
    model = nn.Sequential(nn.Linear(32, 48, bias=False))
    weight = model[0].weight.detach().clone()
    torchao_float8.convert_to_float8_training(model, config=float8_linear_config(recipe, emulate=True, sharded=False))
    if recipe == "tensorwise":
        reference = quantised(x, x.abs().amax(), False) @ quantised(weight, weight.abs().amax(), False).T
    else:
        rows = quantised(x, x.abs().amax(-1, keepdim=True), True)
        reference = rows @ quantised(weight, weight.abs().amax(-1, keepdim=True), True).T
    output = model(x).double()
    assert torch.allclose(output, reference, rtol=1e-5, atol=1e-5)
    assert (output - x.double() @ weight.double().T).abs().max() > 1e-2  # float8 is not the fp32 product


def test_only_the_blocks_linear_layers_are_converted():
    layout = default_settings(LayoutSettings, "layout", float8="rowwise", float8_emulate=True)
    with torch.device("meta"):
        model = Llama(LlamaSettings(n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, mlp_hidden=64, vocab_size=96))
    names_before = [name for name, _ in model.named_parameters()]
    apply_layout(model, layout)
    converted = {name for name, module in model.named_modules() if isinstance(module, Float8Linear)}
    expected = {
        f"layers.{i}.{part}"
        for i in range(2)
        for part in (
            "attention.q_proj",
            "attention.k_proj",
            "attention.v_proj",
            "attention.o_proj",
            "mlp.gate_proj",
            "mlp.up_proj",
            "mlp.down_proj",
        )
    }
    assert converted == expected
    assert type(model.output) is nn.Linear and type(model.tok_embeddings) is nn.Embedding
    assert [name for name, _ in model.named_parameters()] == names_before  # checkpoints keep their keys


def test_convert_returns_what_it_converted():
    with torch.device("meta"):
        model = Llama(LlamaSettings(n_layers=1, d_model=32, n_heads=4, vocab_size=96))
    names = convert_to_float8(model, "tensorwise", emulate=True, sharded=False)
    assert len(names) == 7 and all(isinstance(model.get_submodule(name), Float8Linear) for name in names)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.getbasetemp() / "cache"


def trained(tmp_path, cache, name: str, *overrides: str, steps: int = STEPS):
    run_dir = tmp_path / name
    run_to_completion(TINY + OBSERVED + [f"trainer.max_steps={steps}", *overrides], run_dir, cache)
    return run_dir


@pytest.fixture(scope="module")
def runs(tmp_path_factory, cache):
    """fp32, and each float8 recipe (emulated), 6 steps from the same seed and data."""
    root = tmp_path_factory.mktemp("float8_runs")
    return {
        "fp32": trained(root, cache, "fp32"),
        "tensorwise": trained(root, cache, "tensorwise", "layout.float8=tensorwise", *EMULATED),
        "rowwise": trained(root, cache, "rowwise", "layout.float8=rowwise", *EMULATED),
    }


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_float8_training_follows_fp32_within_the_stated_tolerance(runs, recipe):
    reference, float8 = train_losses(runs["fp32"]), train_losses(runs[recipe])
    assert set(float8) == set(reference) == set(range(1, STEPS + 1))
    differences = [abs(float8[step] - reference[step]) for step in reference]
    assert max(differences) <= FLOAT8_LOSS_TOLERANCE, differences
    assert max(differences) > 1e-6, "the float8 run trained exactly as fp32: nothing was cast"


def test_fsdp2_gathers_float8_weights_and_trains_as_one_process(runs, tmp_path, cache):
    """Tensorwise under FSDP2 all-gathers float8 weights with scales from the global amax:
    the same casts as one process, so the same losses up to the order of reductions."""
    sharded = trained(
        tmp_path,
        cache,
        "fsdp2",
        "layout.float8=tensorwise",
        *EMULATED,
        "strategy=fsdp2",
        "trainer.devices=2",
        "trainer.accelerator=cpu",
        "strategy.save_distributed_checkpoint=false",
        steps=4,
    )
    one, two = train_losses(runs["tensorwise"]), train_losses(sharded)
    assert set(two) == {1, 2, 3, 4}
    assert max(abs(two[step] - one[step]) for step in two) <= 1e-5


def test_a_float8_checkpoint_resumes_exactly(runs, tmp_path, cache):
    """Resumed from the rowwise run's step-4 checkpoint: the same losses and final weights."""
    checkpoint = runs["rowwise"] / "checkpoints" / "step000004.ckpt"
    resumed = trained(tmp_path, cache, "resumed", "layout.float8=rowwise", *EMULATED, f"ckpt_path={checkpoint}")
    reference, losses = train_losses(runs["rowwise"]), train_losses(resumed)
    assert min(losses) == 5 and {step: reference[step] for step in losses} == losses
    final = checkpoint_weights(runs["rowwise"] / "checkpoints" / "last.ckpt")
    for name, value in checkpoint_weights(resumed / "checkpoints" / "last.ckpt").items():
        assert torch.equal(value, final[name]), name

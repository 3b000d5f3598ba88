"""The memory plan against Llama-2-7B counted by hand, and the refusal of a model that cannot fit."""

import pytest
import torch

from benchmarks.saved_activations import block_bytes_per_token, block_bytes_per_token_on_ranks
from common.errors import ConfigError
from lightning_modules.llama_settings import LlamaSettings
from lightning_modules.memory_plan import GIB, ActivationLayout, block_activation_bytes, check_fits, memory_plan
from tests.run_helpers import train_in_process

LLAMA2_7B = LlamaSettings(name="llama2_7b", vocab_size=32000, n_layers=32, d_model=4096, n_heads=32, mlp_hidden=11008)
# Llama-2-7B by hand: 2 embedding matrices, 32 x (4 attention + 3 MLP matrices + 2 norms), a final norm.
LLAMA2_7B_PARAMETERS = 2 * 32000 * 4096 + 32 * (4 * 4096 * 4096 + 3 * 4096 * 11008 + 2 * 4096) + 4096


def llama2_7b_plan(**changes):
    """The plan of Llama-2-7B at one 4096-token sequence per rank on one device under
    bf16-mixed AdamW with full checkpointing and the fused loss, with ``changes``."""
    settings = dict(
        precision="bf16-mixed",
        optimizer="adamw",
        shards=1,
        micro_batch=1,
        seq_len=4096,
        checkpointing="full",
        loss="liger",
    )
    return memory_plan(LLAMA2_7B, **{**settings, **changes})


def test_llama2_7b_states_are_16_bytes_per_parameter_under_mixed_precision():
    assert LLAMA2_7B_PARAMETERS == 6_738_415_616  # the published count
    plan = llama2_7b_plan()
    assert plan.states == 16 * LLAMA2_7B_PARAMETERS
    # Autocast over fp32 weights: full checkpointing keeps each block's fp32 input, and one block
    # is recomputed at a time (its norms' fp32 inputs and outputs, five bf16 input casts, q, k, v,
    # attention's output, the MLP's four hidden-width tensors); the fused loss keeps a chunk.
    one_block = 2 * (4 + 4) * 4096 + 5 * 2 * 4096 + 2 * 4 * 4096 + 2 * 4 * 11008
    assert plan.activations == 4096 * (32 * 4 * 4096 + one_block + 4 * 4096)


def test_sharding_divides_the_states_and_bf16_true_halves_them():
    mixed = llama2_7b_plan(shards=4, checkpointing="none", loss="plain")
    pure = llama2_7b_plan(precision="bf16-true", shards=4, checkpointing="none", loss="plain")
    assert mixed.states == pytest.approx(16 * LLAMA2_7B_PARAMETERS / 4)
    assert pure.states == pytest.approx(mixed.states / 2)


def test_a_model_whose_states_exceed_the_device_is_refused_naming_the_fix():
    plan = llama2_7b_plan()
    with pytest.raises(
        ConfigError,
        match=r"model=llama2_7b cannot fit: .* 100\.4 GiB .* than the NVIDIA H100 80GB HBM3's 79\.2 GiB; shard",
    ):
        check_fits(plan, "llama2_7b", "NVIDIA H100 80GB HBM3", int(79.2 * GIB))
    check_fits(plan, "llama2_7b", "NVIDIA H200", int(139.8 * GIB))  # fits: no error


def test_a_gpu_run_that_cannot_fit_exits_2_before_reading_data(monkeypatch, tmp_path):
    """A pretend 1 GiB GPU: the tiny model fits, a 1.1B model (17.6 GB of states) does not."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *args: "Small GPU")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *args: type("P", (), {"total_memory": GIB})())
    code, stderr = train_in_process(
        ["model=tinyllama_1b", "trainer.accelerator=gpu"], tmp_path / "run", tmp_path / "cache"
    )
    lines = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert code == 2 and len(lines) == 1, stderr[-3000:]
    assert "model=tinyllama_1b cannot fit" in lines[0] and "than the Small GPU's 1.0 GiB" in lines[0]
    assert not (tmp_path / "cache").exists() and not (tmp_path / "run").exists()


# Grouped-query attention (2 key-value heads of 4) so the fp32 repeat of k and v is counted.
SMALL = LlamaSettings(vocab_size=256, n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, mlp_hidden=192)
# What the plan leaves out of a block (rotary tables, norm statistics, log-sum-exp) is 3-5% of
# this small block's bytes; a missed or doubled term would be 8% or more.
PLAN_TOLERANCE = 0.06


@pytest.mark.parametrize("precision", ["32-true", "bf16-true", "bf16-mixed"])
def test_a_blocks_activations_are_what_autograd_saves(precision):
    measured = block_bytes_per_token(SMALL, precision)
    planned = block_activation_bytes(SMALL, ActivationLayout.of(precision))
    assert planned == pytest.approx(measured, rel=PLAN_TOLERANCE)
    assert planned <= measured  # what it leaves out only adds


@pytest.mark.parametrize(
    ("precision", "data_parallel", "tensor_parallel", "sequence_parallel"),
    [
        ("bf16-mixed", 2, 1, False),  # FSDP2's mixed-precision policy gathers bf16 weights: a bf16 residual stream
        ("32-true", 1, 2, False),
        ("32-true", 1, 2, True),
        ("bf16-mixed", 1, 2, True),
    ],
)
def test_a_split_blocks_activations_per_rank_are_what_autograd_saves(
    precision, data_parallel, tensor_parallel, sequence_parallel
):
    measured = block_bytes_per_token_on_ranks(SMALL, precision, data_parallel, tensor_parallel, sequence_parallel)
    bf16_weights = precision == "bf16-mixed"  # the helper's FSDP2 takes its mixed-precision policy then
    layout = ActivationLayout.of(precision, bf16_weights, tensor_parallel, sequence_parallel)
    planned = block_activation_bytes(SMALL, layout)
    for rank_bytes in measured:
        assert planned == pytest.approx(rank_bytes, rel=PLAN_TOLERANCE)
        assert planned <= rank_bytes


def test_tensor_and_sequence_parallelism_divide_llama2_7b_activations_as_counted_by_hand():
    """T = 8 under FSDP2's bf16 weights (r = 2): without sequence parallelism the norms stay whole."""
    d, h = 4096, 11008
    split = 2 * (2 * d + 2 * d) + 2 * 4 * h  # attention's q, k, v, output; the MLP's four tensors
    norms = 2 * (4 + 2) * d
    whole_inputs = 2 * 2 * d
    without = block_activation_bytes(LLAMA2_7B, ActivationLayout.of("bf16-mixed", True, 8, False))
    with_sp = block_activation_bytes(LLAMA2_7B, ActivationLayout.of("bf16-mixed", True, 8, True))
    assert without == norms + whole_inputs + split / 8
    assert with_sp == norms / 8 + whole_inputs + split / 8
    plan = llama2_7b_plan(
        shards=8,
        bf16_weights=True,
        checkpointing="none",
        loss="plain",
        tensor_parallel=8,
        sequence_parallel=True,
    )
    assert plan.activations == 4096 * (32 * with_sp + 10 * 32000 / 8)

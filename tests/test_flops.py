"""FLOPs per token against torch's FlopCounterMode on a meta-device model, and the peak table."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from lightning_modules.flops import (
    attention_flops_per_token,
    matmul_parameters,
    model_flops_per_token,
    peak_flops,
)
from lightning_modules.llama import Llama
from lightning_modules.llama_settings import LlamaSettings


@pytest.mark.parametrize("tie", [False, True])
@pytest.mark.parametrize("seq_len", [64, 256])
def test_formula_matches_flop_counter(tie: bool, seq_len: int):
    config = LlamaSettings(
        vocab_size=512, n_layers=3, d_model=256, n_heads=8, n_kv_heads=2, mlp_hidden=704, tie_embeddings=tie
    )
    batch = 2
    with torch.device("meta"):
        model = Llama(config)
        tokens = torch.randint(0, config.vocab_size, (batch, seq_len))
    counter = FlopCounterMode(display=False)
    with counter:
        model(tokens).sum().backward()
    counts = {str(op): flops for op, flops in counter.get_flop_counts()["Global"].items()}
    n_tokens = batch * seq_len
    matmuls = counts.pop("aten.mm") / n_tokens  # weight matmuls
    attention = sum(counts.values()) / n_tokens  # QK^T and AV (bmm or fused SDPA)
    assert matmuls == pytest.approx(6 * matmul_parameters(config), rel=0.01)
    assert attention == pytest.approx(attention_flops_per_token(config, seq_len), rel=1e-9)
    assert model_flops_per_token(config, seq_len) == pytest.approx(matmuls + attention, rel=0.01)


def test_include_embedding_adds_the_input_table():
    config = LlamaSettings(vocab_size=1000, n_layers=2, d_model=64, n_heads=4, mlp_hidden=128)
    assert matmul_parameters(config, include_embedding=True) - matmul_parameters(config) == 1000 * 64


@pytest.mark.parametrize(
    ("name", "peak"),
    [
        ("NVIDIA H100 80GB HBM3", 989e12),
        ("NVIDIA H100 PCIe", 756e12),
        ("NVIDIA H200", 989e12),
        ("NVIDIA A100-SXM4-80GB", 312e12),
        ("NVIDIA GeForce RTX 3090", None),
    ],
)
def test_peak_table(name: str, peak: float | None):
    assert peak_flops(name) == peak

"""The Llama model against independent references: published parameter counts, a
complex-number rotary reference, explicit masked-softmax attention, and causality."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from lightning_modules.llama import Llama, apply_rotary, causal_attention, count_parameters, rotary_cos_sin
from lightning_modules.llama_settings import LlamaSettings

MODEL_CONF = Path(__file__).resolve().parents[1] / "conf" / "model"
EXPECTED_PRESETS = {
    "nano",
    "tiny",
    "micro_llama_300m",
    "tinyllama_1b",
    "open_llama_3b",
    "llama2_7b",
    "llama2_13b",
    "diloco_35m",
    "diloco_90m",
    "diloco_180m",
    "diloco_330m",
    "diloco_550m",
    "diloco_1_3b",
    "diloco_2_4b",
}


def load_preset(name: str) -> LlamaSettings:
    """Compose a preset exactly as Hydra would: instantiate its ``_target_``."""
    return instantiate(OmegaConf.load(MODEL_CONF / f"{name}.yaml"))


def small_config(**overrides: object) -> LlamaSettings:
    """A 2-layer model; init_std 0.2 makes attention sharp enough that positions matter visibly."""
    fields = dict(vocab_size=97, n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, mlp_hidden=64, init_std=0.2)
    return LlamaSettings(**{**fields, **overrides})


def small_model(seed: int = 0, **overrides: object) -> Llama:
    torch.manual_seed(seed)
    return Llama(small_config(**overrides)).eval()


def rotate_reference(x: torch.Tensor, position: int, theta: float) -> torch.Tensor:
    """Half-rotation RoPE written with complex numbers: dimension pair (i, i + d/2) is the
    complex number x_i + j x_{i+d/2}, multiplied by exp(j * position * theta^(-2i/d))."""
    half = x.shape[-1] // 2
    pairs = torch.complex(x[..., :half].double(), x[..., half:].double())
    freqs = theta ** (-torch.arange(half, dtype=torch.float64) * 2 / x.shape[-1])
    rotated = pairs * torch.polar(torch.ones_like(freqs), position * freqs)
    return torch.cat((rotated.real, rotated.imag), dim=-1)


@pytest.mark.parametrize(
    ("preset", "published"),
    [("tinyllama_1b", 1_100_048_384), ("llama2_7b", 6_738_415_616), ("llama2_13b", 13_015_864_320)],
)
def test_preset_parameter_counts_match_published(preset: str, published: int) -> None:
    assert count_parameters(load_preset(preset)) == published


def test_every_preset_composes_and_builds_on_meta() -> None:
    files = sorted(MODEL_CONF.glob("*.yaml"))
    assert EXPECTED_PRESETS <= {f.stem for f in files}
    for file in files:
        config = instantiate(OmegaConf.load(file))
        assert isinstance(config, LlamaSettings), file.name
        if config.vocab_size is None:  # tiny: the training code fills it in from the tokenizer
            config = dataclasses.replace(config, vocab_size=32000)
        with torch.device("meta"):
            model = Llama(config)
        assert model.output.weight.shape == (config.vocab_size, config.d_model), file.name


def test_default_mlp_hidden_follows_llama_rule() -> None:
    """Llama-2-7B and 13B's published intermediate sizes follow the 8/3 * d rounded to 256 rule."""
    assert LlamaSettings(n_layers=1, d_model=4096, n_heads=32).mlp_hidden == 11008
    assert LlamaSettings(n_layers=1, d_model=5120, n_heads=40).mlp_hidden == 13824
    assert LlamaSettings(n_layers=1, d_model=64, n_heads=4).n_kv_heads == 4


def test_rotary_matches_complex_reference() -> None:
    torch.manual_seed(0)
    x = torch.randn(3, 16)
    positions = torch.tensor([0, 5, 1234])
    cos, sin = rotary_cos_sin(positions, head_dim=16, theta=500000.0)
    expected = torch.stack([rotate_reference(x[i], int(p), 500000.0) for i, p in enumerate(positions)])
    # fp32 angles at position 1234 carry ~1e-4 absolute error, as in every fp32 RoPE.
    torch.testing.assert_close(apply_rotary(x, cos, sin).double(), expected, atol=1e-4, rtol=1e-4)


def test_rotary_scores_depend_only_on_relative_position() -> None:
    """Brute force over position pairs: <R(m) q, R(n) k> is a function of m - n alone."""
    torch.manual_seed(0)
    q, k = torch.randn(32), torch.randn(32)
    positions = torch.arange(40)
    cos, sin = rotary_cos_sin(positions, head_dim=32, theta=10000.0)
    rq, rk = apply_rotary(q.expand(40, 32), cos, sin), apply_rotary(k.expand(40, 32), cos, sin)
    scores = rq @ rk.T  # scores[m, n]
    for offset in (-7, 0, 3, 20):
        diagonal = torch.diagonal(scores, offset=offset)
        torch.testing.assert_close(diagonal, diagonal[:1].expand_as(diagonal), atol=1e-4, rtol=1e-4)
    assert not torch.allclose(scores[0, 0], scores[0, 3])


def test_changing_a_future_token_leaves_earlier_logits_unchanged() -> None:
    model = small_model()
    ids = torch.randint(0, 97, (2, 12))
    changed = ids.clone()
    changed[:, 7] = (changed[:, 7] + 1) % 97
    with torch.no_grad():
        before, after = model(ids), model(changed)
    torch.testing.assert_close(before[:, :7], after[:, :7], atol=0, rtol=0)
    assert not torch.allclose(before[:, 7], after[:, 7])


def reference_attention(attention: torch.nn.Module, x: torch.Tensor, theta: float) -> torch.Tensor:
    """Grouped-query attention with k/v heads explicitly repeated, plain matmuls and softmax."""
    b, t, _ = x.shape
    n_heads, n_kv, hd = attention.n_heads, attention.n_kv_heads, attention.head_dim
    q = (x @ attention.q_proj.weight.T).view(b, t, n_heads, hd)
    k = (x @ attention.k_proj.weight.T).view(b, t, n_kv, hd)
    v = (x @ attention.v_proj.weight.T).view(b, t, n_kv, hd)
    q = torch.stack([rotate_reference(q[:, i], i, theta) for i in range(t)], dim=1).float()
    k = torch.stack([rotate_reference(k[:, i], i, theta) for i in range(t)], dim=1).float()
    group = n_heads // n_kv  # query head h reads kv head h // group
    k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(hd)
    future = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
    weights = scores.masked_fill(future, float("-inf")).softmax(dim=-1)
    out = torch.einsum("bhqk,bkhd->bqhd", weights, v).reshape(b, t, n_heads * hd)
    return out @ attention.o_proj.weight.T


@pytest.mark.parametrize("n_kv_heads", [1, 2, 4])
def test_grouped_query_attention_matches_explicit_reference(n_kv_heads: int) -> None:
    """fp32 repeats k/v explicitly; the reference checks the head grouping."""
    model = small_model(n_kv_heads=n_kv_heads, rope_theta=500.0)
    attention = model.layers["0"].attention
    x = torch.randn(2, 9, 32)
    cos, sin = rotary_cos_sin(torch.arange(9)[None], model.config.head_dim, 500.0)
    with torch.no_grad():
        ours = attention(x, cos.unsqueeze(1), sin.unsqueeze(1))
        expected = reference_attention(attention, x, 500.0)
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-5)


def test_bf16_grouped_attention_uses_native_gqa_with_same_grouping() -> None:
    """bf16 goes through SDPA's enable_gqa path; it must group heads as the fp32 path does."""
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 8, 10, 16), torch.randn(2, 2, 10, 16), torch.randn(2, 2, 10, 16)
    fp32 = causal_attention(q, k, v)
    bf16 = causal_attention(q.bfloat16(), k.bfloat16(), v.bfloat16())
    assert bf16.dtype == torch.bfloat16
    torch.testing.assert_close(bf16.float(), fp32, atol=3e-2, rtol=3e-2)


def test_shifting_all_positions_leaves_logits_unchanged() -> None:
    """The whole model inherits RoPE's relative-position property; position_ids are used."""
    model = small_model()
    ids = torch.randint(0, 97, (2, 10))
    with torch.no_grad():
        default = model(ids)
        shifted = model(ids, torch.arange(10).expand(2, 10) + 37)
        reversed_positions = model(ids, torch.arange(10).flip(0).expand(2, 10))
    torch.testing.assert_close(default, shifted, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(default, reversed_positions, atol=1e-3)


def test_rows_whose_positions_restart_equal_separate_runs() -> None:
    """Sequence-length warmup's reshape mode: a [1, 2L] block becomes [2, L] rows whose
    positions restart at 0; each row must equal running its segment alone."""
    model = small_model()
    ids = torch.randint(0, 97, (1, 16))
    rows = ids.view(2, 8)
    with torch.no_grad():
        together = model(rows, torch.arange(8).repeat(2, 1))
        first, second = model(ids[:, :8]), model(ids[:, 8:])
    torch.testing.assert_close(together[0], first[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(together[1], second[0], atol=1e-5, rtol=1e-5)


def test_restart_within_a_row_does_not_mask_earlier_documents() -> None:
    """Positions restarting mid-row change only the rotary angles: the second segment still
    attends to the first (no document masking, like Hugging Face without an attention mask).
    The first segment is unaffected by what follows, by causality."""
    model = small_model()
    ids = torch.randint(0, 97, (1, 12))
    positions = torch.cat((torch.arange(5), torch.arange(7)))[None]
    with torch.no_grad():
        packed = model(ids, positions)
        first, second = model(ids[:, :5]), model(ids[:, 5:])
    torch.testing.assert_close(packed[:, :5], first, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(packed[:, 5:], second, atol=1e-3)


def test_initialisation_statistics_and_determinism() -> None:
    torch.manual_seed(0)
    config = small_config(n_layers=4, d_model=256, n_heads=4, mlp_hidden=512, vocab_size=1000, init_std=0.02)
    model = Llama(config)
    residual_std = 0.02 / math.sqrt(2 * 4)
    block = model.layers["2"]
    for weight, std in [
        (block.attention.o_proj.weight, residual_std),
        (block.mlp.down_proj.weight, residual_std),
        (block.attention.q_proj.weight, 0.02),
        (block.mlp.gate_proj.weight, 0.02),
        (model.tok_embeddings.weight, 0.02),
        (model.output.weight, 0.02),
    ]:
        assert weight.std().item() == pytest.approx(std, rel=0.03)
        assert abs(weight.mean().item()) < 0.1 * std
    assert torch.equal(block.attention_norm.weight, torch.ones(256))
    torch.manual_seed(0)
    again = Llama(config)
    for (name, a), b in zip(model.state_dict().items(), again.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        (dict(d_model=30), "d_model"),
        (dict(n_kv_heads=3), "n_kv_heads"),
        (dict(n_layers=0), "n_layers"),
        (dict(vocab_size=-5), "vocab_size"),
        (dict(mlp_hidden=0), "mlp_hidden"),
        (dict(norm_eps=0.0), "norm_eps"),
        (dict(rope_theta=-1.0), "rope_theta"),
        (dict(d_model=12, n_heads=4, n_kv_heads=4), "d_model / n_heads"),
    ],
)
def test_invalid_config_raises_naming_the_field(overrides: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        small_config(**overrides)


def test_building_without_vocab_size_raises() -> None:
    with pytest.raises(ValueError, match="vocab_size"):
        Llama(small_config(vocab_size=None))


def test_tied_embeddings_share_storage_and_count_once() -> None:
    tied, untied = small_model(tie_embeddings=True), small_model(tie_embeddings=False)
    assert tied.output.weight is tied.tok_embeddings.weight
    assert tied.output.weight.data_ptr() == tied.tok_embeddings.weight.data_ptr()
    table = 97 * 32
    n_untied = count_parameters(untied.config)
    assert sum(p.numel() for p in untied.parameters()) == n_untied
    assert count_parameters(tied.config) == n_untied - table
    # MFU's N: the input table is dropped unless it doubles as the output projection.
    assert count_parameters(untied.config, include_embedding=False) == n_untied - table
    assert count_parameters(tied.config, include_embedding=False) == n_untied - table

"""Layout knobs change memory and speed, never the numbers or the checkpoint format."""

import copy

import pytest
import torch
import torch.nn.functional as F

from common.errors import ConfigError
from lightning_modules.layout_settings import LayoutSettings
from lightning_modules.llama import Llama
from lightning_modules.llama_settings import LlamaSettings
from lightning_modules.optimizers.parameter_groups import decay_groups, trainable
from lightning_modules.parallelism import apply_layout, attention_backend
from tests.run_helpers import default_settings

CONFIG = LlamaSettings(vocab_size=64, n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, mlp_hidden=64)


def loss_and_grads(model: torch.nn.Module, tokens: torch.Tensor):
    loss = F.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())
    loss.backward()
    return loss.detach(), [p.grad for p in model.parameters()]


@pytest.mark.parametrize("mode", ["full", "mlp"])
def test_activation_checkpointing_recomputes_the_same_gradients(mode):
    torch.manual_seed(0)
    reference = Llama(CONFIG)
    checkpointed = copy.deepcopy(reference)
    apply_layout(checkpointed, default_settings(LayoutSettings, "layout", activation_checkpointing=mode))
    tokens = torch.randint(0, 64, (2, 17))

    loss, grads = loss_and_grads(reference, tokens)
    loss_ckpt, grads_ckpt = loss_and_grads(checkpointed, tokens)
    torch.testing.assert_close(loss_ckpt, loss, rtol=0, atol=0)
    # Same parameter names: checkpoints and HF export do not depend on the layout.
    assert checkpointed.state_dict().keys() == reference.state_dict().keys()
    assert len(grads_ckpt) == len(grads)
    for grad_ckpt, grad in zip(grads_ckpt, grads, strict=True):
        torch.testing.assert_close(grad_ckpt, grad, rtol=0, atol=0)


@pytest.mark.parametrize(
    ("setting", "value"), [("activation_checkpointing", "selective"), ("compile", True), ("loss", "fused")]
)
def test_unknown_layout_choices_are_rejected(setting, value):
    with pytest.raises(ConfigError, match=f"layout.{setting}"):
        default_settings(LayoutSettings, "layout", **{setting: value})


@pytest.mark.parametrize(("loss", "compile"), [("chunked", "none"), ("plain", "blocks"), ("chunked", "model")])
def test_loss_kernels_and_compile_give_the_plain_loss_and_gradients(loss, compile):
    """The model's loss path (labels given) against logits then fp32 cross-entropy, outside the model."""
    torch.manual_seed(0)
    reference = Llama(CONFIG)
    laid_out = copy.deepcopy(reference)
    apply_layout(laid_out, default_settings(LayoutSettings, "layout", loss=loss, compile=compile))
    tokens = torch.randint(0, 64, (2, 17))
    loss_ref, grads_ref = loss_and_grads(reference, tokens)
    loss_new = laid_out(tokens[:, :-1], labels=tokens[:, 1:])
    loss_new.backward()
    torch.testing.assert_close(loss_new, loss_ref, rtol=1e-6, atol=1e-6)
    for param, grad in zip(laid_out.parameters(), grads_ref, strict=True):
        torch.testing.assert_close(param.grad, grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", ["math", "flash"])
def test_forced_attention_backend_gives_the_same_logits(backend):
    torch.manual_seed(0)
    model = Llama(CONFIG)
    tokens = torch.randint(0, 64, (2, 16))
    with torch.no_grad():
        reference = model(tokens)
        with attention_backend(backend):
            forced = model(tokens)
    torch.testing.assert_close(forced, reference, rtol=1e-5, atol=1e-5)


def test_weight_decay_groups_do_not_depend_on_parameter_shapes():
    """Norm gains are never decayed, every matrix is, also once FSDP1 flattens them to 1-D."""
    model = Llama(CONFIG)
    decayed, plain = decay_groups(trainable(model), model, 0.1)
    assert {id(p) for p in decayed["params"]} == {id(p) for p in model.parameters() if p.ndim == 2}
    assert len(plain["params"]) == 2 * CONFIG.n_layers + 1
    with torch.no_grad():  # what FSDP1's flat parameters look like to the optimizer
        for param in model.parameters():
            param.data = param.data.flatten()
    decayed_flat, _ = decay_groups(trainable(model), model, 0.1)
    assert [id(p) for p in decayed_flat["params"]] == [id(p) for p in decayed["params"]]


def test_dynamic_compile_does_not_recompile_when_the_first_length_equals_d_model():
    """Seen on an H100 with TinyLlama (d_model = seq_len = 2048): with duck shaping the first
    length shared d_model's symbol, was specialised, and the next length recompiled."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    model = Llama(CONFIG)
    apply_layout(model, default_settings(LayoutSettings, "layout", compile="blocks"), dynamic_seq_len=True)
    graphs = []
    for length in (CONFIG.d_model, 8, 16):  # the full length first, as the preallocation pass runs it
        model(torch.randint(0, 64, (2, length))).float().mean().backward()
        graphs.append(counters["stats"]["unique_graphs"])
    assert graphs[1:] == [graphs[0]] * 2


@pytest.mark.parametrize(
    ("compile_mode", "expected"), [("default", None), ("max-autotune-no-cudagraphs", "max-autotune-no-cudagraphs")]
)
def test_the_inductor_mode_reaches_every_compiled_block(monkeypatch, compile_mode, expected):
    calls = []
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, **kwargs: calls.append(kwargs))
    with torch.device("meta"):
        model = Llama(LlamaSettings(n_layers=3, d_model=32, n_heads=4, vocab_size=64))
    apply_layout(model, default_settings(LayoutSettings, "layout", compile="blocks", compile_mode=compile_mode))
    assert calls == [{"dynamic": None, "mode": expected}] * 3

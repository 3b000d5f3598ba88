"""The chunked linear + cross-entropy against float64 brute force and the plain bf16 path, what it
keeps for backward, and the optional Liger kernels' selection and module swaps."""

import copy

import pytest
import torch
import torch.nn.functional as F

from lightning_modules import liger_kernels
from lightning_modules.fused_cross_entropy import IGNORE_INDEX, linear_cross_entropy
from lightning_modules.layout_settings import LayoutSettings
from lightning_modules.llama import MLP, Attention, Llama, RMSNorm
from lightning_modules.llama_settings import LlamaSettings
from lightning_modules.parallelism import apply_layout
from tests.run_helpers import default_settings


def make_case(n: int, d: int, v: int, dtype: torch.dtype = torch.float32, seed: int = 0):
    """Hidden states, an output weight scaled so logits spread over a few units, labels with
    every 7th token ignored."""
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, d, generator=generator)
    weight = torch.randn(v, d, generator=generator) * (2.0 / d**0.5)
    labels = torch.randint(0, v, (n,), generator=generator)
    labels[::7] = IGNORE_INDEX
    return hidden.to(dtype), weight.to(dtype), labels


def loss_and_grads(loss_fn, hidden, weight, labels, grad_output=1.0):
    """Loss and gradients of a (hidden, weight, labels) -> loss function, for fresh leaves."""
    hidden, weight = hidden.detach().requires_grad_(), weight.detach().requires_grad_()
    loss = loss_fn(hidden, weight, labels)
    loss.backward(torch.tensor(grad_output, dtype=loss.dtype))
    return loss.detach(), hidden.grad, weight.grad


def float64_reference(hidden, weight, labels):
    return F.cross_entropy(hidden.double() @ weight.double().T, labels)


def plain_path(hidden, weight, labels):
    """What the training module does today: logits in the inputs' dtype, then fp32 CE."""
    return F.cross_entropy((hidden @ weight.T).float(), labels)


def assert_within_1e6(value: torch.Tensor, reference: torch.Tensor) -> None:
    """1e-6 relative: each entry within 1e-6 of its own size plus 1e-6 of the tensor's largest.

    That is fp32's floor here: a softmax probability exp(logit - lse) carries a relative
    rounding of about |logit - lse| x 2^-24, a few 1e-7 for logits a few units apart, and
    the gradient sums add their own; the plain fp32 path is as far off.
    """
    scale = reference.abs().max().item()
    torch.testing.assert_close(value.double(), reference.double(), rtol=1e-6, atol=1e-6 * scale)


def normwise_error(value: torch.Tensor, reference: torch.Tensor) -> float:
    """max |value - reference| / max |reference|: rounding relative to the tensor's scale."""
    return ((value.double() - reference.double()).abs().max() / reference.double().abs().max()).item()


@pytest.mark.parametrize(
    ("n", "chunk_size"),
    [(256, 64), (300, 64), (300, 1024), (5, 1)],
    ids=["multiple-of-chunk", "ragged-last-chunk", "one-chunk", "row-by-row"],
)
def test_fp32_loss_and_gradients_match_float64_reference(n, chunk_size):
    """With an incoming gradient other than 1, and every 7th token ignored."""
    hidden, weight, labels = make_case(n, 48, 500)
    loss, d_hidden, d_weight = loss_and_grads(
        lambda h, w, y: linear_cross_entropy(h, w, y, chunk_size=chunk_size), hidden, weight, labels, 0.37
    )
    ref_loss, ref_hidden, ref_weight = loss_and_grads(float64_reference, hidden, weight, labels, 0.37)
    assert loss.dtype == torch.float32
    assert abs(loss.item() - ref_loss.item()) <= 1e-6 * ref_loss.item()
    assert_within_1e6(d_hidden, ref_hidden)
    assert_within_1e6(d_weight, ref_weight)
    assert torch.all(d_hidden[labels == IGNORE_INDEX] == 0)  # ignored tokens get no gradient


def test_no_labelled_token_gives_nan_loss_and_zero_gradients_like_cross_entropy():
    hidden, weight, labels = make_case(10, 8, 20)
    labels[:] = IGNORE_INDEX
    loss, d_hidden, d_weight = loss_and_grads(linear_cross_entropy, hidden, weight, labels)
    ref_loss, ref_hidden, ref_weight = loss_and_grads(plain_path, hidden, weight, labels)
    assert loss.isnan() and ref_loss.isnan()
    assert torch.equal(d_hidden, ref_hidden) and torch.equal(d_weight, ref_weight)


def test_tied_embedding_gets_both_gradients():
    """The weight is also the input embedding: autograd adds the loss's weight gradient to
    the lookup's."""
    generator = torch.Generator().manual_seed(1)
    table = torch.randn(300, 32, generator=generator) * 0.3
    ids = torch.randint(0, 300, (2, 40), generator=generator)
    labels = torch.randint(0, 300, (80,), generator=generator)

    def tied_grad(loss_fn, dtype):
        weight = table.to(dtype).detach().requires_grad_()
        hidden = torch.tanh(F.embedding(ids, weight)).flatten(0, 1)
        loss_fn(hidden, weight, labels).backward()
        return weight.grad

    ours = tied_grad(lambda h, w, y: linear_cross_entropy(h, w, y, chunk_size=16), torch.float32)
    assert_within_1e6(ours, tied_grad(float64_reference, torch.float64))


@pytest.mark.parametrize("autocast", [False, True], ids=["bf16-inputs", "fp32-inputs-under-bf16-autocast"])
def test_bf16_matches_plain_bf16_matmul_then_fp32_cross_entropy(autocast):
    """Both paths round the logits and the logits' gradient to bf16 (unit roundoff 2^-9) and
    reduce in fp32; the chunked one also rounds each chunk's weight-gradient product to bf16
    before summing chunks in fp32. So the loss agrees to fp32 rounding (1e-5), and the
    gradients to a few bf16 roundings of their scale: 2^-6 of the largest entry, which both
    paths also meet against float64 (observed over 15 seeds: at most 0.0075 between the
    paths, 0.0083 from float64, the same for both)."""
    hidden, weight, labels = make_case(1000, 64, 700)
    dtype = torch.float32 if autocast else torch.bfloat16
    hidden, weight = hidden.to(dtype), weight.to(dtype)

    def run(loss_fn):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            return loss_and_grads(loss_fn, hidden, weight, labels)

    chunked = run(lambda h, w, y: linear_cross_entropy(h, w, y, chunk_size=128))
    plain = run(plain_path)
    exact = loss_and_grads(float64_reference, hidden, weight, labels)
    assert chunked[1].dtype == hidden.dtype and chunked[2].dtype == weight.dtype
    assert abs(chunked[0].item() - plain[0].item()) <= 1e-5 * plain[0].item()
    for ours, theirs, truth in zip(chunked[1:], plain[1:], exact[1:], strict=True):
        assert normwise_error(ours, theirs) <= 2**-6
        assert normwise_error(ours, truth) <= 2**-6


def test_gradcheck_in_double():
    hidden, weight, labels = make_case(9, 4, 6, dtype=torch.float64)
    hidden.requires_grad_(), weight.requires_grad_()
    assert torch.autograd.gradcheck(lambda h, w: linear_cross_entropy(h, w, labels, chunk_size=4), (hidden, weight))


def saved_tensor_bytes(loss_fn, hidden, weight, labels) -> int:
    """Bytes of the storages autograd keeps for backward while the loss is computed (each
    storage once: log-softmax's output is saved by both log_softmax and nll_loss)."""
    storages = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    hidden, weight = hidden.detach().requires_grad_(), weight.detach().requires_grad_()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = loss_fn(hidden, weight, labels)
    loss.backward()
    return sum(storages.values())


def test_saved_for_backward_is_hidden_and_weight_sized_not_logits_sized():
    """The plain path keeps at least the fp32 log-softmax, N x V x 4 bytes (32 MiB here); the
    chunked one exactly one hidden-sized and one weight-sized gradient (0.75 MiB)."""
    n, d, v = 2048, 32, 4096
    hidden, weight, labels = make_case(n, d, v)
    chunked = saved_tensor_bytes(lambda h, w, y: linear_cross_entropy(h, w, y, chunk_size=256), hidden, weight, labels)
    plain = saved_tensor_bytes(plain_path, hidden, weight, labels)
    print(f"\nsaved for backward, N={n} d={d} V={v}: plain {plain:,} B, chunked {chunked:,} B")
    assert chunked == (n * d + v * d) * 4
    assert plain >= n * v * 4


def test_without_grad_mode_only_the_loss_is_computed():
    hidden, weight, labels = make_case(100, 16, 50)
    with torch.no_grad():
        loss = linear_cross_entropy(hidden.requires_grad_(), weight, labels, chunk_size=32)
    assert loss.grad_fn is None
    assert abs(loss.item() - float64_reference(hidden, weight, labels).item()) <= 1e-6 * loss.item()


@pytest.mark.parametrize(
    ("shapes", "chunk_size"),
    [(((4, 8), (10, 8), (4, 1)), 2), (((4, 8), (10, 6), (4,)), 2), (((4, 8), (10, 8), (4,)), 0)],
    ids=["labels-not-flat", "d-mismatch", "chunk-size"],
)
def test_bad_shapes_and_chunk_size_are_rejected(shapes, chunk_size):
    hidden, weight, labels = torch.randn(shapes[0]), torch.randn(shapes[1]), torch.zeros(shapes[2], dtype=torch.long)
    with pytest.raises(ValueError, match="linear_cross_entropy"):
        linear_cross_entropy(hidden, weight, labels, chunk_size)


# ---------------------------------------------------------------- optional Liger kernels
CONFIG = LlamaSettings(vocab_size=64, n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, mlp_hidden=64)


def test_without_cuda_liger_is_unavailable_and_everything_falls_back():
    """CPU here, whether liger-kernel is installed or not."""
    assert not liger_kernels.liger_available()
    assert liger_kernels.liger_linear_cross_entropy() is None
    assert liger_kernels.select_linear_cross_entropy() is linear_cross_entropy
    model = Llama(CONFIG)
    assert not liger_kernels.apply_liger_kernels(model)
    assert {type(module) for module in model.modules()} >= {RMSNorm, MLP, Attention}


def reference_rms_norm(x, weight, eps, casting_mode, in_place):
    """Liger's ``llama`` casting mode as documented: fp32 statistics, cast back, then the gain."""
    assert casting_mode == "llama" and not in_place
    return weight * (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def reference_rope(q, k, cos, sin):
    """Liger's RoPE contract: [b, H, T, hd] q/k, [b or 1, 1, T, hd] tables repeating their
    angles for both halves; dimension pair (i, i + hd/2) is rotated by angle i."""
    half = q.size(-1) // 2
    c, s = cos[..., :half], sin[..., :half]

    def rotate(x):
        first, second = x[..., :half], x[..., half:]
        return torch.cat((first * c - second * s, second * c + first * s), dim=-1)

    return rotate(q), rotate(k)


def test_liger_swaps_keep_parameters_and_call_the_kernels_with_their_contract(monkeypatch):
    """With CUDA and Liger faked by references of its documented semantics, the swapped model
    computes what the plain one does, with the same parameters under the same names and
    types, and the loss hands Liger (input, weight, target) with -100 ignored, mean reduction
    and fp32 weight-gradient accumulation. (Liger's real kernels need a GPU; its loss and
    RoPE were also checked against these paths under Triton's CPU interpreter.)"""
    calls = []

    def fake_fused_loss(hidden, weight, labels, **options):
        calls.append(options)
        return F.cross_entropy(hidden @ weight.T, labels, ignore_index=options["ignore_index"])

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(liger_kernels, "liger_fused_linear_cross_entropy", fake_fused_loss)
    monkeypatch.setattr(liger_kernels, "liger_rms_norm", reference_rms_norm)
    monkeypatch.setattr(liger_kernels, "liger_swiglu", lambda gate, up: F.silu(gate) * up)
    monkeypatch.setattr(liger_kernels, "liger_rope", reference_rope)
    torch.manual_seed(0)
    plain = Llama(CONFIG)
    swapped = copy.deepcopy(plain)
    assert liger_kernels.apply_liger_kernels(swapped)
    assert isinstance(swapped.norm, liger_kernels.LigerRMSNorm) and isinstance(swapped.norm, RMSNorm)
    assert isinstance(swapped.layers["1"].mlp, liger_kernels.LigerMLP)
    assert isinstance(swapped.layers["1"].attention, liger_kernels.LigerAttention)
    assert swapped.state_dict().keys() == plain.state_dict().keys()
    ids = torch.randint(0, 64, (2, 11))
    torch.testing.assert_close(swapped(ids), plain(ids), rtol=1e-6, atol=1e-6)

    hidden, weight, labels = make_case(30, 8, 20)
    loss_fn = liger_kernels.select_linear_cross_entropy()
    torch.testing.assert_close(loss_fn(hidden, weight, labels), linear_cross_entropy(hidden, weight, labels))
    assert calls == [{"ignore_index": IGNORE_INDEX, "reduction": "mean", "accum_dtype": torch.float32}]
    assert liger_kernels.select_linear_cross_entropy(prefer_liger=False) is linear_cross_entropy


@pytest.mark.parametrize(
    ("compile_mode", "dynamic", "swapped"),
    [
        ("none", True, True),
        ("blocks", False, True),
        ("blocks", True, False),
        ("model", True, False),
    ],
)
def test_liger_module_kernels_stay_out_of_graphs_compiled_with_dynamic_shapes(
    monkeypatch, compile_mode, dynamic, swapped
):
    """Dynamo cannot trace Liger's RMSNorm with dynamic shapes (seen on an H100, torch 2.11): a
    layout that compiles with them keeps the plain modules; eager and static compiles swap."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(liger_kernels, "liger_fused_linear_cross_entropy", lambda *args, **kwargs: None)
    layout = default_settings(LayoutSettings, "layout", compile=compile_mode, liger_kernels=True, fused_adamw=False)
    with torch.device("meta"):
        model = Llama(CONFIG)
    apply_layout(model, layout, dynamic_seq_len=dynamic)
    norms = [module for module in model.modules() if isinstance(module, RMSNorm)]
    assert norms and all(isinstance(norm, liger_kernels.LigerRMSNorm) == swapped for norm in norms)
    mlps = [module for module in model.modules() if isinstance(module, MLP)]
    assert mlps and all(isinstance(mlp, liger_kernels.LigerMLP) == swapped for mlp in mlps)

"""Optional Liger kernels (liger-kernel: Triton, CUDA only) for the loss, RMSNorm, SwiGLU and RoPE.

Where liger-kernel is installed and a CUDA device is present, ``select_linear_cross_entropy``
returns Liger's fused linear + cross-entropy and ``apply_liger_kernels`` routes the model's
RMSNorm, SwiGLU and rotary embedding through Liger's kernels; everywhere else the chunked
``linear_cross_entropy`` and the plain modules stay in use, with the same numerics up to
kernel rounding.

Only liger-kernel's functional API (``liger_kernel.transformers.functional``) is used: its
module classes expect Hugging Face configs, and swapping our modules for them would rename
parameters and lose the ``RMSNorm`` type the optimizer's weight-decay grouping reads.
Checked against liger-kernel 0.8.5.
"""

from collections.abc import Callable

import torch
from torch import Tensor, nn

from lightning_modules.fused_cross_entropy import IGNORE_INDEX, linear_cross_entropy
from lightning_modules.llama import MLP, Attention, RMSNorm, causal_attention

try:
    from liger_kernel.transformers.functional import (
        liger_fused_linear_cross_entropy,
        liger_rms_norm,
        liger_rope,
        liger_swiglu,
    )
except ImportError:  # not installed (it needs Triton): the fallbacks below stay in use
    liger_fused_linear_cross_entropy = liger_rms_norm = liger_rope = liger_swiglu = None

LinearCrossEntropy = Callable[[Tensor, Tensor, Tensor], Tensor]
"""(hidden [N, d], output weight [V, d], labels [N]) -> mean loss over labels != -100."""


def liger_available() -> bool:
    """True where Liger's kernels can run: liger-kernel imports and a CUDA device is present.

    liger-kernel imports on CPU-only machines too (Triton does), so importability alone
    does not tell.
    """
    return liger_fused_linear_cross_entropy is not None and torch.cuda.is_available()


def liger_linear_cross_entropy() -> LinearCrossEntropy | None:
    """Liger's fused linear + cross-entropy as a ``LinearCrossEntropy``, or None where unavailable.

    ``accum_dtype=torch.float32`` accumulates the weight gradient in fp32, as the chunked
    fallback does (Liger's default accumulates in the weight's dtype, bf16 under FSDP2's
    mixed precision). Dynamo does not trace into it (``torch.compiler.disable``): the kernel is
    opaque to Inductor anyway, and under ``layout.compile=model`` Dynamo fails on the fp32
    accumulation's ``addmm(out_dtype=...)`` (seen with torch 2.11 and liger-kernel 0.8.5).
    """
    if not liger_available():
        return None

    @torch.compiler.disable
    def loss(hidden: Tensor, weight: Tensor, labels: Tensor) -> Tensor:
        return liger_fused_linear_cross_entropy(
            hidden, weight, labels, ignore_index=IGNORE_INDEX, reduction="mean", accum_dtype=torch.float32
        )

    return loss


def select_linear_cross_entropy(prefer_liger: bool = True) -> LinearCrossEntropy:
    """Liger's fused loss where it can run (and is preferred), else the chunked PyTorch one."""
    liger = liger_linear_cross_entropy() if prefer_liger else None
    return liger if liger is not None else linear_cross_entropy


class LigerRMSNorm(RMSNorm):
    """RMSNorm through Liger's kernel. Its ``llama`` casting mode is this project's order:
    statistics in fp32, cast back to the input dtype, then the gain. ``in_place=False``:
    the in-place variant overwrites the incoming gradient, which is only safe when nothing
    else reads it."""

    def forward(self, x: Tensor) -> Tensor:
        return liger_rms_norm(x, self.weight, self.eps, casting_mode="llama", in_place=False)


class LigerMLP(MLP):
    """SwiGLU with silu(gate) * up fused in one kernel (no [tokens, mlp_hidden] temporaries)."""

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(liger_swiglu(self.gate_proj(x), self.up_proj(x)))


class LigerAttention(Attention):
    """Attention whose q and k rotation is one Liger kernel launch.

    Liger's RoPE uses the same half-rotation convention; it takes the [b or 1, 1, T, hd]
    tables as they are (it squeezes the head axis). They are cast to the activation dtype
    first, as ``apply_rotary`` does.
    """

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = liger_rope(q, k, cos.to(q.dtype), sin.to(q.dtype))
        y = causal_attention(q, k, v)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, -1))


LIGER_CLASSES: dict[type[nn.Module], type[nn.Module]] = {
    RMSNorm: LigerRMSNorm,
    MLP: LigerMLP,
    Attention: LigerAttention,
}


def apply_liger_kernels(model: nn.Module) -> bool:
    """Route every RMSNorm, SwiGLU MLP and attention's RoPE through Liger; False (and the
    model untouched) where Liger cannot run.

    Each module's class is swapped in place for a subclass that only overrides ``forward``
    (as FSDP2 swaps classes), so parameters, their names, initialisation, checkpoints and
    the optimizer's grouping stay as they are. Call it right after building the model
    (meta device included), before the layout (checkpointing, compile, sharding).
    """
    if not liger_available():
        return False
    for module in model.modules():
        liger_class = LIGER_CLASSES.get(type(module))
        if liger_class is not None:
            module.__class__ = liger_class
    return True

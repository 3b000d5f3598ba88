"""How the Llama is laid out on devices: activation checkpointing, torch.compile, FSDP2.

Kept apart from the model (which stays plain torch) and from the training loop, in the
spirit of torchtitan: the LightningModule calls ``apply_layout`` from ``configure_model``.
Order matters and follows torchtitan: checkpointing wraps blocks first, compile then
compiles each block, and FSDP2 shards each (wrapped, compiled) block and then the root.
"""

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

ACTIVATION_CHECKPOINTING = ("none", "full", "mlp")
ATTENTION_BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "math": SDPBackend.MATH,
}


@dataclass
class LayoutConfig:
    """User settings (Hydra group ``layout``).

    - ``activation_checkpointing``: ``none``; ``full`` recomputes each transformer block in
      backward; ``mlp`` recomputes only the SwiGLU MLPs (their hidden activations are the
      largest per-token tensors, attention is kept).
    - ``compile``: torch.compile each transformer block (with dynamic shapes when a
      technique varies the sequence length, so lengths do not each recompile).
    - ``reshard_after_forward``: FSDP2 only. True frees gathered parameters after forward
      (ZeRO-3 style); False keeps them until backward (ZeRO-2 style: more memory, one
      all-gather less per step).
    - ``attention_backend``: ``auto`` lets PyTorch pick the fastest SDPA kernel
      (FlashAttention on recent GPUs in bf16); ``flash``, ``efficient``, ``cudnn`` or
      ``math`` force one, and fail loudly where it cannot run.
    """

    activation_checkpointing: str = "none"
    compile: bool = False
    reshard_after_forward: bool = True
    attention_backend: str = "auto"

    def __post_init__(self) -> None:
        if self.activation_checkpointing not in ACTIVATION_CHECKPOINTING:
            raise ValueError(
                f"layout.activation_checkpointing={self.activation_checkpointing!r} is unknown;"
                f" choose one of {ACTIVATION_CHECKPOINTING}."
            )
        if self.attention_backend != "auto" and self.attention_backend not in ATTENTION_BACKENDS:
            raise ValueError(
                f"layout.attention_backend={self.attention_backend!r} is unknown;"
                f" choose auto or one of {tuple(ATTENTION_BACKENDS)}."
            )


def attention_backend(name: str) -> AbstractContextManager:
    """A context in which SDPA uses only the named kernel (``auto``: PyTorch chooses)."""
    return nullcontext() if name == "auto" else sdpa_kernel([ATTENTION_BACKENDS[name]])


def apply_activation_checkpointing(model: nn.Module, mode: str) -> None:
    """Wrap blocks (or their MLPs) so their activations are recomputed in backward.

    torch's ``checkpoint_wrapper`` strips its own prefix from state-dict keys, so
    checkpoints and Hugging Face export look the same with and without it.
    """
    if mode == "none":
        return
    for index, block in enumerate(model.layers):
        if mode == "full":
            model.layers[index] = checkpoint_wrapper(block)
        else:
            block.mlp = checkpoint_wrapper(block.mlp)


def apply_compile(model: nn.Module, dynamic: bool) -> None:
    """Compile each transformer block in place (parameter names are unchanged).

    ``dynamic``: the sequence length (and, in reshape mode, the row count) changes during
    training, so shapes are compiled as symbolic once instead of recompiling per length.
    """
    for block in model.layers:
        block.compile(dynamic=True if dynamic else None)


def apply_fsdp2(model: nn.Module, mesh, reshard_after_forward: bool) -> None:
    """Shard every block, then the root (embeddings, final norm, output head)."""
    from torch.distributed.fsdp import fully_shard

    for block in model.layers:
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)


def apply_layout(model: nn.Module, config: LayoutConfig, mesh=None, dynamic_seq_len: bool = False) -> None:
    """Apply the configured layout; ``mesh`` is the data-parallel mesh when sharding."""
    apply_activation_checkpointing(model, config.activation_checkpointing)
    if config.compile:
        apply_compile(model, dynamic=dynamic_seq_len)
    if mesh is not None:
        apply_fsdp2(model, mesh, config.reshard_after_forward)


def clip_grad_norm(model: nn.Module, max_norm: float) -> torch.Tensor:
    """Clip gradients to ``max_norm`` (inf: measure only) and return the global norm.

    The norm is over all parameters on all ranks: FSDP2 parameters are DTensors whose
    norm torch reduces across shards; FSDP1 keeps flat local shards, so its own method
    must do the reduction.
    """
    from torch.distributed.fsdp import FullyShardedDataParallel

    if isinstance(model, FullyShardedDataParallel):
        return model.clip_grad_norm_(max_norm)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    return norm.full_tensor() if hasattr(norm, "full_tensor") else norm

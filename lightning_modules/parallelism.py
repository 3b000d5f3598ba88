"""How the Llama is laid out on devices: activation checkpointing, torch.compile, FSDP2.

Kept apart from the model (which stays plain torch) and from the training loop, in the
spirit of torchtitan: the LightningModule calls ``apply_layout`` from ``configure_model``.
Order matters and follows torchtitan: checkpointing wraps blocks first, compile then
compiles each block, and FSDP2 shards each (wrapped, compiled) block and then the root.
"""

import logging
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext

import torch
import torch.distributed as dist
import torch.fx.experimental._config as fx_config
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.parallel import DistributedDataParallel

from lightning_modules.float8 import convert_to_float8
from lightning_modules.layout_settings import LayoutSettings
from lightning_modules.tensor_parallel import apply_tensor_parallel

log = logging.getLogger(__name__)

ATTENTION_BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "math": SDPBackend.MATH,
}


def attention_backend(name: str) -> AbstractContextManager:
    """A context in which SDPA uses only the named kernel (``auto``: PyTorch chooses)."""
    return nullcontext() if name == "auto" else sdpa_kernel([ATTENTION_BACKENDS[name]])


def apply_activation_checkpointing(model: nn.Module, mode: str, every: int = 1) -> None:
    """Wrap every ``every``-th block (or its MLP), from the first, so its activations are
    recomputed in backward.

    torch's ``checkpoint_wrapper`` strips its own prefix from state-dict keys, so
    checkpoints and Hugging Face export look the same with and without it.
    """
    if mode == "none":
        return
    for index, block in model.layers.items():
        if int(index) % every:
            continue
        if mode == "full":
            model.layers[index] = checkpoint_wrapper(block)
        else:
            block.mlp = checkpoint_wrapper(block.mlp)


def apply_compile(model: nn.Module, mode: str, dynamic: bool, inductor_mode: str) -> None:
    """Compile each transformer block, or the whole model, in place (parameter names are unchanged).

    ``dynamic``: the sequence length (and, in reshape mode, the row count) changes during
    training, so shapes are compiled as symbolic once instead of recompiling per length.
    Duck shaping (one symbol for equal sizes) is turned off for it: where the first length
    equals d_model (2048 for TinyLlama), the length would share d_model's symbol, be
    specialised by the broadcast with the norm's weight, and recompile at the next length.
    """
    if dynamic:
        fx_config.use_duck_shape = False
    modules = model.layers.values() if mode == "blocks" else [model]
    for module in modules:
        module.compile(dynamic=True if dynamic else None, mode=None if inductor_mode == "default" else inductor_mode)


def apply_fsdp2(
    model: nn.Module,
    mesh: DeviceMesh,
    reshard_after_forward: bool,
    mixed_precision: bool,
    roots: Sequence[nn.Module] | None = None,
) -> None:
    """Shard every block, then the root (embeddings, final norm, output head): the model, or
    each of ``roots`` (the stages a pipeline rank holds, which share the model's modules)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if mixed_precision else None
    options = {"mesh": mesh, "reshard_after_forward": reshard_after_forward}
    if policy is not None:
        options["mp_policy"] = policy
    for block in model.layers.values():
        fully_shard(block, **options)
    for root in roots or [model]:
        fully_shard(root, **options)


def apply_loss_kernel(model: nn.Module, loss: str) -> None:
    """Put the chosen output-projection + cross-entropy kernel in the model's ``loss_kernel``."""
    from lightning_modules.fused_cross_entropy import linear_cross_entropy
    from lightning_modules.liger_kernels import liger_linear_cross_entropy

    if loss == "chunked":
        model.loss_kernel = linear_cross_entropy
    elif loss == "liger":
        model.loss_kernel = liger_linear_cross_entropy()


def liger_modules_compile(config: LayoutSettings, dynamic_seq_len: bool) -> bool:
    """Whether Liger's module kernels can go into this layout's compiled graph.

    On an H100 with torch 2.11 and liger-kernel 0.8.5, Dynamo fails with an AssertionError
    (``overwrite_tensor_vt_proxy``) tracing Liger's RMSNorm autograd function when it compiles
    with dynamic shapes; static shapes and eager runs work (docs/gpu_benchmark.md).
    """
    return config.compile == "none" or not dynamic_seq_len


def apply_layout(
    model: nn.Module,
    config: LayoutSettings,
    mesh: DeviceMesh | None = None,
    dynamic_seq_len: bool = False,
    tensor_parallel_mesh: DeviceMesh | None = None,
    fsdp_roots: Callable[[nn.Module], Sequence[nn.Module]] | None = None,
) -> None:
    """Apply the configured layout; ``mesh`` is the data-parallel mesh when sharding, and
    ``tensor_parallel_mesh`` the group the blocks are split over (``tensor_parallel.py``);
    ``fsdp_roots`` makes, from the model as laid out so far, the roots FSDP2 shards last
    (``apply_fsdp2``; a pipeline rank's stages).

    Order, as torchtitan: kernels swapped in and float8 linear layers converted, tensor
    parallelism, then checkpointing wraps blocks, compile compiles them (or, for the whole
    model, after sharding), FSDP2 shards each block and then the root. Works on a
    meta-device model (nothing is allocated).
    """
    from lightning_modules.liger_kernels import apply_liger_kernels

    if config.liger_kernels and not liger_modules_compile(config, dynamic_seq_len):
        log.warning(
            "layout.liger_kernels: Liger's RMSNorm, SwiGLU and RoPE stay off in this run: Dynamo cannot trace"
            " their autograd functions with dynamic shapes (a technique varies the sequence length), so the"
            " compiled blocks fuse those ops with Inductor instead; layout.loss=liger is unaffected."
        )
    elif config.liger_kernels:
        apply_liger_kernels(model)
    apply_loss_kernel(model, config.loss)
    if config.float8 != "none":
        convert_to_float8(model, config.float8, config.float8_emulate, sharded=mesh is not None)
    if tensor_parallel_mesh is not None:
        apply_tensor_parallel(model, tensor_parallel_mesh, config.sequence_parallel)
    apply_activation_checkpointing(model, config.activation_checkpointing, config.checkpoint_every)
    if config.compile == "blocks":
        apply_compile(model, "blocks", dynamic_seq_len, config.compile_mode)
    if mesh is not None:
        roots = fsdp_roots(model) if fsdp_roots is not None else None
        apply_fsdp2(model, mesh, config.reshard_after_forward, config.fsdp_mixed_precision, roots)
    if config.compile == "model":
        apply_compile(model, "model", dynamic_seq_len, config.compile_mode)


def data_parallel_mesh(device_mesh: DeviceMesh | None) -> DeviceMesh | None:
    """The data-parallel part of ModelParallelStrategy's mesh (None without that strategy)."""
    if device_mesh is None:
        return None
    if device_mesh.mesh_dim_names and "tensor_parallel" in device_mesh.mesh_dim_names:
        return device_mesh["data_parallel"]
    return device_mesh


def tensor_parallel_mesh(device_mesh: DeviceMesh | None) -> DeviceMesh | None:
    """The tensor-parallel part of ModelParallelStrategy's mesh (None: no tensor parallelism)."""
    if device_mesh is None or "tensor_parallel" not in (device_mesh.mesh_dim_names or ()):
        return None
    mesh = device_mesh["tensor_parallel"]
    return mesh if mesh.size() > 1 else None


def set_gradient_sync(wrapped: nn.Module, enabled: bool) -> None:
    """Under DDP, all-reduce gradients only on the micro-batch that completes a step.

    DDP reads this flag in its forward (what ``no_sync()`` sets); earlier micro-batches
    accumulate locally. Other strategies need nothing: FSDP reduce-scatters every
    micro-batch, one device has nothing to sync.
    """
    if isinstance(wrapped, DistributedDataParallel):
        wrapped.require_backward_grad_sync = enabled


def clip_grad_norm(model: nn.Module, max_norm: float, across: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Clip gradients to ``max_norm`` (inf: measure only) and return the global norm.

    The norm is over all parameters on all ranks: FSDP2 parameters are DTensors whose
    norm torch reduces across shards; FSDP1 keeps flat local shards, so its own method
    must do the reduction. Under tensor parallelism the parameters live on two meshes (the
    norms' gains on the data-parallel one, the split matrices on both dimensions), which
    torch's clipping cannot stack: each one's squares are summed over the ranks it is split
    over (``sharded_sums.py``). Under pipeline parallelism each rank holds other parameters:
    the squares are summed over the pipeline's ranks (``across``) too.
    """
    from torch.distributed.fsdp import FullyShardedDataParallel

    if isinstance(model, FullyShardedDataParallel):
        return model.clip_grad_norm_(max_norm)
    grads = [param.grad for param in model.parameters() if param.grad is not None]
    if across is not None or len({grad.device_mesh for grad in grads if isinstance(grad, DTensor)}) > 1:
        return _clip_over_meshes(grads, max_norm, across)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    return norm.full_tensor() if hasattr(norm, "full_tensor") else norm


def _clip_over_meshes(grads: list[torch.Tensor], max_norm: float, across: dist.ProcessGroup | None) -> torch.Tensor:
    from lightning_modules.sharded_sums import local, shard_groups, sum_over_shards

    partials: dict = {}
    for grad in grads:  # the same parameters, in the same order, on every rank
        groups = shard_groups(grad, ())
        squares = local(grad).detach().float().square().sum()
        partials[groups] = partials[groups] + squares if groups in partials else squares
    total = sum_over_shards(partials)
    if across is not None:
        dist.all_reduce(total, group=across)
    norm = total.sqrt()
    scale = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    for grad in grads:
        local(grad).mul_(scale.to(grad.dtype))
    return norm

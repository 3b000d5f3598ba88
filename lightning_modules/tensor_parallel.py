"""Tensor parallelism for the Llama (Megatron-LM's split, as torchtitan plans it), with
sequence parallelism for the norms and the residual stream.

Each transformer block is split across the tensor-parallel group: attention by heads (q, k
and v column-wise, so each rank holds n_heads / T query heads and n_kv_heads / T key-value
heads and applies the rotary embedding to them; o row-wise) and the SwiGLU MLP by its hidden
units (gate and up column-wise, down row-wise). A block then needs two collectives forward
and two backward: the row-wise outputs are summed over the group.

With sequence parallelism (``layout.sequence_parallel``, Korthikanti et al. 2022) the
activations between those matmuls, the norms' inputs and outputs and the residual stream,
are split along the sequence instead of held whole on every rank: the row-wise sums become
reduce-scatters and the inputs of the column-wise layers all-gathers (the same bytes), and
the activations outside attention and the MLP shrink by T.

The embedding is split by vocabulary rows (each rank looks up its rows; the sum over the
group is the embedding) and the output head by vocabulary columns. The logits stay split by
vocabulary: the cross-entropy is PyTorch's loss-parallel one, which takes the softmax's
maximum and normaliser and the target's logit with three all-reduces of b x T numbers, so
each rank holds 1/T of the fp32 logits instead of all of them, and never gathers them. Its
backward must run inside the same context as its forward (``loss_context``). Logits asked
for without labels (generation, evaluation) are gathered whole.

Applied to the model built on the meta device, before activation checkpointing, compile and
FSDP2 (which then shards every parameter over the data-parallel dimension of the same mesh);
the weights are then initialised shard by shard as any sharded model's (``meta_init.py``),
equal to a whole model's from the same seed.
"""

from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    loss_parallel,
    parallelize_module,
)

if TYPE_CHECKING:
    from lightning_modules.llama import Llama


def apply_tensor_parallel(model: nn.Module, mesh: DeviceMesh, sequence_parallel: bool) -> None:
    """Split ``model`` (a ``Llama``) over the one-dimensional tensor-parallel ``mesh``, in place."""
    between = Shard(1) if sequence_parallel else Replicate()  # the residual stream between blocks
    outer = {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=between),
        "output": ColwiseParallel(input_layouts=between, output_layouts=Shard(-1), use_local_output=False),
        **({"norm": SequenceParallel()} if sequence_parallel else {}),
    }
    # a pipeline stage holds the embedding only first, the head and final norm only last
    parallelize_module(model, mesh, {name: style for name, style in outer.items() if getattr(model, name) is not None})
    for block in model.layers.values():
        plan = {
            "attention.q_proj": ColwiseParallel(),
            "attention.k_proj": ColwiseParallel(),
            "attention.v_proj": ColwiseParallel(),
            "attention.o_proj": RowwiseParallel(output_layouts=between),
            "mlp.gate_proj": ColwiseParallel(),
            "mlp.up_proj": ColwiseParallel(),
            "mlp.down_proj": RowwiseParallel(output_layouts=between),
        }
        if sequence_parallel:
            plan |= {
                "attention_norm": SequenceParallel(),
                "mlp_norm": SequenceParallel(),
                # the norms hand over sequence shards; attention and the MLP need whole sequences
                "attention": PrepareModuleInput(
                    input_layouts=(Shard(1), None, None), desired_input_layouts=(Replicate(), None, None)
                ),
                "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            }
        parallelize_module(block, mesh, plan)
    model.loss_kernel = None  # the loss goes through the split output layer
    model.vocabulary_parallel = True
    model.sequence_shards = mesh.size() if sequence_parallel else 1


def loss_context(model: "Llama") -> AbstractContextManager:
    """Where the loss of a model whose head is split by vocabulary is taken, and its backward
    run: PyTorch's ``loss_parallel``; a null context for any other model."""
    return loss_parallel() if model.vocabulary_parallel else nullcontext()

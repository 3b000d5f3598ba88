"""Totals over tensors that may be sharded across ranks: sum local pieces, all-reduce scalars.

Statistics of the whole model (gradient norms, optimizer moments) must come out the same
under one device, DDP and FSDP, and never as a multiple of the truth. Which ranks hold
disjoint pieces of a tensor is read from the tensor itself:

- FSDP2 (``fully_shard``): DTensors; their pieces are split over the mesh dimensions they
  are sharded on (not the replicated ones of a hybrid mesh).
- Lightning's ``FSDPStrategy`` (FSDP1, GPUs only): plain tensors holding this rank's piece
  of flat parameters, split over FSDP's sharding group (none under NO_SHARD).
- DDP and one process: every rank holds the whole tensor; nothing is reduced.
"""

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.strategies import FSDPStrategy
from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.placement_types import Placement

Groups = tuple[dist.ProcessGroup, ...]


def fsdp1_shard_groups(trainer: L.Trainer) -> Groups:
    """The group over which FSDP1 splits its flat parameters; empty for other strategies."""
    if not isinstance(trainer.strategy, FSDPStrategy):
        return ()
    fsdp = next(m for m in trainer.strategy.model.modules() if isinstance(m, FullyShardedDataParallel))
    return () if fsdp.sharding_strategy == ShardingStrategy.NO_SHARD else (fsdp.process_group,)


def shard_groups(tensor: torch.Tensor, plain_tensor_groups: Groups) -> Groups:
    """Groups whose ranks hold disjoint pieces of this tensor: its totals are sums over them."""
    if isinstance(tensor, DTensor):
        mesh = tensor.device_mesh
        return tuple(mesh.get_group(dim) for dim, placement in enumerate(tensor.placements) if split(placement))
    return plain_tensor_groups


def split(placement: Placement) -> bool:
    """Whether ranks along a mesh dimension hold disjoint pieces: ``Shard``, and the strided
    shard FSDP2 places over a dimension tensor parallelism already split (its ``is_shard()``
    is False in torch 2.13, so squares summed by ``is_shard`` alone miss the data-parallel
    ranks of such a matrix)."""
    return not (placement.is_replicate() or placement.is_partial())


def local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's piece of a tensor."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def sum_over_shards(partials: dict[Groups, torch.Tensor]) -> torch.Tensor:
    """Add up per-rank partial sums, each all-reduced over the groups its tensors are split on.

    Every rank must pass the same keys in the same order (build them from the parameters,
    not from whichever gradients happen to exist on this rank).
    """
    total = None
    for groups, values in partials.items():
        for group in groups:
            dist.all_reduce(values, op=dist.ReduceOp.SUM, group=group)
        total = values if total is None else total + values
    return total

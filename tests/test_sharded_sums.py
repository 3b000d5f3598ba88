"""Totals over sharded tensors (``lightning_modules/sharded_sums.py``) equal the whole
tensor's, on the layouts FSDP2 and tensor parallelism make together."""

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from benchmarks.meta_init_memory import free_port, join_process_group
from lightning_modules.sharded_sums import local, shard_groups, sum_over_shards


def squares_on_a_two_by_two_mesh(rank: int, port: int, out_dir: str) -> None:
    """A column-wise and a row-wise matrix split over T = 2 and sharded by FSDP2 over D = 2
    (the column-wise one on the dimension T split, which FSDP2 places as a strided shard):
    each matrix's squares summed over its shard groups, and the whole matrix's."""
    join_process_group(rank, 4, port)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("data_parallel", "tensor_parallel"))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16, bias=False), nn.Linear(16, 8, bias=False))
    parallelize_module(model, mesh["tensor_parallel"], {"0": ColwiseParallel(), "1": RowwiseParallel()})
    fully_shard(model, mesh=mesh["data_parallel"])
    results = []
    for parameter in model.parameters():
        summed = sum_over_shards({shard_groups(parameter, ()): local(parameter).detach().double().square().sum()})
        results.append(
            (str(parameter.placements), summed.item(), parameter.full_tensor().double().square().sum().item())
        )
    torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    dist.destroy_process_group()


def test_squares_summed_over_shard_groups_are_the_whole_matrix_s_on_data_x_tensor_parallel_ranks(tmp_path):
    mp.spawn(squares_on_a_two_by_two_mesh, args=(free_port(), str(tmp_path)), nprocs=4)
    for rank in range(4):
        results = torch.load(tmp_path / f"rank{rank}.pt")
        assert any("_StridedShard" in placements for placements, _, _ in results)  # the case that was missed
        for placements, summed, whole in results:
            assert summed == pytest.approx(whole, rel=1e-12), (rank, placements)

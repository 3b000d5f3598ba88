"""Peak resident memory per rank of building a sharded Llama, with and without meta-device init.

Each path runs in fresh CPU processes (gloo): "meta" builds on the meta device, shards
every block and the root with FSDP2 and then materialises shard by shard
(``materialize_and_init``, what the training module does); "plain" builds the whole fp32
model on every rank and then shards it. A rank's figure is its peak resident set (VmHWM)
minus its resident set just before building, so memory touched earlier (torch's import,
the process group, first use of the code paths) is not counted. Used by
``scripts/measure_meta_init.py`` and the tests.
"""

import os
import socket
from multiprocessing.queues import SimpleQueue
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard

from lightning_modules.llama import Llama
from lightning_modules.llama_settings import LlamaSettings
from lightning_modules.meta_init import materialize_and_init

MODEL_CONF = Path(__file__).resolve().parents[1] / "conf" / "model"
GB = 1e9
WARM_UP = LlamaSettings(vocab_size=64, n_layers=1, d_model=32, n_heads=4, n_kv_heads=2, mlp_hidden=64)


def status_bytes(field: str) -> int:
    """A memory field of /proc/self/status (Linux), e.g. VmRSS (now) or VmHWM (peak), in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def shard(model: Llama, mesh: DeviceMesh) -> None:
    """FSDP2 on every block, then the root, as the training layout does."""
    for block in model.layers.values():
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)


def build_sharded(config: LlamaSettings, mesh: DeviceMesh, seed: int, meta: bool) -> Llama:
    """A sharded, initialised model on the CPU, built through the meta device or whole."""
    if not meta:
        torch.manual_seed(seed)
        model = Llama(config)
        shard(model, mesh)
        return model
    with torch.device("meta"):
        model = Llama(config)
    shard(model, mesh)
    materialize_and_init(model, torch.device("cpu"), seed)
    return model


def join_process_group(rank: int, world_size: int, port: int) -> DeviceMesh:
    """A gloo group on localhost and its 1-D CPU mesh; one thread per rank (shared cores)."""
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    return init_device_mesh("cpu", (world_size,))


def measure_rank(
    rank: int, world_size: int, port: int, config: LlamaSettings, meta: bool, results: SimpleQueue
) -> None:
    """Build once and report this rank's peak resident-memory increase, in bytes.

    A tiny model is built the same way first, so that one-time costs of the code paths'
    first use (about 30 MB here) are not counted as the model's.
    """
    mesh = join_process_group(rank, world_size, port)
    build_sharded(WARM_UP, mesh, seed=0, meta=meta)
    before = status_bytes("VmRSS")
    build_sharded(config, mesh, seed=0, meta=meta)
    results.put((rank, status_bytes("VmHWM") - before))
    dist.destroy_process_group()


def free_port() -> int:
    """A localhost port free now, for the process group's rendezvous."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def peak_increase_per_rank(config: LlamaSettings, world_size: int, meta: bool) -> list[int]:
    """Each rank's peak resident-memory increase (bytes), from fresh processes."""
    results = mp.get_context("spawn").SimpleQueue()
    mp.spawn(measure_rank, args=(world_size, free_port(), config, meta, results), nprocs=world_size)
    return [peak for _, peak in sorted(results.get() for _ in range(world_size))]

"""The bytes autograd keeps for backward: the measured side of the memory plan's activations.

Every tensor saved for backward while a function runs is counted once by its storage (views
of one tensor share it), the parameters' storages left out; a tensor subclass (a DTensor, a
collective's async tensor) is counted by the local tensor it wraps, so a tensor-parallel
rank counts what it holds. On CPU this is the part of a step's memory that the plan's
activation term predicts, free of the allocator's caching that a peak reading includes.
"""

from collections.abc import Callable, Iterable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor

from benchmarks.meta_init_memory import free_port, join_process_group
from lightning_modules.llama import Llama, rotary_cos_sin
from lightning_modules.llama_settings import LlamaSettings
from lightning_modules.parallelism import apply_fsdp2
from lightning_modules.tensor_parallel import apply_tensor_parallel


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The plain tensor a (possibly nested) tensor subclass holds on this rank."""
    while type(tensor) is not torch.Tensor and hasattr(tensor, "__tensor_flatten__"):
        inner_names, _ = tensor.__tensor_flatten__()
        tensor = getattr(tensor, inner_names[0])
    return tensor


def storage_key(tensor: torch.Tensor) -> int:
    return local_tensor(tensor).untyped_storage().data_ptr()


def saved_activation_bytes(run: Callable[[], object], parameters: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages autograd saves while ``run()`` runs, ``parameters`` excluded."""
    excluded = {storage_key(p.to_local() if isinstance(p, DTensor) else p) for p in parameters}
    saved: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = local_tensor(tensor).untyped_storage()
        if storage.data_ptr() not in excluded:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        run()
    return sum(saved.values())


class LiveSaved:
    """The bytes of the distinct storages autograd holds for backward right now, and their
    peak while it was installed: a saved tensor counts until its graph is freed (after its
    backward), so a pipeline schedule's micro-batches in flight add up, and those it has
    finished drop out. Parameters' storages are left out."""

    def __init__(self, parameters: Iterable[torch.Tensor]) -> None:
        self.excluded = {storage_key(p.to_local() if isinstance(p, DTensor) else p) for p in parameters}
        self.live: dict[int, list[int]] = {}  # storage -> [holders, bytes]
        self.now = self.peak = 0

    def _pack(self, tensor: torch.Tensor) -> object:
        storage = local_tensor(tensor).untyped_storage()
        key = storage.data_ptr()
        if key in self.excluded:
            return tensor
        entry = self.live.setdefault(key, [0, storage.nbytes()])
        if entry[0] == 0:
            self.now += entry[1]
            self.peak = max(self.peak, self.now)
        entry[0] += 1
        return _Held(tensor, self, key)

    def _release(self, key: int) -> None:
        entry = self.live[key]
        entry[0] -= 1
        if entry[0] == 0:
            self.now -= entry[1]
            del self.live[key]

    def hooks(self) -> torch.autograd.graph.saved_tensors_hooks:
        return torch.autograd.graph.saved_tensors_hooks(self._pack, lambda held: getattr(held, "tensor", held))


class _Held:
    """A saved tensor as autograd keeps it: released from the count when autograd drops it."""

    def __init__(self, tensor: torch.Tensor, owner: LiveSaved, key: int) -> None:
        self.tensor, self.owner, self.key = tensor, owner, key

    def __del__(self) -> None:
        self.owner._release(self.key)


def block_bytes_per_token(
    config: LlamaSettings,
    precision: str,
    data_parallel: DeviceMesh | None = None,
    tensor_parallel: DeviceMesh | None = None,
    sequence_parallel: bool = False,
) -> float:
    """What one block of a ``config`` Llama saves per token of a micro-batch, under
    ``precision`` (a Lightning precision string), sharded by FSDP2 over ``data_parallel`` (with
    its bf16 mixed-precision policy under bf16-mixed) and split over ``tensor_parallel`` when
    given (as ``parallelism.apply_layout`` lays it out).

    Measured at 2 and 4 rows of 32 tokens, the difference per token: what does not grow with
    the batch (autocast's and FSDP2's bf16 copies of the weights) drops out."""
    torch.manual_seed(0)
    model = Llama(config)
    if precision == "bf16-true":
        model = model.to(torch.bfloat16)
    if tensor_parallel is not None:
        apply_tensor_parallel(model, tensor_parallel, sequence_parallel)
    if data_parallel is not None:
        apply_fsdp2(model, data_parallel, reshard_after_forward=True, mixed_precision=precision == "bf16-mixed")
    block, length = model.layers["0"], 32
    shards = tensor_parallel.size() if tensor_parallel is not None and sequence_parallel else 1
    dtype = torch.bfloat16 if precision == "bf16-true" else torch.float32

    def saved(rows: int) -> int:
        hidden = torch.randn(rows, length // shards, config.d_model, dtype=dtype, requires_grad=True)
        cos, sin = rotary_cos_sin(torch.arange(length).expand(rows, length), config.head_dim, config.rope_theta)

        def forward() -> None:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16-mixed"):
                block(hidden, cos.unsqueeze(1), sin.unsqueeze(1))

        return saved_activation_bytes(forward, model.parameters())

    return (saved(4) - saved(2)) / (2 * length)


def _measure_rank(
    rank: int,
    world_size: int,
    port: int,
    layout: tuple[int, int],
    config: LlamaSettings,
    precision: str,
    sp: bool,
    results,
) -> None:
    join_process_group(rank, world_size, port)
    mesh = init_device_mesh("cpu", layout, mesh_dim_names=("data_parallel", "tensor_parallel"))
    tensor_parallel = mesh["tensor_parallel"] if layout[1] > 1 else None
    results.put((rank, block_bytes_per_token(config, precision, mesh["data_parallel"], tensor_parallel, sp)))
    dist.destroy_process_group()


def block_bytes_per_token_on_ranks(
    config: LlamaSettings, precision: str, data_parallel: int, tensor_parallel: int, sequence_parallel: bool
) -> list[float]:
    """Each rank's ``block_bytes_per_token`` on data_parallel x tensor_parallel gloo processes."""
    processes = data_parallel * tensor_parallel
    results = mp.get_context("spawn").SimpleQueue()
    layout = (data_parallel, tensor_parallel)
    args = (processes, free_port(), layout, config, precision, sequence_parallel, results)
    mp.spawn(_measure_rank, args=args, nprocs=processes)
    return [value for _, value in sorted(results.get() for _ in range(processes))]

"""Gradient samples for the batch-size tests, gathered without extra gradient traffic.

Two ways to split an optimizer step's gradient into samples (``samples=``):

- ``micro_batch`` (one device, FSDP2, FSDP1): one sample per micro-step of the gradient
  accumulation, i.e. micro-batch j of every data-parallel rank together; n = accumulation,
  b_s = micro_batch_size x data-parallel ranks. Each micro-step's sample is the (sharded)
  gradient that micro-step's backward wrote, taken out of ``.grad`` before the next one
  adds to it, undoing the 1 / accumulation scale. Costs one read of the gradient per
  micro-step and no memory beyond accumulation's own.
- ``rank`` (DDP): one sample per data-parallel rank, its local accumulated gradient, read
  in a DDP communication hook just before the all-reduce DDP does anyway; n = ranks,
  b_s = micro_batch_size x accumulation. Costs nothing for the norm test.

The inner-product tests also need <g_j, g>, known only once the step's gradient g is
complete. ``micro_batch`` then keeps every micro-step's gradient until the step ends
(accumulation copies of the gradient shard); ``rank`` multiplies each DDP bucket by its all-reduced
result as it arrives (no copy beyond the buckets in flight).

Squares and products are summed in float64; only scalars are all-reduced.
"""

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

from callbacks.batch_size.noise_tests import PendingSums
from lightning_modules.sharded_sums import Groups, local, shard_groups, sum_over_shards


def squared_norms(tensors: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """Sum of squared norms in float64, on the device (no host sync: called during backward).

    The tests subtract n ||g||^2 from sum_j ||g_j||^2, two nearly equal numbers when the
    noise is small, so rounding in either is amplified. On CUDA, one multi-tensor kernel
    (``torch._foreach_norm``) takes every tensor's norm with float32 partial sums over
    blocks (docs/gpu_benchmark.md measures its error against float64); a kernel or more
    per tensor cost the norm test 5% of a TinyLlama step in launches alone. On CPU, where
    a float32 norm of a whole tensor sums sequentially (8e-3 relative for 5e7 elements),
    rows of ``NORM_ROW`` elements are reduced in float32 and the rows' squares summed in
    float64: 1e-9 relative. A float64 norm (``dtype=torch.float64``) would first copy the
    tensor to float64, which tripled the cost of a tested step on an H100.
    """
    if not tensors:
        return torch.zeros((), dtype=torch.float64, device=device)
    if device.type == "cuda":
        return torch.stack(torch._foreach_norm(tensors)).double().square().sum()
    return torch.stack([_squared_norm(t) for t in tensors]).sum()


NORM_ROW = 1024


def _squared_norm(tensor: torch.Tensor) -> torch.Tensor:
    flat = tensor.reshape(-1)
    rows = flat.numel() // NORM_ROW
    head = torch.linalg.vector_norm(flat[: rows * NORM_ROW].view(rows, NORM_ROW), dim=1).double().square().sum()
    tail = flat[rows * NORM_ROW :]
    return head + torch.linalg.vector_norm(tail, dtype=torch.float64).square() if tail.numel() else head


def _dots(left: list[torch.Tensor], right: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """Sum of inner products, each product in float32 and the sum in float64 (see ``squared_norms``)."""
    if not left:
        return torch.zeros((), dtype=torch.float64, device=device)
    return torch.stack([torch.sum(a.float() * b.float(), dtype=torch.float64) for a, b in zip(left, right)]).sum()


class MicroStepSamples:
    """Samples from each micro-step's own gradient, taken out of ``.grad`` as it is made.

    After each micro-step's backward the callback takes the new gradient out of ``.grad``
    and adds it to the step's running sum itself, so the next backward writes into an empty
    ``.grad`` instead of adding to it; after the last micro-step the sum goes back into
    ``.grad``. The sum is formed by the same float32 additions in the same order as
    autograd's (or FSDP's) accumulation, so training is unchanged, and a micro-step's sample
    costs one extra read of the gradient (its norm): an earlier version kept the previous
    gradient and formed the increment, six passes over the gradient per micro-step, 10.8% of
    a TinyLlama step on an H100.
    """

    def __init__(
        self,
        parameters: list[torch.nn.Parameter],
        plain_tensor_groups: Groups,
        keep: bool,
        device: torch.device,
        across: dist.ProcessGroup | None = None,
    ) -> None:
        # Parameters grouped by the ranks that hold pieces of them: the same keys on every rank.
        self.by_groups: dict[Groups, list[torch.nn.Parameter]] = {}
        for parameter in parameters:
            self.by_groups.setdefault(shard_groups(parameter, plain_tensor_groups), []).append(parameter)
        self.keep, self.device = keep, device
        self.across = across  # the ranks holding the model's other pipeline stages
        self.start()

    def start(self) -> None:
        self._sum_sq = {key: torch.zeros((), dtype=torch.float64, device=self.device) for key in self.by_groups}
        self._kept: dict[Groups, list[list[torch.Tensor]]] = {key: [] for key in self.by_groups}
        # The step's gradient so far, per parameter (None until its first micro-step).
        self._sums: dict[Groups, list[torch.Tensor | None]] = {
            key: [None] * len(ps) for key, ps in self.by_groups.items()
        }

    def add_micro_step(self, accumulation: int, last: bool) -> None:
        """Record the sample of the micro-step whose backward just finished: accumulation x
        its gradient (the factor goes on the float64 sums, not the tensors); after the
        ``last`` micro-step, put the step's gradient back into ``.grad``."""
        for key, parameters in self.by_groups.items():
            sums = self._sums[key]
            present = [index for index, p in enumerate(parameters) if p.grad is not None]
            grads = [local(parameters[index].grad) for index in present]
            self._sum_sq[key] += squared_norms([g.float() for g in grads], self.device) * accumulation**2
            if self.keep:
                self._kept[key].append([g.float() for g in grads])
            running = [index for index in present if sums[index] is not None]
            if running:
                torch._foreach_add_([local(sums[i]) for i in running], [local(parameters[i].grad) for i in running])
            for index in present:
                if sums[index] is None:  # the first micro-step: its gradient starts the sum
                    grad = parameters[index].grad
                    sums[index] = grad.clone() if self.keep else grad  # a kept sample must stay as it is
                parameters[index].grad = None
            if last:
                for parameter, total in zip(parameters, sums):
                    parameter.grad = total

    def finish(self, n: int, sample_size: int) -> PendingSums:
        """Complete the sums once the step's gradient g is back in ``.grad``; ``n`` is the
        accumulation, the samples' scale. Nothing is read on the host here."""
        partials = {}
        for key, parameters in self.by_groups.items():
            grads = [local(p.grad).float() for p in parameters if p.grad is not None]
            dots = [_dots(sample, grads, self.device) * n for sample in self._kept[key]]
            partials[key] = torch.stack([self._sum_sq[key], squared_norms(grads, self.device), *dots])
        totals = sum_over_shards(partials)
        if self.across is not None:
            dist.all_reduce(totals, group=self.across)
        self.start()
        if self.keep:
            dots = totals[2:]
            totals = torch.stack([totals[0], totals[1], dots.sum(), dots.square().sum()])
        return PendingSums(n=n, sample_size=sample_size, totals=totals)


class RankSamples:
    """Samples from each DDP rank's local gradient, read in a communication hook."""

    def __init__(self, ddp: DistributedDataParallel, keep: bool, device: torch.device) -> None:
        self.keep, self.active, self.device = keep, False, device
        self.start()
        ddp.register_comm_hook(None, self._hook)

    def start(self) -> None:
        self._sq = torch.zeros((), dtype=torch.float64, device=self.device)
        self._dot = torch.zeros((), dtype=torch.float64, device=self.device)

    def _hook(self, state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        """Runs on each gradient bucket of the step's last backward, before DDP averages it."""
        if not self.active:
            return allreduce_hook(None, bucket)
        mine = bucket.buffer().float()
        self._sq += squared_norms([mine], self.device)
        if self.keep:
            mine = mine.clone()  # the all-reduce works in place on the buffer
        future = allreduce_hook(None, bucket)
        if not self.keep:
            return future

        def add_dot(done: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
            average = done.value()
            self._dot += _dots([mine], [average], self.device)
            return average

        return future.then(add_dot)

    def finish(self, parameters: list[torch.nn.Parameter], sample_size: int) -> PendingSums:
        """After the step's backward: the gradients now hold the average over ranks. Nothing
        is read on the host here."""
        g_sq = squared_norms([p.grad for p in parameters if p.grad is not None], self.device)
        totals = torch.stack([self._sq, self._dot, self._dot.square()])
        dist.all_reduce(totals, op=dist.ReduceOp.SUM)
        self.start()
        values = [totals[0], g_sq, totals[1], totals[2]] if self.keep else [totals[0], g_sq]
        return PendingSums(n=dist.get_world_size(), sample_size=sample_size, totals=torch.stack(values))

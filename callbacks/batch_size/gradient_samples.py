"""Gradient samples for the batch-size tests, gathered without extra gradient traffic.

Two ways to split an optimizer step's gradient into samples (``samples=``):

- ``micro_batch`` (one device, FSDP2, FSDP1): one sample per micro-step of the gradient
  accumulation, i.e. micro-batch j of every data-parallel rank together; n = accumulation,
  b_s = micro_batch_size x data-parallel ranks. Each micro-step's sample is the increment
  of the (sharded) gradient across that micro-step, undoing the 1 / accumulation scale.
  Costs one copy of this rank's gradient (shard), kept for the run.
- ``rank`` (DDP): one sample per data-parallel rank, its local accumulated gradient, read
  in a DDP communication hook just before the all-reduce DDP does anyway; n = ranks,
  b_s = micro_batch_size x accumulation. Costs nothing for the norm test.

The inner-product tests also need <g_j, g>, known only once the step's gradient g is
complete. ``micro_batch`` then keeps every increment until the step ends (accumulation
copies of the gradient shard); ``rank`` multiplies each DDP bucket by its all-reduced
result as it arrives (no copy beyond the buckets in flight).

Squares and products are summed in float64; only scalars are all-reduced.
"""

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

from callbacks.batch_size.noise_tests import SampleSums
from lightning_modules.sharded_sums import Groups, local, shard_groups, sum_over_shards


def _squared_norms(tensors: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """Sum of squared norms in float64, on the device (no host sync: called during backward).

    The tests subtract n ||g||^2 from sum_j ||g_j||^2, two nearly equal numbers when the
    noise is small, so rounding in either is amplified many times. A float32 norm of a
    whole tensor is too coarse (on CPU, 8e-3 relative for 5e7 elements), and a float64
    norm (``dtype=torch.float64``) first copies the tensor to float64, which tripled the
    cost of a tested step on an H100. Rows of ``NORM_ROW`` elements are reduced in float32
    (one kernel, no copy) and the rows' squares summed in float64: 1e-9 relative.
    """
    if not tensors:
        return torch.zeros((), dtype=torch.float64, device=device)
    return torch.stack([_squared_norm(t) for t in tensors]).sum()


NORM_ROW = 1024


def _squared_norm(tensor: torch.Tensor) -> torch.Tensor:
    flat = tensor.reshape(-1)
    rows = flat.numel() // NORM_ROW
    head = torch.linalg.vector_norm(flat[: rows * NORM_ROW].view(rows, NORM_ROW), dim=1).double().square().sum()
    tail = flat[rows * NORM_ROW :]
    return head + torch.linalg.vector_norm(tail, dtype=torch.float64).square() if tail.numel() else head


def _dots(left: list[torch.Tensor], right: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """Sum of inner products, each product in float32 and the sum in float64 (see ``_squared_norms``)."""
    if not left:
        return torch.zeros((), dtype=torch.float64, device=device)
    return torch.stack([torch.sum(a.float() * b.float(), dtype=torch.float64) for a, b in zip(left, right)]).sum()


class MicroStepSamples:
    """Samples from the increments of the (sharded) gradient across micro-steps."""

    def __init__(
        self, parameters: list[torch.nn.Parameter], plain_tensor_groups: Groups, keep: bool, device: torch.device
    ) -> None:
        # Parameters grouped by the ranks that hold pieces of them: the same keys on every rank.
        self.by_groups: dict[Groups, list[torch.nn.Parameter]] = {}
        for parameter in parameters:
            self.by_groups.setdefault(shard_groups(parameter, plain_tensor_groups), []).append(parameter)
        self.keep, self.device = keep, device
        # The gradient as the last micro-step left it, per group; kept between steps, so a
        # tested step allocates nothing once the first has run (the norm test).
        self._previous: dict[Groups, list[torch.Tensor]] = {}
        self.start()

    def start(self) -> None:
        self._begun: set[Groups] = set()
        self._sum_sq = {key: torch.zeros((), dtype=torch.float64, device=self.device) for key in self.by_groups}
        self._kept: dict[Groups, list[list[torch.Tensor]]] = {key: [] for key in self.by_groups}

    def _grads(self, key: Groups) -> list[torch.Tensor]:
        return [local(p.grad).float() for p in self.by_groups[key] if p.grad is not None]

    def add_micro_step(self, accumulation: int) -> None:
        """Record the sample of the micro-step whose backward just finished: accumulation x
        the gradient's increment (the factor goes on the float64 sums, not the tensors).

        Without kept samples (the norm test) the increment is formed in the buffer of the
        previous gradient, which then takes the new one: two passes over the gradient
        beside the norm's.
        """
        for key in self.by_groups:
            grads, previous = self._grads(key), self._previous.get(key)
            if key not in self._begun:  # the step's first micro-step: the increment is the gradient
                increments = [g.clone() for g in grads] if self.keep else grads
            elif self.keep:
                increments = torch._foreach_sub(grads, previous)
            else:
                torch._foreach_sub_(previous, grads)  # minus the increment: the same norm
                increments = previous
            self._sum_sq[key] += _squared_norms(increments, self.device) * accumulation**2
            if self.keep:
                self._kept[key].append(increments)
            if previous is None:
                self._previous[key] = [g.detach().clone() for g in grads]
            else:
                torch._foreach_copy_(previous, grads)
            self._begun.add(key)

    def finish(self, n: int, sample_size: int) -> SampleSums:
        """Complete the sums once the step's last backward is done (g = the final gradient);
        ``n`` is the accumulation, the samples' scale."""
        partials = {}
        for key in self.by_groups:
            grads = self._grads(key)
            dots = [_dots(sample, grads, self.device) * n for sample in self._kept[key]]
            partials[key] = torch.stack([self._sum_sq[key], _squared_norms(grads, self.device), *dots])
        totals = sum_over_shards(partials).cpu()
        self.start()
        sums = SampleSums(n=n, sample_size=sample_size, sum_sq=totals[0].item(), g_sq=totals[1].item())
        if self.keep:
            dots = totals[2:]
            sums.dot_sum, sums.dot_sq_sum = dots.sum().item(), dots.square().sum().item()
        return sums


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
        self._sq += _squared_norms([mine], self.device)
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

    def finish(self, parameters: list[torch.nn.Parameter], sample_size: int) -> SampleSums:
        """After the step's backward: the gradients now hold the average over ranks."""
        g_sq = _squared_norms([p.grad for p in parameters if p.grad is not None], self.device).item()
        totals = torch.stack([self._sq, self._dot, self._dot.square()])
        dist.all_reduce(totals, op=dist.ReduceOp.SUM)
        sq, dot_sum, dot_sq_sum = totals.cpu().tolist()
        self.start()
        sums = SampleSums(n=dist.get_world_size(), sample_size=sample_size, sum_sq=sq, g_sq=g_sq)
        if self.keep:
            sums.dot_sum, sums.dot_sq_sum = dot_sum, dot_sq_sum
        return sums

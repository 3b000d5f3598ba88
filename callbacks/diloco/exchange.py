"""The pseudo-gradient exchange: averaging over replicas, compressed, possibly in flight.

Compression: ``bf16`` sends bf16 values (an all-reduce that sums in bf16); ``int8``
quantizes each tensor with one fp32 scale (max |delta| / 127), all-gathers the int8 values
and scales, and accumulates the dequantized replicas in fp32. Simulated replicas apply the
same rounding, so their numbers match real ones.

Real replicas start the collectives asynchronously (``start_average``) and ``wait`` for
them later, so streaming DiLoCo overlaps the exchange with inner steps.
"""

import torch
import torch.distributed as dist

BYTES_PER_ELEMENT = {"none": 4, "bf16": 2, "int8": 1}


def to_int8(delta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 values and the fp32 scale that maps them back (max |delta| becomes 127)."""
    scale = delta.abs().amax().clamp_min(torch.finfo(torch.float32).tiny) / 127
    return (delta / scale).round().clamp(-127, 127).to(torch.int8), scale


def quantize(delta: torch.Tensor, compression: str) -> torch.Tensor:
    """What a receiver reconstructs from this replica's delta (fp32)."""
    if compression == "bf16":
        return delta.bfloat16().float()
    if compression == "int8":
        values, scale = to_int8(delta)
        return values.float() * scale
    return delta


def average_in_process(deltas: list[torch.Tensor], compression: str) -> torch.Tensor:
    """Average of simulated replicas' deltas, rounded as the real exchange would round them."""
    if compression == "bf16":
        total = deltas[0].bfloat16()
        for delta in deltas[1:]:
            total = (total.float() + delta.bfloat16().float()).bfloat16()
        return total.float() / len(deltas)
    return torch.stack([quantize(delta, compression) for delta in deltas]).sum(0) / len(deltas)


class Exchange:
    """An average of replicas' deltas that may still be on the wire; ``wait`` completes it once.

    What a torchft group healed into the round must do as the groups that sent it did:
    ``final``, take the run's final plain average (no outer step); ``ends``, end the run there."""

    def __init__(self, finish, works: list[dist.Work], final: bool = False, ends: bool = False) -> None:
        self._finish, self._works, self.final, self.ends = finish, works, final, ends
        self._result: list[torch.Tensor] | None = None

    @classmethod
    def done(cls, values: list[torch.Tensor] | None, final: bool = False, ends: bool = False) -> "Exchange":
        """An exchange already complete (None: a round the replica groups discarded)."""
        return cls(lambda: values, [], final, ends)

    def wait(self) -> list[torch.Tensor] | None:
        if self._result is None:
            for work in self._works:
                work.wait()
            self._result = self._finish()
        return self._result


def start_average(deltas: list[torch.Tensor], group: dist.ProcessGroup, compression: str) -> Exchange:
    """Start averaging this rank's deltas over the replica group (the ranks holding the same shards)."""
    replicas = dist.get_world_size(group)
    if compression == "int8":
        packed = [to_int8(delta) for delta in deltas]
        gathered = [
            ([torch.empty_like(v) for _ in range(replicas)], [torch.empty_like(s) for _ in range(replicas)])
            for v, s in packed
        ]
        works = []
        for (values, scale), (all_values, all_scales) in zip(packed, gathered):
            works.append(dist.all_gather(all_values, values, group=group, async_op=True))
            works.append(dist.all_gather(all_scales, scale, group=group, async_op=True))

        def finish() -> list[torch.Tensor]:
            return [sum(v.float() * s for v, s in zip(vs, ss)) / replicas for vs, ss in gathered]

        return Exchange(finish, works)
    sent = [delta.bfloat16() if compression == "bf16" else delta.clone() for delta in deltas]
    works = [dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group, async_op=True) for tensor in sent]
    return Exchange(lambda: [tensor.float() / replicas for tensor in sent], works)


def bytes_sent_per_sync(parameters: int, replicas: int, compression: str) -> float:
    """Bytes all replicas send together for one exchange of ``parameters`` values (ring algorithms).

    All-reduce: each of M members sends 2 (M - 1) / M of the payload; int8's all-gather:
    each sends its payload to M - 1 others.
    """
    payload = parameters * BYTES_PER_ELEMENT[compression]
    if compression == "int8":
        return float(replicas * (replicas - 1) * payload)
    return float(2 * (replicas - 1) * payload)

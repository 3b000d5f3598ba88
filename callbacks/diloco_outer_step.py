"""The DiLoCo outer step: average pseudo-gradients over replicas, Nesterov SGD on the anchor.

Per tensor (this rank's shard, fp32), in the order of Douillard et al. (2023):

1. delta = anchor - local parameters
2. delta <- average of delta over the replicas (ranks holding the same shard in each replica)
3. parameters <- anchor
4. Nesterov SGD on the anchor with gradient delta (PyTorch's SGD: buf = momentum * buf +
   delta, the first buf = delta; update = delta + momentum * buf; no weight decay, no clipping)
5. anchor <- updated parameters

Compression of the pseudo-gradient exchange: ``bf16`` sends bf16 values (an all-reduce that
sums in bf16); ``int8`` quantizes each tensor with one fp32 scale (max |delta| / 127), all-gathers
the int8 values and scales, and accumulates the dequantized replicas in fp32. Simulated
replicas apply the same rounding, so their numbers match real ones.
"""

import torch
import torch.distributed as dist

COMPRESSIONS = ("none", "bf16", "int8")
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


def average_across_replicas(delta: torch.Tensor, group: dist.ProcessGroup, compression: str) -> torch.Tensor:
    """Average of this shard's delta over the replica group (real replicas)."""
    replicas = dist.get_world_size(group)
    if compression == "int8":
        values, scale = to_int8(delta)
        all_values = [torch.empty_like(values) for _ in range(replicas)]
        all_scales = [torch.empty_like(scale) for _ in range(replicas)]
        dist.all_gather(all_values, values, group=group)
        dist.all_gather(all_scales, scale, group=group)
        return sum(v.float() * s for v, s in zip(all_values, all_scales)) / replicas
    sent = delta.bfloat16() if compression == "bf16" else delta.clone()
    dist.all_reduce(sent, op=dist.ReduceOp.SUM, group=group)
    return sent.float() / replicas


def bytes_sent_per_sync(parameters: int, replicas: int, compression: str) -> float:
    """Bytes all replicas send together for one exchange of ``parameters`` values (ring algorithms).

    All-reduce: each of M members sends 2 (M - 1) / M of the payload; int8's all-gather:
    each sends its payload to M - 1 others.
    """
    payload = parameters * BYTES_PER_ELEMENT[compression]
    if compression == "int8":
        return float(replicas * (replicas - 1) * payload)
    return float(2 * (replicas - 1) * payload)


class OuterOptimizer:
    """Nesterov SGD on the anchor (fp32 copies of this rank's parameter shards)."""

    def __init__(self, anchor: list[torch.Tensor], lr: float, momentum: float, nesterov: bool = True) -> None:
        self.anchor, self.lr, self.momentum, self.nesterov = anchor, lr, momentum, nesterov
        self.buffers: list[torch.Tensor] | None = None

    def step(self, deltas: list[torch.Tensor]) -> None:
        """Move the anchor by the averaged pseudo-gradients (on the anchor's device)."""
        deltas = [delta.to(anchor.device) for delta, anchor in zip(deltas, self.anchor)]
        updates = deltas
        if self.momentum:
            if self.buffers is None:
                self.buffers = [delta.clone() for delta in deltas]
            else:
                for buf, delta in zip(self.buffers, deltas):
                    buf.mul_(self.momentum).add_(delta)
            nesterov = [delta + self.momentum * buf for delta, buf in zip(deltas, self.buffers)]
            updates = nesterov if self.nesterov else self.buffers
        for anchor, update in zip(self.anchor, updates):
            anchor.sub_(update, alpha=self.lr)

    def average(self, deltas: list[torch.Tensor]) -> None:
        """Move the anchor to the replicas' mean (anchor - averaged delta), leaving the momentum alone."""
        for anchor, delta in zip(self.anchor, deltas):
            anchor.sub_(delta.to(anchor.device))

    def state_dict(self) -> dict:
        return {"anchor": [a.clone() for a in self.anchor], "buffers": self.buffers}

    def load_state_dict(self, state: dict) -> None:
        for anchor, saved in zip(self.anchor, state["anchor"]):
            anchor.copy_(saved)
        self.buffers = None if state["buffers"] is None else [b.to(self.anchor[0].device) for b in state["buffers"]]

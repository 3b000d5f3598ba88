"""The DiLoCo outer step: the anchor and the outer optimizer that moves it.

Per tensor (this rank's shard, fp32), in the order of Douillard et al. (2023):

1. delta = anchor - local parameters
2. delta <- average of delta over the replicas (``exchange.py``)
3. parameters <- anchor
4. an outer optimizer step on the anchor with gradient delta (any ``torch.optim``
   optimizer; by default PyTorch's Nesterov SGD: buf = momentum * buf + delta, the first
   buf = delta, update = delta + momentum * buf; no weight decay, no clipping)
5. anchor <- updated parameters

Steps 1, 2 and 5 are done by the caller; here a step touches only the tensors it is given
(a streaming fragment), leaving the other anchors and their optimizer state alone: torch
optimizers skip tensors whose gradient is None.
"""

from collections.abc import Callable

import torch


class OuterStep:
    """fp32 anchors (copies of this rank's parameter shards) and their outer optimizer."""

    def __init__(
        self, anchors: list[torch.Tensor], make_optimizer: Callable[[list[torch.Tensor]], torch.optim.Optimizer]
    ):
        self.anchors = anchors
        self.optimizer = make_optimizer(anchors)

    def step(self, indices: list[int], deltas: list[torch.Tensor]) -> None:
        """Move the given anchors by their averaged pseudo-gradients."""
        for index, delta in zip(indices, deltas):
            self.anchors[index].grad = delta.to(self.anchors[index].device)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def average(self, indices: list[int], deltas: list[torch.Tensor]) -> None:
        """Move the given anchors to the replicas' mean (anchor - averaged delta), without an outer step."""
        for index, delta in zip(indices, deltas):
            self.anchors[index].sub_(delta.to(self.anchors[index].device))

    def state_dict(self) -> dict:
        return {"anchors": [anchor.clone() for anchor in self.anchors], "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        for anchor, saved in zip(self.anchors, state["anchors"]):
            anchor.copy_(saved)
        self.optimizer.load_state_dict(state["optimizer"])

"""Training-instability signals: Adam's second moment and the loss-spike ratio.

Li, Zhang and He ("The Stability-Efficiency Dilemma", NeurIPS 2022) tie loss spikes in
early pretraining to extreme gradient variance, which shows up in Adam's second moment
``exp_avg_sq`` before it shows up in the loss. At optimizer-step boundaries this callback
adds to ``pl_module.step_metrics`` (the module logs them with the step's other metrics):

- ``stability/adam_v_l1``, ``stability/adam_v_l2``, ``stability/adam_v_max``: l1 norm,
  l2 norm and largest element of ``exp_avg_sq`` over all parameters, in fp32;
- ``stability/loss_spike_ratio``: the step's loss over the lowest step loss so far (>= 1).

Sharding is read from the state tensors themselves (``lightning_modules/sharded_sums.py``),
so the numbers are those of the whole model under every strategy: each rank sums its local
pieces, then a SUM all-reduce of the packed (l1, squared l2) and a MAX all-reduce of the
max complete them. Only scalars travel. The zero padding of FSDP1's flat shards has zero
gradient, hence zero second moment, and adds nothing.
"""

import math
from typing import Any

import lightning as L
import torch
import torch.distributed as dist

from lightning_modules.sharded_sums import Groups, fsdp1_shard_groups, local, shard_groups


class OptimizerStatistics(L.Callback):
    """Logs the instability signals every ``every_n_steps`` optimizer steps.

    The running loss minimum is updated at every step, logged or not, and is saved in
    checkpoints, so a resumed run reports the same ratios as one that never stopped.
    """

    def __init__(self, every_n_steps: int = 1) -> None:
        if every_n_steps < 1:
            raise ValueError(f"callbacks.optimizer_stats.every_n_steps={every_n_steps} must be >= 1.")
        self.every_n_steps = every_n_steps
        self._min_loss = math.inf

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        loss = pl_module.step_metrics.get("train/loss")
        if not pl_module.at_step_boundary or loss is None:
            return
        ratio = self._loss_spike_ratio(loss)
        if pl_module.clock.steps % self.every_n_steps != 0:
            return
        pl_module.step_metrics["stability/loss_spike_ratio"] = ratio
        moments = second_moment_statistics(trainer.optimizers[0], fsdp1_shard_groups(trainer), pl_module.device)
        pl_module.step_metrics.update(moments)

    def _loss_spike_ratio(self, loss: float) -> float:
        """This step's loss over the lowest so far, this one included (NaN losses leave the minimum alone)."""
        if math.isfinite(loss):
            self._min_loss = min(self._min_loss, loss)
        return loss / self._min_loss

    def state_dict(self) -> dict[str, Any]:
        return {"min_loss": self._min_loss}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._min_loss = state_dict["min_loss"]


def second_moment_statistics(
    optimizer: torch.optim.Optimizer, plain_tensor_groups: Groups, device: torch.device
) -> dict[str, float]:
    """l1, l2 and max of Adam's ``exp_avg_sq`` over all parameters and shards (empty if none yet).

    ``plain_tensor_groups``: where non-DTensor states are shards (FSDP1), else ``()``.
    ``device``: where the collectives run (the states may be offloaded to the CPU).
    """
    by_groups: dict[Groups, list[torch.Tensor]] = {}
    for state in optimizer.state.values():
        if "exp_avg_sq" in state:
            moment = state["exp_avg_sq"]
            by_groups.setdefault(shard_groups(moment, plain_tensor_groups), []).append(local(moment))
    if not by_groups:
        return {}
    sums, peak = torch.zeros(2, device=device), torch.zeros((), device=device)
    for groups, tensors in by_groups.items():  # same order on every rank: the optimizer's
        local_sums, local_peak = _local_statistics(tensors, device)
        for group in groups:
            dist.all_reduce(local_sums, op=dist.ReduceOp.SUM, group=group)
            dist.all_reduce(local_peak, op=dist.ReduceOp.MAX, group=group)
        sums, peak = sums + local_sums, torch.maximum(peak, local_peak)
    l1, squared_l2 = sums.tolist()
    return {
        "stability/adam_v_l1": l1,
        "stability/adam_v_l2": math.sqrt(squared_l2),
        "stability/adam_v_max": peak.item(),
    }


def _local_statistics(tensors: list[torch.Tensor], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(l1, squared l2) and max over these local tensors, in fp32.

    Second moments are >= 0, so 0 is a safe start for the max, and a rank whose shards
    are all empty contributes zeros.
    """
    tensors = [tensor for tensor in tensors if tensor.numel() > 0]
    if not tensors:
        return torch.zeros(2, device=device), torch.zeros((), device=device)
    l1 = torch.stack([torch.linalg.vector_norm(t, 1, dtype=torch.float32) for t in tensors]).sum()
    l2 = torch.stack([torch.linalg.vector_norm(t, 2, dtype=torch.float32) for t in tensors])
    peak = torch.stack([t.amax().float() for t in tensors]).max()
    return torch.stack([l1, l2.square().sum()]).to(device), peak.to(device)

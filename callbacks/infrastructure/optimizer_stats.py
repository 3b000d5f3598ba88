"""Training-instability signals: Adam's second moment and the loss-spike ratio.

Li, Zhang and He ("The Stability-Efficiency Dilemma", NeurIPS 2022) tie loss spikes in
early pretraining to extreme gradient variance, which shows up in Adam's second moment
``exp_avg_sq`` before it shows up in the loss. At logging steps this callback records
(values stay on the device until the step's row is logged):

- ``stability/adam_v_l1``, ``stability/adam_v_l2``, ``stability/adam_v_max``: l1 norm,
  l2 norm and largest element of ``exp_avg_sq`` over all parameters (sums in float64);
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
from lightning_modules.step_callback import StepCallback
from lightning_modules.training_state import TrainingState


class OptimizerStatistics(StepCallback):
    """Logs the instability signals at every logging step.

    The running loss minimum is updated at every step, on the device (no host sync), and
    is saved in checkpoints, so a resumed run reports the same ratios as one that never
    stopped.
    """

    def __init__(self) -> None:
        self._min_loss = torch.tensor(math.inf)
        self._shard_groups: Groups = ()

    def on_step_end(self, state: TrainingState) -> None:
        loss = state.step_loss.detach().float()
        best = self._min_loss.to(loss.device)
        # NaN or infinite losses leave the minimum alone.
        self._min_loss = torch.where(torch.isfinite(loss), torch.minimum(best, loss), best)
        if not state.is_logging_step:
            return
        state.record_metric("stability/loss_spike_ratio", loss.double() / self._min_loss.double())
        state.record_metrics(second_moment_statistics(state.optimizer, self._shard_groups, state.device))

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._shard_groups = fsdp1_shard_groups(trainer)

    def state_dict(self) -> dict[str, Any]:
        return {"min_loss": float(self._min_loss)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._min_loss = torch.tensor(state_dict["min_loss"])


def second_moment_statistics(
    optimizer: torch.optim.Optimizer, plain_tensor_groups: Groups, device: torch.device
) -> dict[str, torch.Tensor]:
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
    sums, peak = torch.zeros(2, dtype=torch.float64, device=device), torch.zeros((), device=device)
    for groups, tensors in by_groups.items():  # same order on every rank: the optimizer's
        local_sums, local_peak = _local_statistics(tensors, device)
        for group in groups:
            dist.all_reduce(local_sums, op=dist.ReduceOp.SUM, group=group)
            dist.all_reduce(local_peak, op=dist.ReduceOp.MAX, group=group)
        sums, peak = sums + local_sums, torch.maximum(peak, local_peak)
    return {
        "stability/adam_v_l1": sums[0],
        "stability/adam_v_l2": sums[1].sqrt(),
        "stability/adam_v_max": peak,
    }


def _local_statistics(tensors: list[torch.Tensor], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(l1, squared l2) in float64 and max over these local tensors.

    Second moments are >= 0, so 0 is a safe start for the max, and a rank whose shards
    are all empty contributes zeros.
    """
    tensors = [tensor for tensor in tensors if tensor.numel() > 0]
    if not tensors:
        return torch.zeros(2, dtype=torch.float64, device=device), torch.zeros((), device=device)
    l1 = torch.stack([torch.linalg.vector_norm(t, 1, dtype=torch.float64) for t in tensors]).sum()
    l2 = torch.stack([torch.linalg.vector_norm(t, 2, dtype=torch.float64) for t in tensors])
    peak = torch.stack([t.amax().float() for t in tensors]).max()
    return torch.stack([l1, l2.square().sum()]).to(device), peak.to(device)

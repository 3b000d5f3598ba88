"""Which parameters an optimizer steps and decays, and its group settings across a resume."""

from typing import Any

import torch
from torch import nn

from lightning_modules.llama import RMSNorm


def decay_groups(parameters: list[nn.Parameter], model: nn.Module, weight_decay: float) -> list[dict]:
    """``parameters`` split into decayed (weight matrices) and non-decayed (norm gains) groups."""
    gains = {id(p) for module in model.modules() if isinstance(module, RMSNorm) for p in module.parameters()}
    return [
        {"params": [p for p in parameters if id(p) not in gains], "weight_decay": weight_decay},
        {"params": [p for p in parameters if id(p) in gains], "weight_decay": 0.0},
    ]


def trainable(model: nn.Module) -> list[nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def group_settings(optimizer: torch.optim.Optimizer) -> list[dict[str, Any]]:
    """Every parameter group's settings (all but its parameters), as the config built them."""
    return [{key: value for key, value in group.items() if key != "params"} for group in optimizer.param_groups]


def restore_group_settings(optimizer: torch.optim.Optimizer, settings: list[dict[str, Any]]) -> None:
    """Put the configured group settings into an optimizer whose state a checkpoint restored.

    Why not keep the checkpoint's: a resumed run follows its config (a changed weight decay
    or Muon's iteration dtype on another device takes effect), and distributed checkpointing
    saves one copy of each group's settings and restores it only on ranks whose parameter
    names match the saved group's, so pipeline ranks (different blocks) get bare groups.
    """
    for group, configured in zip(optimizer.param_groups, settings, strict=True):
        group.update(configured)

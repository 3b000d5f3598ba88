"""AdamW with decoupled weight decay on the weight matrices only.

Weight decay applies to every weight matrix (the attention and MLP projections, the
input embedding and the output head); RMSNorm gains are not decayed, because shrinking
a per-channel scale towards zero only fights the normalisation. Parameters are told
apart by the module that owns them, not by their shape: FSDP1 (``use_orig_params``)
turns every parameter into a 1-D piece of its flat shard. Tied embeddings appear once.
"""

from dataclasses import dataclass, field

import torch
from torch import nn

from lightning_modules.llama import RMSNorm


@dataclass
class OptimizerConfig:
    """User settings (Hydra group ``optimizer``): peak LR, AdamW and clipping."""

    lr: float = 3e-3
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    eps: float = 1e-8
    weight_decay: float = 0.1
    grad_clip: float | None = 1.0

    def __post_init__(self) -> None:
        if self.lr <= 0:
            raise ValueError(f"optimizer.lr={self.lr} must be > 0.")
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ValueError(f"optimizer.betas={list(self.betas)} must be two numbers in [0, 1).")
        if self.grad_clip is not None and self.grad_clip <= 0:
            raise ValueError(f"optimizer.grad_clip={self.grad_clip} must be > 0, or null to disable clipping.")


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Split trainable parameters into decayed (weight matrices) and non-decayed (norm gains)."""
    gains = {id(p) for module in model.modules() if isinstance(module, RMSNorm) for p in module.parameters()}
    params = [p for p in model.parameters() if p.requires_grad]
    return [
        {"params": [p for p in params if id(p) not in gains], "weight_decay": weight_decay},
        {"params": [p for p in params if id(p) in gains], "weight_decay": 0.0},
    ]


def build_optimizer(model: nn.Module, config: OptimizerConfig) -> torch.optim.AdamW:
    return torch.optim.AdamW(
        parameter_groups(model, config.weight_decay), lr=config.lr, betas=tuple(config.betas), eps=config.eps
    )

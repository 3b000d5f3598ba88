"""AdamW with decoupled weight decay on the weight matrices only.

Weight decay applies to every weight matrix (the attention and MLP projections, the
input embedding and the output head); RMSNorm gains are not decayed, because shrinking
a per-channel scale towards zero only fights the normalisation. Parameters are told
apart by the module that owns them, not by their shape: FSDP1 (``use_orig_params``)
turns every parameter into a 1-D piece of its flat shard. Tied embeddings appear once.
"""

from dataclasses import dataclass

import torch
from torch import nn

from launch.errors import ConfigError
from lightning_modules.llama import RMSNorm


@dataclass(kw_only=True)
class OptimizerConfig:
    """User settings (``optimizer`` in ``conf/train.yaml``, where their defaults live):
    peak LR, AdamW and clipping."""

    lr: float
    betas: list[float]
    eps: float
    weight_decay: float
    grad_clip: float | None

    def __post_init__(self) -> None:
        if self.lr <= 0:
            raise ConfigError(f"optimizer.lr={self.lr} must be > 0.")
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ConfigError(f"optimizer.betas={list(self.betas)} must be two numbers in [0, 1).")
        if self.grad_clip is not None and self.grad_clip <= 0:
            raise ConfigError(f"optimizer.grad_clip={self.grad_clip} must be > 0, or null to disable clipping.")


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Split trainable parameters into decayed (weight matrices) and non-decayed (norm gains)."""
    gains = {id(p) for module in model.modules() if isinstance(module, RMSNorm) for p in module.parameters()}
    params = [p for p in model.parameters() if p.requires_grad]
    return [
        {"params": [p for p in params if id(p) not in gains], "weight_decay": weight_decay},
        {"params": [p for p in params if id(p) in gains], "weight_decay": 0.0},
    ]


def build_optimizer(model: nn.Module, config: OptimizerConfig, fused: bool = False) -> torch.optim.AdamW:
    """AdamW over ``parameter_groups``; ``fused`` takes its fused CUDA kernel (one launch for
    all parameters), only where every parameter is on a CUDA device."""
    fused = fused and all(p.device.type == "cuda" for p in model.parameters())
    return torch.optim.AdamW(
        parameter_groups(model, config.weight_decay), lr=config.lr, betas=tuple(config.betas), eps=config.eps,
        fused=fused or None,
    )


def apply_settings(optimizer: torch.optim.Optimizer, config: OptimizerConfig) -> None:
    """Set AdamW's hyper-parameters from the config, e.g. after a checkpoint restored older ones.

    The groups are those of ``parameter_groups``: the first is decayed, the second is not.
    The learning rate is set at every step by the training module.
    """
    for group, decay in zip(optimizer.param_groups, (config.weight_decay, 0.0)):
        group.update(betas=tuple(config.betas), eps=config.eps, weight_decay=decay)

"""AdamW with decoupled weight decay on the weight matrices (``optimizer=adamw``, the default)."""

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from lightning_modules.optimizers.settings import OptimizerSettings, check_betas, decay_groups, trainable


@dataclass(kw_only=True)
class AdamWSettings(OptimizerSettings):
    """``conf/optimizer/adamw.yaml``: peak LR, AdamW's betas and eps, weight decay, clipping."""

    kind: ClassVar[str] = "adamw"

    betas: list[float]
    eps: float

    def __post_init__(self) -> None:
        super().__post_init__()
        check_betas(self.betas)

    def build(self, model: nn.Module, fused: bool) -> torch.optim.AdamW:
        """AdamW over the decayed and non-decayed groups; ``fused`` takes its fused CUDA kernel
        (one launch for all parameters), only where every parameter is on a CUDA device."""
        fused = fused and all(p.device.type == "cuda" for p in model.parameters())
        groups = decay_groups(trainable(model), model, self.weight_decay)
        return torch.optim.AdamW(groups, lr=self.lr, betas=tuple(self.betas), eps=self.eps, fused=fused or None)

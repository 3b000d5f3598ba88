"""AdamW with decoupled weight decay on the weight matrices (``optimizer=adamw``, the default)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from lightning_modules.optimizers.settings import OptimizerSettings, check_betas

if TYPE_CHECKING:
    import torch
    from torch import nn


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
        import torch  # as the optimizer is built: reading the settings stays free of torch

        from lightning_modules.optimizers.parameter_groups import decay_groups, trainable

        fused = fused and all(p.device.type == "cuda" for p in model.parameters())
        groups = decay_groups(trainable(model), model, self.weight_decay)
        return torch.optim.AdamW(groups, lr=self.lr, betas=tuple(self.betas), eps=self.eps, fused=fused or None)

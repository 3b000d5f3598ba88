"""What every optimizer's settings provide, and which parameters are decayed.

An optimizer is chosen with the ``optimizer`` config group (``optimizer=adamw``, the
default, or ``optimizer=muon``); its file names the settings class in ``_target_`` and lists
every setting with its default. The settings check themselves when the config is read,
before any heavy import and build the ``torch.optim.Optimizer`` over the laid-out model. An
optimizer restored from a checkpoint gets the built one's group settings back
(``group_settings``, ``restore_group_settings``), so the config, not the checkpoint, decides
every setting of a resumed run. The training module sets
the learning rate of every parameter group at every step; ``kind`` is saved in checkpoints,
and a run resumed with another kind is refused.

Weight decay applies to every weight matrix (the attention and MLP projections, the input
embedding and the output head); RMSNorm gains are not decayed, because shrinking a
per-channel scale towards zero only fights the normalisation. Parameters are told apart by
the module that owns them, not by their shape: FSDP1 (``use_orig_params``) turns every
parameter into a 1-D piece of its flat shard. Tied embeddings appear once.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from common.errors import ConfigError
from settings.section import Section

if TYPE_CHECKING:
    import torch
    from torch import nn


@dataclass(kw_only=True)
class OptimizerSettings(Section, ABC):
    """Settings every optimizer has: the peak learning rate, weight decay and clipping."""

    key = "optimizer"
    #: Saved in checkpoints; resuming with another kind is refused.
    kind: ClassVar[str]

    lr: float
    weight_decay: float
    grad_clip: float | None

    def __post_init__(self) -> None:
        if self.lr <= 0:
            raise ConfigError(f"optimizer.lr={self.lr} must be > 0.")
        if self.weight_decay < 0:
            raise ConfigError(f"optimizer.weight_decay={self.weight_decay} must be >= 0.")
        if self.grad_clip is not None and self.grad_clip <= 0:
            raise ConfigError(f"optimizer.grad_clip={self.grad_clip} must be > 0, or null to disable clipping.")

    @abstractmethod
    def build(self, model: nn.Module, fused: bool) -> torch.optim.Optimizer:
        """The optimizer over the model's trainable parameters (``fused``: the layout asks for
        fused kernels where they exist)."""


def check_betas(betas: list[float]) -> None:
    if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
        raise ConfigError(f"optimizer.betas={list(betas)} must be two numbers in [0, 1).")

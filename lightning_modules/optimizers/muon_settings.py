"""``optimizer=muon``'s settings: Muon on the hidden weight matrices, AdamW on the rest
(the optimizer and the split: ``muon.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from common.errors import ConfigError
from lightning_modules.optimizers.settings import OptimizerSettings, check_betas

if TYPE_CHECKING:
    from torch import nn

    from lightning_modules.optimizers.muon import MuonWithAdamW
    from settings.run_context import RunContext

ADJUST_LR = ("match_rms_adamw", "original")
NS_DTYPES = ("auto", "bfloat16", "float32")


@dataclass(kw_only=True)
class MuonSettings(OptimizerSettings):
    """``conf/optimizer/muon.yaml``: Muon's momentum, Nesterov, Newton-Schulz steps and dtype, LR rule;
    AdamW's betas and eps for the other parameters; the shared LR, weight decay and clipping."""

    kind: ClassVar[str] = "muon"

    momentum: float
    nesterov: bool
    ns_steps: int
    adjust_lr_fn: str
    ns_dtype: str
    betas: list[float]
    eps: float

    def __post_init__(self) -> None:
        super().__post_init__()
        check_betas(self.betas)
        if not 0.0 <= self.momentum < 1.0:
            raise ConfigError(f"optimizer.momentum={self.momentum} must lie in [0, 1).")
        if not 1 <= self.ns_steps < 100:
            raise ConfigError(f"optimizer.ns_steps={self.ns_steps} must lie in [1, 99].")
        if self.adjust_lr_fn not in ADJUST_LR:
            raise ConfigError(f"optimizer.adjust_lr_fn={self.adjust_lr_fn!r} is unknown; choose one of {ADJUST_LR}.")
        if self.ns_dtype not in NS_DTYPES:
            raise ConfigError(f"optimizer.ns_dtype={self.ns_dtype!r} is unknown; choose one of {NS_DTYPES}.")

    def check(self, run: RunContext) -> None:
        if run.strategy_name == "fsdp":
            raise ConfigError(
                "optimizer=muon (the default) needs whole matrices, but strategy=fsdp (FSDP1) flattens parameters"
                " into 1-D shards: use strategy=fsdp2 or strategy=ddp, or optimizer=adamw."
            )

    def iteration_dtype(self, matrices: list[nn.Parameter]) -> str:
        """``ns_dtype`` with ``auto`` resolved: bfloat16 on GPUs, float32 on CPUs."""
        if self.ns_dtype != "auto":
            return self.ns_dtype
        return "bfloat16" if matrices and all(p.device.type == "cuda" for p in matrices) else "float32"

    def build(self, model: nn.Module, fused: bool) -> MuonWithAdamW:
        from lightning_modules.optimizers.muon import muon_with_adamw  # torch, as the optimizer is built

        return muon_with_adamw(self, model, fused)

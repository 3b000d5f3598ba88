"""Learning rate as a function of the training clock.

Warmup runs over optimizer steps or over tokens; decay runs over tokens up to the token
budget. Decaying by tokens (not steps) keeps the schedule meaningful when the global
batch grows or early steps are shorter (sequence-length warmup): the LR at a given token
count does not depend on how those tokens were batched once warmup is over.

    lr = peak * w * (floor + (1 - floor) * s(p))

- w = min(1, step / warmup_steps) or min(1, tokens / warmup_tokens)   (1 without warmup)
- p = (tokens - t0) / (token_budget - t0), clipped to [0, 1], where t0 = warmup_tokens
  when warmup is counted in tokens and 0 when it is counted in steps (the token count
  at the end of a step-based warmup is not known in advance)
- s(p): constant 1; linear 1 - p; cosine (1 + cos(pi p)) / 2;
  wsd (warmup-stable-decay) 1 until p = 1 - decay_fraction, then linear to 0
- floor = min_lr_ratio (the LR ends at peak * min_lr_ratio)
"""

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from common.errors import ConfigError
from settings.section import Section

if TYPE_CHECKING:
    from settings.run_context import RunContext

SCHEDULES = ("constant", "linear", "cosine", "wsd")


@dataclass(kw_only=True)
class LRScheduleSettings(Section):
    """User settings (``lr_schedule`` in ``conf/train.yaml``, where their defaults live)."""

    key = "lr_schedule"

    name: str
    warmup_steps: int
    warmup_tokens: int
    min_lr_ratio: float
    decay_fraction: float

    def __post_init__(self) -> None:
        if self.name not in SCHEDULES:
            raise ConfigError(f"lr_schedule.name={self.name!r} is unknown; choose one of {SCHEDULES}.")
        if self.warmup_steps and self.warmup_tokens:
            raise ConfigError(
                "lr_schedule.warmup_steps and lr_schedule.warmup_tokens are both set; set one of them to 0."
            )
        if self.warmup_steps < 0 or self.warmup_tokens < 0:
            raise ConfigError("lr_schedule.warmup_steps / warmup_tokens must be >= 0.")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ConfigError(f"lr_schedule.min_lr_ratio={self.min_lr_ratio} must lie in [0, 1].")
        if not 0.0 < self.decay_fraction <= 1.0:
            raise ConfigError(f"lr_schedule.decay_fraction={self.decay_fraction} must lie in (0, 1].")

    def check(self, run: "RunContext") -> None:
        """A decaying schedule needs the token budget it decays to."""
        if run.token_budget is None and self.name != "constant":
            raise ConfigError(
                f"lr_schedule.name={self.name} decays until the token budget: set token_budget,"
                " or use lr_schedule.name=constant."
            )


def decay_shape(name: str, progress: float, decay_fraction: float) -> float:
    """s(p) in [0, 1]: the fraction of (peak - floor) left at decay progress p."""
    p = min(max(progress, 0.0), 1.0)
    if name == "constant":
        return 1.0
    if name == "linear":
        return 1.0 - p
    if name == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * p))
    stable_until = 1.0 - decay_fraction
    return 1.0 if p <= stable_until else (1.0 - p) / decay_fraction


def learning_rate(peak: float, config: LRScheduleSettings, step: int, tokens: int, token_budget: int | None) -> float:
    """LR for optimizer step number ``step`` (1-based) taken after ``tokens`` tokens were seen."""
    if config.warmup_steps:
        warm = min(1.0, step / config.warmup_steps)
    elif config.warmup_tokens:
        warm = min(1.0, tokens / config.warmup_tokens)
    else:
        warm = 1.0
    return peak * warm * decay_factor(config, tokens, token_budget)


def decay_factor(config: LRScheduleSettings, tokens: int, token_budget: int | None) -> float:
    """floor + (1 - floor) s(p): the schedule's decay at this token count, warmup aside."""
    if config.name == "constant":
        return 1.0
    if not token_budget:
        raise ConfigError(f"lr_schedule.name={config.name!r} decays to the token budget: set token_budget.")
    start = config.warmup_tokens
    shape = decay_shape(config.name, (tokens - start) / max(token_budget - start, 1), config.decay_fraction)
    return config.min_lr_ratio + (1.0 - config.min_lr_ratio) * shape

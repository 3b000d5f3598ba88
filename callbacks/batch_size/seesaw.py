"""Seesaw (Meterez et al. 2025, arXiv 2510.14717): grow the batch where the LR would decay.

Wherever a standard schedule would multiply the learning rate by 1 / alpha, Seesaw
multiplies it by 1 / sqrt(alpha) and the global batch by alpha (halving the LR becomes
LR / sqrt(2) with the batch doubled). The schedule it stands in for is the run's own
``lr_schedule`` (cosine by default): its decay is counted in cuts of alpha, and after k
cuts (the run's decay has fallen below 1 / alpha^k)

    B = B_0 alpha^k,    lr = peak x warmup x alpha^(-k/2)

so the learning rate falls in steps of sqrt(alpha) where the schedule would have fallen
by alpha (a constant schedule has no cuts, and Seesaw changes nothing). Once the batch
reaches ``batch.max_global_batch_size`` (or the technique's cap), further cuts are taken in
full by the learning rate, as the schedule would (Seesaw's equivalence holds below the
critical batch size, which a cap stands for). Both are functions of the token clock, so a
resumed run continues exactly. The paper derives the rule for SGD on noisy linear
regression and for normalised SGD (a proxy for Adam), and matched cosine decay at equal
FLOPs with about 36% fewer serial steps on 150M-600M models.
"""

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from callbacks.batch_size.schedules import BatchSchedule
from common.errors import ConfigError
from lightning_modules.clock import TrainingClock
from lightning_modules.lr_schedule import decay_factor
from settings.run_context import RunContext

if TYPE_CHECKING:
    from lightning_modules.training_state import TrainingState


@dataclass(kw_only=True)
class Seesaw(BatchSchedule):
    """Args:
    factor: alpha, the LR cut that becomes a batch increase (2: every halving).
    start: B_0 (null: ``batch.global_batch_size``).
    max_global_batch_size: the largest batch (null: ``batch.max_global_batch_size``).
    """

    key: ClassVar[str] = "technique.seesaw"

    factor: float
    start: int | None
    max_global_batch_size: int | None

    def __post_init__(self) -> None:
        if self.factor <= 1:
            raise ConfigError(
                f"{self.key}.factor={self.factor} must be > 1 (2: the batch doubles where the LR would halve)."
            )

    def check(self, run: RunContext) -> None:
        if run.token_budget is None and run.lr_schedule.name != "constant":
            raise ConfigError(f"{self.key} follows the decay to the token budget, but token_budget is null.")
        super().check(run)

    # ------------------------------------------------------------------ the rule
    def first_size(self, run: RunContext) -> int:
        return self.start or run.batch.global_batch_size

    def largest_size(self, run: RunContext) -> int:
        caps = [c for c in (self.max_global_batch_size, run.batch.max_global_batch_size) if c is not None]
        return min(caps) if caps else 2**62

    def cuts(self, tokens: int, run: RunContext) -> int:
        """k: how many times the run's scheduled decay has fallen by ``factor`` at this token count."""
        ratio = decay_factor(run.lr_schedule, tokens, run.token_budget)
        return int(math.floor(math.log(1.0 / ratio) / math.log(self.factor) + 1e-9)) if ratio > 0 else 10**6

    def batch_cuts(self, tokens: int, run: RunContext) -> int:
        """The cuts taken by the batch: all of them until the batch reaches its cap."""
        room = math.floor(math.log(self.largest_size(run) / self.first_size(run)) / math.log(self.factor) + 1e-9)
        return min(self.cuts(tokens, run), max(room, 0))

    def size_at(self, clock: TrainingClock, run: RunContext) -> int:
        return int(round(self.first_size(run) * self.factor ** self.batch_cuts(clock.tokens, run)))

    def lr_factor(self, tokens: int, run: RunContext) -> float:
        """The learning rate relative to the peak (warmup aside): alpha^(-1/2) per cut the
        batch took, alpha^(-1) per cut beyond its cap."""
        batch_cuts, cuts = self.batch_cuts(tokens, run), self.cuts(tokens, run)
        return self.factor ** (-0.5 * batch_cuts - (cuts - batch_cuts))

    def sizes(self, run: RunContext) -> dict[str, int]:
        """Every batch the schedule reaches (each must be a valid global batch)."""
        room = self.batch_cuts(run.token_budget, run) if run.token_budget else 0
        return {f"start x factor^{k}": int(round(self.first_size(run) * self.factor**k)) for k in range(room + 1)}

    def lr_rule(self, run: RunContext) -> "SeesawLR":
        return SeesawLR(self, run)


@dataclass(frozen=True)
class SeesawLR:
    """The factor that turns the run's scheduled rate into Seesaw's: its decay divided out,
    Seesaw's steps put in, at the token count the learning rate schedule reads."""

    seesaw: Seesaw
    run: RunContext

    def __call__(self, state: "TrainingState") -> float:
        tokens = state.schedule_tokens
        decay = decay_factor(self.run.lr_schedule, tokens, self.run.token_budget)
        return self.seesaw.lr_factor(tokens, self.run) / decay if decay > 0 else 0.0

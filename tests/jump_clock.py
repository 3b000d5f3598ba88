"""A test-only step callback: after step ``at`` it moves the clock to the end of step ``to``,
as a DiLoCo replica group healed by a peer that is ahead does.
    +callbacks.jump._target_=tests.jump_clock.JumpClock +callbacks.jump.at=3 +callbacks.jump.to=5
"""

from lightning_modules.step_callback import StepCallback
from lightning_modules.training_state import TrainingState


class JumpClock(StepCallback):
    def __init__(self, at: int, to: int) -> None:
        self.at, self.to = at, to

    def on_step_end(self, state: TrainingState) -> None:
        if state.clock.steps == self.at:
            per_step = state.clock.sequences // state.clock.steps
            state.move_clock(
                {"steps": self.to, "sequences": self.to * per_step, "tokens": state.clock.tokens // self.at * self.to}
            )

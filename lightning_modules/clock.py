"""The training clock: the one measure of progress that every schedule reads.

Step counts alone are ambiguous once the global batch or the sequence length changes
during a run, so the LR schedule, warmups, stopping and the logging x-axis read
sequences and tokens as well.
"""

from dataclasses import asdict, dataclass


@dataclass
class TrainingClock:
    """Progress counted over all data-parallel ranks, at optimizer-step boundaries.

    - ``steps``: optimizer steps completed.
    - ``sequences``: packed sequences drawn from the training stream (before any
      reshaping a technique applies); this is also the position in the data stream.
    - ``tokens``: tokens trained on, counted after any truncation.
    """

    steps: int = 0
    sequences: int = 0
    tokens: int = 0

    def advance(self, sequences: int, tokens: int) -> None:
        """Record one completed optimizer step that consumed the given global amounts."""
        self.steps += 1
        self.sequences += sequences
        self.tokens += tokens

    def state_dict(self) -> dict[str, int]:
        return asdict(self)

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.steps, self.sequences, self.tokens = state["steps"], state["sequences"], state["tokens"]

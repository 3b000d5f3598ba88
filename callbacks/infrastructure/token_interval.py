"""'Every N tokens': the interval the periodic callbacks share, on the training clock."""

from typing import Any


class TokenInterval:
    """Due once each time tokens seen cross a multiple of ``every``; checkpointed, so a resumed
    run is due at the same points as one that never stopped."""

    def __init__(self, every: int) -> None:
        if every < 1:
            raise ValueError(f"the interval of {every} tokens must be >= 1.")
        self.every = every
        self.last_mark = 0

    def due(self, tokens: int) -> bool:
        mark = tokens // self.every
        due, self.last_mark = mark > self.last_mark, max(mark, self.last_mark)
        return due

    def state_dict(self) -> dict[str, Any]:
        return {"last_mark": self.last_mark}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.last_mark = state["last_mark"]

"""Tokens trained on per source of a weighted mixture (`data=mixture`): ``data/tokens/<name>``.

The data module knows which source each position of the row order drew, so the rows per
source at any clock position are exact; each step's tokens are shared among its rows
(all rows of one step are cut to the same length, also under sequence-length warmup).
The running totals are kept in checkpoints, so a resumed run continues them. With a
single source this callback does nothing.
"""

from typing import Any

import lightning as L

from data.datamodule import TextDataModule
from lightning_modules.step_callback import StepCallback
from lightning_modules.training_state import TrainingState


class MixtureTokens(StepCallback):
    """Logs ``data/tokens/<source>`` at logging steps when the training data is a mixture."""

    def __init__(self) -> None:
        self._data: TextDataModule | None = None
        self._tokens: dict[str, int] = {}
        self._rows: list[int] = []
        self._clock = (0, 0)  # (sequences, tokens) at the last step seen

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        data = trainer.datamodule
        self._data = data if isinstance(data, TextDataModule) and data.source_names else None
        if self._data is not None:
            clock = pl_module.training_state.clock
            self._clock = (clock.sequences, clock.tokens)
            self._rows = self._data.rows_per_source(clock.sequences)
            self._tokens = {name: self._tokens.get(name, 0) for name in self._data.source_names}

    def on_step_end(self, state: TrainingState) -> None:
        if self._data is None:
            return
        sequences, tokens = state.clock.sequences, state.clock.tokens
        rows = self._data.rows_per_source(sequences)
        if sequences > self._clock[0]:
            per_row = (tokens - self._clock[1]) / (sequences - self._clock[0])
            for name, now, before in zip(self._data.source_names, rows, self._rows):
                self._tokens[name] += round((now - before) * per_row)
        self._rows, self._clock = rows, (sequences, tokens)
        if state.is_logging_step:
            state.record_metrics({f"data/tokens/{name}": count for name, count in self._tokens.items()})

    def state_dict(self) -> dict[str, Any]:
        return {"tokens": dict(self._tokens)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._tokens = dict(state_dict["tokens"])

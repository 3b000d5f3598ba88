"""A callback for tests and benchmarks that writes which sequences each optimizer step trained on, per rank.

Each line is ``STEP HASH HASH ...``: the step the micro-batch belongs to (steps completed + 1)
and a content hash of each of its input rows, so two runs can be compared for sequences
trained twice or skipped without trusting the sampler's own bookkeeping.
    +callbacks.row_log._target_=benchmarks.row_log.RowLog +callbacks.row_log.path=DIR
"""

import hashlib
from pathlib import Path
from typing import Any

import lightning as L


class RowLog(L.Callback):
    def __init__(self, path: str) -> None:
        self.folder = Path(path)

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        step = pl_module.training_state.clock.steps + 1
        rows = [hashlib.sha1(row.cpu().numpy().tobytes()).hexdigest()[:16] for row in batch["input_ids"]]
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.folder / f"rank{trainer.global_rank}.txt", "a") as file:
            file.write(f"{step} {' '.join(rows)}\n")


def rows_by_step(folder: Path) -> dict[int, list[str]]:
    """Every rank's rows, by step, sorted (which rank read a row does not matter)."""
    steps: dict[int, list[str]] = {}
    for path in folder.glob("rank*.txt"):
        for line in path.read_text().splitlines():
            step, *rows = line.split()
            steps.setdefault(int(step), []).extend(rows)
    return {step: sorted(rows) for step, rows in sorted(steps.items())}

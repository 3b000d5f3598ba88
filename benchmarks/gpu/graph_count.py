"""Dynamo's graph count through a run: whether a technique recompiles after its first shape."""

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import lightning as L
from torch._dynamo.utils import counters

from lightning_modules.step_callback import StepCallback
from lightning_modules.training_state import TrainingState

GRAPH_COUNTER = "torch._dynamo.utils.counters['stats']['unique_graphs']"


def compiled_graphs() -> int:
    """Graphs Dynamo has compiled in this process so far (``torch._dynamo.reset`` does not
    clear the count: compare two readings). A recompilation is a new graph too."""
    return counters["stats"]["unique_graphs"]


@dataclass
class GraphCounts:
    """Dynamo's graph count over one run: before it, once training starts (after any
    full-length preallocation pass), and at the end of each optimizer step."""

    before: int
    at_train_start: int
    steps: list[tuple[int, int]]  # (sequence length trained on, graphs so far)

    def after_first_length(self) -> int:
        """Graphs compiled once the first length was compiled: counted from the preallocation
        pass when it compiled one (it runs the full length before step 1), else from the
        end of step 1."""
        first = self.at_train_start if self.at_train_start > self.before else self.steps[0][1]
        return self.steps[-1][1] - first

    def lengths(self) -> list[int]:
        return list(dict.fromkeys(length for length, _ in self.steps))


class DynamoGraphCount(StepCallback):
    """Records Dynamo's graph count through a run and writes it to ``path`` (JSON) at the end.

    Added to a run's config (``+callbacks.graph_count._target_=...``), so the run still goes
    through ``framework_run`` unchanged. Infrastructure callbacks come after the techniques,
    so ``on_train_start`` here reads the count after sequence-length warmup's preallocation.
    """

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self.counts = GraphCounts(before=compiled_graphs(), at_train_start=0, steps=[])

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.counts.at_train_start = compiled_graphs()

    def on_step_end(self, state: TrainingState) -> None:
        self.counts.steps.append((state.seq_len, compiled_graphs()))

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.path.write_text(json.dumps(dataclasses.asdict(self.counts)))

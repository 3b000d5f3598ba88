"""Zero-shot evaluation while training: lm-eval tasks every N tokens and at the end.

The tasks run through the project's lm-eval adapter (``evaluation/lm_adapter.py``) on the
model as it trains (sharded or not: under DDP and FSDP2 every rank runs the same requests
and rank 0's numbers are the ones logged, all ranks holding the same). ``corpus_cloze`` is
built from the run's own held-out documents and needs no network; lm-eval's public tasks
(hellaswag, piqa, arc_easy, lambada_openai, ...) download their data. Results are logged as
``eval/<task>/<metric>`` against tokens seen (W&B and CSV), and ``scripts/report.py``
plots them. Switched on with ``evaluation=corpus_cloze`` (``conf/evaluation/``); when off,
this callback does not exist.
"""

import logging
import time
from typing import Any

import lightning as L
import torch

from callbacks.infrastructure.token_interval import TokenInterval
from evaluation.corpus_cloze import TASK_NAME, build_corpus_cloze_task
from evaluation.harness import TaskSpec, evaluate
from evaluation.lm_adapter import LlamaLM
from lightning_modules.step_callback import StepCallback
from lightning_modules.training_state import TrainingState

log = logging.getLogger(__name__)


class DownstreamEvaluation(StepCallback):
    """Args:
    tasks: lm-eval task names; ``corpus_cloze`` is built from the run's held-out text.
    every_n_tokens: evaluate each time tokens seen cross a multiple of this (null: only at the end).
    limit: documents per task (null: all); a limit gives quick, not publishable, numbers.
    batch_size: requests per forward pass.
    cloze_items, cloze_seed: ``corpus_cloze``'s number of items and their seed.
    """

    def __init__(
        self,
        tasks: list[str],
        every_n_tokens: int | None,
        limit: int | None,
        batch_size: int,
        cloze_items: int,
        cloze_seed: int,
    ) -> None:
        if not tasks:
            raise ValueError("evaluation.tasks is empty; name at least one task, e.g. [corpus_cloze].")
        self.task_names, self.limit, self.batch_size = list(tasks), limit, batch_size
        self.cloze_items, self.cloze_seed = cloze_items, cloze_seed
        self.interval = TokenInterval(every_n_tokens) if every_n_tokens else None
        self._tasks: list[TaskSpec] = []
        self._datamodule: Any = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Write the local tasks' files (rank 0 first, then the others read them)."""
        self._datamodule = trainer.datamodule
        settings = dict(self._datamodule.hparams)
        if trainer.is_global_zero:
            self._build_tasks(settings)
        trainer.strategy.barrier("downstream_evaluation")
        self._build_tasks(settings)

    def _build_tasks(self, data_settings: dict[str, Any]) -> None:
        self._tasks = [
            build_corpus_cloze_task(data_settings, k=self.cloze_items, seed=self.cloze_seed)
            if name == TASK_NAME
            else TaskSpec(name)
            for name in self.task_names
        ]

    def on_step_end(self, state: TrainingState) -> None:
        due = self.interval is not None and self.interval.due(state.clock.tokens)
        if due or state.stopping:
            self.run(state)

    def run(self, state: TrainingState) -> dict[str, float]:
        """Evaluate the model as it is now; record the metrics in this step's row."""
        start = time.perf_counter()
        model = state.model
        model.eval()
        lm = LlamaLM(
            model,
            self._datamodule.tokenizer,
            max_length=self._datamodule.seq_len,
            batch_size=self.batch_size,
            device=state.device,
        )
        with torch.no_grad():
            results = evaluate(lm, self._tasks, self.limit)
        model.train()
        metrics = {
            f"eval/{task}/{metric}": value for task, values in results.items() for metric, value in values.items()
        }
        state.record_metrics(metrics)
        state.log_now()
        log.info(
            "evaluation at %s tokens in %.1f s: %s",
            f"{state.clock.tokens:,}",
            time.perf_counter() - start,
            ", ".join(f"{key} {value:.4f}" for key, value in metrics.items()),
        )
        return metrics

    def state_dict(self) -> dict[str, Any]:
        return self.interval.state_dict() if self.interval else {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if self.interval:
            self.interval.load_state_dict(state_dict)

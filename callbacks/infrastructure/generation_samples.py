"""Samples while training: greedy continuations of fixed prompts every N tokens.

The way people watch a small model learn: the same prompts, continued by the model as it
is now, in the console and, with the W&B logger, as a table (one row per prompt and
sample point) under ``samples/generations``. Generation goes through the lm-eval adapter
(``evaluation/lm_adapter.py``), so it stops at the end-of-document token and never emits a
padded vocabulary row. Switched on with ``samples=default`` (``conf/samples/``).
"""

import logging
from typing import Any

import lightning as L
import torch
from lightning.pytorch.loggers import WandbLogger
from lm_eval.api.instance import Instance

from callbacks.infrastructure.token_interval import TokenInterval
from evaluation.lm_adapter import LlamaLM
from lightning_modules.step_callback import StepCallback
from lightning_modules.training_state import TrainingState

log = logging.getLogger(__name__)


class GenerationSamples(StepCallback):
    """Args:
    prompts: the texts to continue.
    every_n_tokens: sample each time tokens seen cross a multiple of this (and at the end).
    max_new_tokens: the longest continuation.
    """

    def __init__(self, prompts: list[str], every_n_tokens: int, max_new_tokens: int) -> None:
        if not prompts or max_new_tokens < 1:
            raise ValueError("samples: give at least one prompt and max_new_tokens >= 1.")
        self.prompts, self.max_new_tokens = list(prompts), max_new_tokens
        self.interval = TokenInterval(every_n_tokens)
        self._trainer: L.Trainer | None = None
        self.rows: list[list[Any]] = []

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._trainer = trainer

    def on_step_end(self, state: TrainingState) -> None:
        if self.interval.due(state.clock.tokens) or state.stopping:
            self.sample(state)

    def sample(self, state: TrainingState) -> list[str]:
        """Continue every prompt with the model as it is now; log and return the continuations."""
        datamodule = self._trainer.datamodule
        lm = LlamaLM(state.model, datamodule.tokenizer, max_length=datamodule.seq_len, device=state.device)
        requests = [
            Instance("generate_until", {}, (prompt, {"until": [], "max_gen_toks": self.max_new_tokens}), index)
            for index, prompt in enumerate(self.prompts)
        ]
        state.model.eval()
        with torch.no_grad():
            texts = lm.generate_until(requests)
        state.model.train()
        tokens = state.clock.tokens
        for prompt, text in zip(self.prompts, texts):
            log.info("sample at %s tokens: %r -> %r", f"{tokens:,}", prompt, text)
            self.rows.append([tokens, prompt, text])
        self._log_table()
        return texts

    def _log_table(self) -> None:
        for logger in self._trainer.loggers:
            if isinstance(logger, WandbLogger) and self._trainer.is_global_zero:
                logger.log_table("samples/generations", columns=["tokens", "prompt", "continuation"], data=self.rows)

    def state_dict(self) -> dict[str, Any]:
        return self.interval.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.interval.load_state_dict(state_dict)

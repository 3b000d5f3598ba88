"""A progress bar that counts training tokens towards the real end of the run.

Lightning's bar counts training batches, which are micro-batches here and vary in number
per optimizer step; tokens are what the budget, the LR schedule and the charts count, so
the training bar shows them (``1.02M/2.50M tokens``), updated once per optimizer step, with
the loss, speed and validation loss of the last logged step. Its total is the token
budget or, when ``trainer.max_steps`` comes first, the tokens those steps will reach at the
current batch. Validation bars count batches, as they say.

When the console is not a terminal (``nohup``, SLURM logs, a pipe), a carriage-return bar
would fill the file with redrawn lines, so the bar is replaced by one log line per
``line_interval_s`` seconds and one after each validation, e.g.
``step 120 | 491k/2.50M tokens (20%) | loss=2.103, tokens/s=7.1k | 1m10s elapsed, 4m50s left``.
"""

import logging
import sys
import time
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import TQDMProgressBar
from lightning.pytorch.callbacks.progress.tqdm_progress import Tqdm

SHOWN = {
    "train/loss": "loss",
    "val/loss": "val_loss",
    "perf/tokens_per_sec": "tokens/s",
    "diloco/pseudo_grad_norm": "pg_norm",
}
#: Whole numbers, shown as such: DiLoCo's outer round (once a sync has logged it).
COUNTS = {"diloco/round": "round"}
#: Shown from the first time they differ from their first value in the run: a technique
#: (a batch schedule, sequence-length warmup) changed them.
CHANGING = {"train/global_batch_size": "batch", "train/seq_len": "seq_len"}
log = logging.getLogger(__name__)


def readable(value: float) -> str:
    """1234567 -> '1.23M', 8900 -> '8.9k', 2.5603 -> '2.560'."""
    for threshold, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= threshold:
            return f"{value / threshold:.3g}{suffix}"
    return f"{value:.3f}" if abs(value) < 100 else f"{value:.0f}"


def duration(seconds: float) -> str:
    """3725 -> '1h02m05s', 70 -> '1m10s'."""
    hours, rest = divmod(int(seconds), 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


class TokenProgressBar(TQDMProgressBar):
    """Args:
    line_interval_s: seconds between progress lines when the console is not a terminal.
    lines: null: lines when stderr is not a terminal, a bar otherwise; true / false forces one.
    """

    TRAIN_FORMAT = "{l_bar}{bar}| {n_fmt}/{total_fmt} tokens [{elapsed}<{remaining}{postfix}]"

    def __init__(self, line_interval_s: float = 30.0, lines: bool | None = None) -> None:
        super().__init__()
        if line_interval_s <= 0:
            raise ValueError(f"callbacks.progress_bar.line_interval_s={line_interval_s} must be > 0.")
        self.line_interval_s = line_interval_s
        self.lines = not sys.stderr.isatty() if lines is None else lines
        if self.lines:
            self.disable()
        self._started = self._last_line = 0.0
        self._start_tokens = 0
        self._bar_set = False  # the training bar is set up once per fit, not per epoch
        self._first: dict[str, int] = {}  # CHANGING's first values in this run
        self._changed: set[str] = set()

    def init_train_tqdm(self) -> Tqdm:
        bar = super().init_train_tqdm()
        bar.unit_scale = True
        bar.bar_format = self.TRAIN_FORMAT
        return bar

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        """The last logged loss, speed and validation loss, readable (and what a technique
        changes: the global batch and sequence length once they moved, DiLoCo's round and
        pseudo-gradient norm); no ``v_num``."""
        metrics = trainer.progress_bar_metrics
        shown = {label: readable(float(metrics[key])) for key, label in SHOWN.items() if key in metrics}
        shown |= {label: f"{int(metrics[key])}" for key, label in COUNTS.items() if key in metrics}
        for key, label in CHANGING.items():
            if key in metrics:
                value = int(metrics[key])
                if value != self._first.setdefault(key, value):
                    self._changed.add(key)
                if key in self._changed:
                    shown[label] = f"{value:,}"
        return shown

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Time from here: a run resumed mid-epoch gets no epoch start from Lightning."""
        super().on_train_start(trainer, pl_module)
        self._started = self._last_line = time.monotonic()
        self._start_tokens = pl_module.training_state.clock.tokens
        self._bar_set = False

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Set the bar up at the first epoch only: a run longer than one pass over its corpus
        goes on counting tokens and time from the start of training, not of the epoch."""
        if self._bar_set:
            return
        self._bar_set = True
        super().on_train_epoch_start(trainer)
        state = pl_module.training_state
        self.train_progress_bar.reset(total=self._end_tokens(trainer, state))
        self.train_progress_bar.n = self.train_progress_bar.initial = state.clock.tokens
        self.train_progress_bar.set_description("Training")

    @staticmethod
    def _end_tokens(trainer: L.Trainer, state) -> float | None:
        """Tokens at the end: the budget, or max_steps at the tokens per step so far (or planned)."""
        ends = [state.token_budget] if state.token_budget is not None else []
        if trainer.max_steps > 0:
            per_step = state.clock.tokens / state.clock.steps if state.clock.steps else None
            per_step = per_step or state.global_batch.sequences_per_optimizer_step * trainer.datamodule.seq_len
            ends.append(state.clock.tokens + (trainer.max_steps - state.clock.steps) * per_step)
        return min(ends) if ends else None

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        state = pl_module.training_state
        if state.micro_batch_index != 0:
            return  # only when a batch completed an optimizer step
        if self.lines:
            if time.monotonic() - self._last_line >= self.line_interval_s and trainer.is_global_zero:
                self._log_line(trainer, pl_module)
            return
        if self.train_progress_bar.disable:
            return
        bar = self.train_progress_bar
        if trainer.max_steps > 0 and state.clock.steps:
            bar.total = self._end_tokens(trainer, state)
        bar.n = min(state.clock.tokens, bar.total or float("inf"))  # the last step may overshoot the end
        bar.set_postfix(self.get_metrics(trainer, pl_module), refresh=False)
        bar.refresh()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_validation_end(trainer, pl_module)
        if self.lines and trainer.is_global_zero and not trainer.sanity_checking:
            self._log_line(trainer, pl_module)

    def _log_line(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """One progress line: step, tokens towards the end, the shown metrics, time spent and left."""
        state = pl_module.training_state
        now, tokens, end = time.monotonic(), state.clock.tokens, self._end_tokens(trainer, state)
        elapsed = now - self._started
        parts = [f"step {state.clock.steps}", f"{readable(tokens)} tokens"]
        timing = f"{duration(elapsed)} elapsed"
        if end:
            parts[1] = f"{readable(tokens)}/{readable(end)} tokens ({min(100 * tokens / end, 100):.0f}%)"
            done = tokens - self._start_tokens
            if done > 0:
                timing += f", {duration(elapsed * max(end - tokens, 0) / done)} left"
        metrics = ", ".join(f"{k}={v}" for k, v in self.get_metrics(trainer, pl_module).items())
        log.info(" | ".join([*parts, *([metrics] if metrics else []), timing]))
        self._last_line = now

"""A progress bar that counts tokens towards the token budget.

Lightning's bar counts training batches, which are micro-batches here and vary in
number per optimizer step; tokens are what the budget, the LR schedule and the charts
count, so the bar shows them, updated once per optimizer step, with loss and speed.
"""

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import TQDMProgressBar
from lightning.pytorch.callbacks.progress.tqdm_progress import Tqdm


class TokenProgressBar(TQDMProgressBar):
    BAR_FORMAT = "{l_bar}{bar}| {n_fmt}/{total_fmt} tokens [{elapsed}<{remaining}{postfix}]"

    def init_train_tqdm(self) -> Tqdm:
        bar = super().init_train_tqdm()
        bar.unit_scale = True
        return bar

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_epoch_start(trainer)
        self.train_progress_bar.reset(total=pl_module.token_budget)
        self.train_progress_bar.n = self.train_progress_bar.initial = pl_module.clock.tokens
        self.train_progress_bar.set_description("Training")

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if pl_module.at_step_boundary and not self.train_progress_bar.disable:
            # The last step may overshoot the budget; tqdm would then drop the total.
            self.train_progress_bar.n = min(pl_module.clock.tokens, self.train_progress_bar.total or float("inf"))
            self.train_progress_bar.set_postfix(self.get_metrics(trainer, pl_module), refresh=False)
            self.train_progress_bar.refresh()

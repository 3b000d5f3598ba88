"""No host sync in the training step on steps that do not log.

Reading a tensor's value on the host (``.item()``, ``.tolist()``, ``float(t)``, ``bool(t)``,
``.cpu()``, ``.numpy()``) waits for the GPU. On a CPU there is no GPU to wait for, so the
test counts the reads themselves: every one made from the project's own code between the
start and the end of a batch, with all default callbacks on. Steps that log may read (once);
steps that do not log must not read at all.
"""

import sys

import lightning as L
import torch

from tests.run_helpers import REPO, TINY, compose_config, fit_in_process

READS = ("item", "tolist", "__float__", "__int__", "__bool__", "cpu", "numpy")
FIRST_PARTY = tuple(str(REPO / folder) for folder in ("lightning_modules", "callbacks", "launch", "data", "evaluation"))


class CountReads(L.Callback):
    """Counts first-party host reads within each batch, by the optimizer step it belongs to."""

    def __init__(self) -> None:
        self.by_step: dict[int, int] = {}
        self._step: int | None = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._step = pl_module.training_state.clock.steps + 1

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self._step = None

    def record(self) -> None:
        if self._step is not None:
            self.by_step[self._step] = self.by_step.get(self._step, 0) + 1


def test_steps_that_do_not_log_read_nothing_on_the_host(tmp_path, monkeypatch):
    counter = CountReads()
    for name in READS:
        original = getattr(torch.Tensor, name)

        def counted(tensor, *args, _original=original, **kwargs):
            caller = sys._getframe(1).f_code.co_filename
            if caller.startswith(FIRST_PARTY):
                counter.record()
            return _original(tensor, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    cfg = compose_config(
        TINY
        + [
            "trainer.max_steps=8",
            "trainer.log_every_n_steps=4",
            "logger=none",
            "batch.micro_batch_size=2",
            "batch.global_batch_size=4",
        ],
        tmp_path,
    )
    fit_in_process(cfg, callbacks=[counter])
    logged = {4, 8}
    assert all(counter.by_step.get(step, 0) == 0 for step in range(1, 9) if step not in logged), counter.by_step
    assert all(counter.by_step.get(step, 0) > 0 for step in logged), counter.by_step  # the test sees reads

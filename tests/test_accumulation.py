"""Gradient accumulation owned by the module equals one big batch and a direct computation."""

import copy
from functools import partial

import lightning as L
import torch
import torch.nn.functional as F

from callbacks.seq_len_warmup.cutting import truncate
from launch.builders import build_callbacks, build_datamodule, build_module, build_trainer
from launch.from_config import read_settings
from tests.run_helpers import TINY, compose_config


class CaptureGradients(L.Callback):
    """Records the gradients the optimizer is about to apply, and the weights before it."""

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        if not hasattr(self, "grads"):
            self.grads = {n: p.grad.detach().clone() for n, p in pl_module.model.named_parameters()}


def one_step(tmp_path, micro: int, global_batch: int, train_seq_len: int | None = None):
    cfg = compose_config(
        TINY
        + [
            f"batch.micro_batch_size={micro}",
            f"batch.global_batch_size={global_batch}",
            "optimizer.grad_clip=null",
            "trainer.max_steps=1",
            "logger=none",
            "callbacks=none",
        ],
        tmp_path,
    )
    settings = read_settings(cfg, processes=1)
    L.seed_everything(cfg.seed, verbose=False)
    datamodule = build_datamodule(settings)
    module = build_module(settings, datamodule.vocab_size)
    capture = CaptureGradients()
    trainer = build_trainer(settings, [], build_callbacks(settings) + [capture])
    module.configure_model()
    if train_seq_len is not None:
        module.training_state.set_sequence_cutter(partial(truncate, length=train_seq_len))
    initial = copy.deepcopy(module.model)
    trainer.fit(module, datamodule=datamodule)
    return capture.grads, initial, module, lambda: build_datamodule(settings)


def first_batches(make_datamodule, count: int):
    """A fresh data module's first micro-batches: the start of the data order."""
    datamodule = make_datamodule()
    datamodule.setup("fit")
    loader = iter(datamodule.train_dataloader())
    return [next(loader) for _ in range(count)]


def test_eight_accumulated_micro_batches_equal_one_batch_of_eight(tmp_path):
    grads_big, initial, module, make_datamodule = one_step(tmp_path / "a", micro=8, global_batch=8)
    grads_acc, _, module_acc, _ = one_step(tmp_path / "b", micro=1, global_batch=8)
    assert module.training_state.clock.tokens == module_acc.training_state.clock.tokens == 8 * 32

    # Independent reference: the mean loss over the first 8 rows of the data order, by hand.
    (batch,) = first_batches(make_datamodule, 1)
    logits = initial(batch["input_ids"])
    F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten()).backward()
    for name, param in initial.named_parameters():
        torch.testing.assert_close(grads_big[name], param.grad, rtol=0, atol=1e-6)
        torch.testing.assert_close(grads_acc[name], param.grad, rtol=0, atol=1e-6)


def test_truncated_sequences_count_only_the_tokens_trained_on(tmp_path):
    grads, initial, module, make_datamodule = one_step(tmp_path, micro=4, global_batch=8, train_seq_len=12)
    clock = module.training_state.clock
    assert clock.tokens == 8 * 12 and clock.sequences == 8
    for batch in first_batches(make_datamodule, 2):  # the step's two micro-batches, cut to 12 tokens
        logits = initial(batch["input_ids"][:, :12])
        loss = F.cross_entropy(logits.flatten(0, 1), batch["labels"][:, :12].flatten())
        (loss / 2).backward()
    for name, param in initial.named_parameters():
        torch.testing.assert_close(grads[name], param.grad, rtol=0, atol=1e-6)

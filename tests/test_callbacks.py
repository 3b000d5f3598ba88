"""Validation schedule and throughput arithmetic against hand-computed values."""

from types import SimpleNamespace

import pytest
import torch

from callbacks import throughput as throughput_module
from callbacks.throughput import Throughput
from callbacks.validation_schedule import ValidationSchedule
from lightning_modules.clock import TrainingClock
from lightning_modules.llama import LlamaConfig
from lightning_modules.parallelism import LayoutConfig

CONFIG = LlamaConfig(vocab_size=256, n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, mlp_hidden=128)

INF = float("inf")


def fake_module(steps: int = 0, tokens: int = 0, boundary: bool = True, checkpointing: str = "none"):
    return SimpleNamespace(
        clock=TrainingClock(steps=steps, tokens=tokens),
        at_step_boundary=boundary,
        step_metrics={},
        device=torch.device("cpu"),
        model_config=CONFIG,
        layout=LayoutConfig(activation_checkpointing=checkpointing),
        trained_seq_len=64,
    )


def fake_trainer(max_steps: int = -1):
    return SimpleNamespace(max_steps=max_steps, val_check_batch=INF, world_size=2)


def validated_steps(schedule: ValidationSchedule, tokens_per_step: list[int], max_steps: int = -1) -> list[int]:
    """Steps after which the schedule asks Lightning to validate."""
    trainer, module, due = fake_trainer(max_steps), fake_module(), []
    for batch_idx, tokens in enumerate(tokens_per_step):
        module.clock.advance(sequences=1, tokens=tokens)
        schedule.on_train_batch_end(trainer, module, None, None, batch_idx)
        if trainer.val_check_batch != INF:
            assert (batch_idx + 1) % trainer.val_check_batch == 0  # Lightning's own test
            due.append(module.clock.steps)
    return due


def test_every_n_steps():
    assert validated_steps(ValidationSchedule(every_n_steps=3), [10] * 10) == [3, 6, 9]


def test_every_n_tokens_with_growing_steps():
    # cumulative tokens: 40, 80, 160, 320, 640 -> crossings of multiples of 100 at steps 3, 4, 5
    assert validated_steps(ValidationSchedule(every_n_tokens=100), [40, 40, 80, 160, 320]) == [3, 4, 5]


def test_last_step_at_max_steps_validates():
    assert validated_steps(ValidationSchedule(every_n_steps=4), [10] * 5, max_steps=5) == [4, 5]


def test_no_validation_inside_gradient_accumulation():
    schedule, trainer = ValidationSchedule(every_n_steps=1), fake_trainer()
    schedule.on_train_batch_end(trainer, fake_module(steps=3, boundary=False), None, None, 0)
    assert trainer.val_check_batch == INF


def test_schedule_needs_exactly_one_interval():
    with pytest.raises(ValueError, match="exactly one"):
        ValidationSchedule(every_n_steps=2, every_n_tokens=100)


def fake_clock(monkeypatch) -> list[float]:
    now = [0.0]
    monkeypatch.setattr(throughput_module.time, "perf_counter", lambda: now[0])
    return now


def test_throughput_is_tokens_over_time_and_skips_validation(monkeypatch):
    now = fake_clock(monkeypatch)
    callback, trainer, module = Throughput(window=2, warmup_steps=1), fake_trainer(), fake_module()

    def step(seconds: float, tokens: int) -> None:
        now[0] += seconds
        module.clock.advance(sequences=1, tokens=tokens)
        callback.on_train_batch_end(trainer, module, None, None, 0)

    step(5.0, 1000)  # warm-up step: not measured
    step(1.0, 1000)  # first mark
    step(2.0, 1000)  # 1000 tokens in 2 s
    assert module.step_metrics["perf/tokens_per_sec"] == pytest.approx(500.0)
    callback.on_validation_start(trainer, module)
    now[0] += 30.0  # validation time does not count
    callback.on_validation_end(trainer, module)
    step(2.0, 3000)  # window of 2 steps: 4000 tokens in 4 s
    assert module.step_metrics["perf/tokens_per_sec"] == pytest.approx(1000.0)
    assert module.step_metrics["perf/tokens_per_sec_per_device"] == pytest.approx(500.0)


def by_hand_flops_per_token(seq_len: int) -> int:
    """PaLM's 6N + 12 L H Q T for CONFIG, N counted by hand: attention, MLP and output head."""
    d, kv, hidden, vocab, layers = 64, 2 * 16, 128, 256, 2
    n = layers * (2 * d * d + 2 * d * kv + 3 * d * hidden) + vocab * d
    return 6 * n + 12 * layers * 4 * 16 * seq_len


def test_mfu_uses_each_steps_sequence_length(monkeypatch):
    """Two steps at T=32 and T=64 (sequence-length warmup): FLOPs summed step by step."""
    now = fake_clock(monkeypatch)
    peak = 1e9
    callback = Throughput(window=5, warmup_steps=0, peak_flops_per_device=peak)
    trainer, module = fake_trainer(), fake_module()
    callback.on_train_start(trainer, module)
    for seconds, tokens, seq_len in [(1.0, 100, 32), (2.0, 300, 32), (4.0, 500, 64)]:
        now[0] += seconds
        module.trained_seq_len = seq_len
        module.clock.advance(sequences=1, tokens=tokens)
        callback.on_train_batch_end(trainer, module, None, None, 0)
    flops = 300 * by_hand_flops_per_token(32) + 500 * by_hand_flops_per_token(64)
    assert module.step_metrics["perf/mfu"] == pytest.approx(flops / (6.0 * 2 * peak))
    assert module.step_metrics["perf/hfu"] == pytest.approx(module.step_metrics["perf/mfu"])
    assert module.step_metrics["perf/model_flops_per_token"] == by_hand_flops_per_token(64)


def test_hfu_counts_the_recomputed_forward(monkeypatch):
    now = fake_clock(monkeypatch)
    callback = Throughput(window=5, warmup_steps=0, peak_flops_per_device=1e9)
    trainer, module = fake_trainer(), fake_module(checkpointing="mlp")
    callback.on_train_start(trainer, module)
    for _ in range(2):
        now[0] += 1.0
        module.clock.advance(sequences=1, tokens=100)
        callback.on_train_batch_end(trainer, module, None, None, 0)
    mlp_forward = 2 * 2 * (3 * 64 * 128)  # one more forward of each layer's MLP
    ratio = (by_hand_flops_per_token(64) + mlp_forward) / by_hand_flops_per_token(64)
    assert module.step_metrics["perf/hfu"] / module.step_metrics["perf/mfu"] == pytest.approx(ratio)

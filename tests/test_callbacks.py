"""Validation schedule, throughput and progress bar against hand-computed values.

The callbacks run on the real training state (``TrainingState``), driven step by step as
the training module drives it; the trainer is a stand-in with the fields they read.
"""

from types import SimpleNamespace

import pytest

from callbacks.infrastructure import throughput as throughput_module
from callbacks.infrastructure.progress_bar import readable
from callbacks.infrastructure.throughput import Throughput
from callbacks.infrastructure.validation_schedule import NEVER, ValidationSchedule
from lightning_modules.flops import peak_flops
from tests.run_helpers import training_state


def fake_trainer(batch_idx: int = 0):
    epoch_loop = SimpleNamespace(batch_idx=batch_idx)
    return SimpleNamespace(
        val_check_batch=NEVER, world_size=2, is_global_zero=True, fit_loop=SimpleNamespace(epoch_loop=epoch_loop)
    )


def end_step(state, tokens: int, stopping: bool = False, seq_len: int = 64) -> None:
    """What the training module does at the end of an optimizer step."""
    state.clock.advance(sequences=1, tokens=tokens)
    state.trained_tokens += tokens  # one job: it trained every token the clock counts
    state.seq_len, state.stopping = seq_len, stopping


def validated_steps(schedule: ValidationSchedule, tokens_per_step: list[int], last: int | None = None) -> list[int]:
    """Steps after which the schedule asks Lightning to validate (``last``: the step training stops at)."""
    trainer, state, due = fake_trainer(), training_state(), []
    schedule.setup(trainer, None, "fit")
    for batch_idx, tokens in enumerate(tokens_per_step):
        trainer.fit_loop.epoch_loop.batch_idx = batch_idx
        schedule.on_step_start(state)
        assert trainer.val_check_batch == NEVER  # never inside a step
        end_step(state, tokens, stopping=state.clock.steps + 1 == last)
        schedule.on_step_end(state)
        if trainer.val_check_batch != NEVER:
            assert (batch_idx + 1) % trainer.val_check_batch == 0  # Lightning's own test
            due.append(state.clock.steps)
    return due


def test_every_n_steps():
    assert validated_steps(ValidationSchedule(every_n_steps=3, every_n_tokens=None), [10] * 10) == [3, 6, 9]


def test_every_n_tokens_validates_once_per_crossed_mark():
    schedule = ValidationSchedule(every_n_steps=None, every_n_tokens=100)
    assert validated_steps(schedule, [40, 40, 80, 160, 320]) == [3, 4, 5]


def test_the_last_step_is_validated():
    assert validated_steps(ValidationSchedule(every_n_steps=4, every_n_tokens=None), [10] * 5, last=5) == [4, 5]


def test_schedule_needs_exactly_one_interval():
    with pytest.raises(ValueError, match="exactly one"):
        ValidationSchedule(every_n_steps=2, every_n_tokens=100)


def fake_clock(monkeypatch) -> list[float]:
    now = [0.0]
    monkeypatch.setattr(throughput_module.time, "perf_counter", lambda: now[0])
    return now


def run_steps(callback, state, now, steps: list[tuple[float, int, int]]) -> None:
    for seconds, tokens, seq_len in steps:
        now[0] += seconds
        end_step(state, tokens, seq_len=seq_len)
        callback.on_step_end(state)


def started(callback: Throughput, state) -> None:
    callback.on_train_start(fake_trainer(), SimpleNamespace(training_state=state))


def test_throughput_is_tokens_over_time_between_logging_steps_and_skips_validation(monkeypatch):
    now = fake_clock(monkeypatch)
    callback = Throughput(warmup_steps=1, peak_flops_per_device=None, include_embedding=False)
    state = training_state(log_every_n_steps=2)
    started(callback, state)
    run_steps(callback, state, now, [(5.0, 1000, 64)])  # warm-up step: marks its end
    run_steps(callback, state, now, [(2.0, 1000, 64)])  # step 2, a logging step: 1000 tokens in 2 s
    assert state.metrics.values["perf/tokens_per_sec"] == pytest.approx(500.0)
    state.metrics.clear()
    run_steps(callback, state, now, [(1.0, 1000, 64)])  # step 3: not logged, nothing measured
    assert "perf/tokens_per_sec" not in state.metrics.values
    callback.on_validation_start(None, SimpleNamespace(training_state=state))
    now[0] += 30.0  # validation time does not count
    callback.on_validation_end(None, SimpleNamespace(training_state=state))
    run_steps(callback, state, now, [(1.0, 3000, 64)])  # steps 3-4: 4000 tokens in 2 s
    assert state.metrics.values["perf/tokens_per_sec"] == pytest.approx(2000.0)
    assert state.metrics.values["perf/tokens_per_sec_per_device"] == pytest.approx(1000.0)


def test_throughput_counts_the_tokens_this_job_trained_not_a_healed_clock(monkeypatch):
    """A DiLoCo group healed by a peer ahead of it: its clock jumps by steps it never trained.
    The rate since the warm-up is the 2000 tokens it trained in 2 s, not 11000."""
    now = fake_clock(monkeypatch)
    callback = Throughput(warmup_steps=1, peak_flops_per_device=None, include_embedding=False)
    state = training_state(log_every_n_steps=3)
    started(callback, state)
    run_steps(callback, state, now, [(5.0, 1000, 64)])  # warm-up
    run_steps(callback, state, now, [(1.0, 1000, 64)])
    clock = state.clock.state_dict()
    state.move_clock({**clock, "steps": clock["steps"] + 9, "tokens": clock["tokens"] + 9_000})  # step 12 next: logged
    run_steps(callback, state, now, [(1.0, 1000, 64)])
    assert state.metrics.values["perf/tokens_per_sec"] == pytest.approx(1000.0)


def by_hand_flops_per_token(seq_len: int) -> int:
    """PaLM's 6N + 12 L H Q T for the test model, N counted by hand: attention, MLP and output head."""
    d, kv, hidden, vocab, layers = 64, 2 * 16, 128, 256, 2
    n = layers * (2 * d * d + 2 * d * kv + 3 * d * hidden) + vocab * d
    return 6 * n + 12 * layers * 4 * 16 * seq_len


def test_mfu_uses_each_steps_sequence_length(monkeypatch):
    """Three steps at T=32, 32 and 64 (sequence-length warmup): FLOPs summed step by step."""
    now, peak = fake_clock(monkeypatch), 1e9
    callback = Throughput(warmup_steps=0, peak_flops_per_device=peak, include_embedding=False)
    state = training_state(log_every_n_steps=3)
    started(callback, state)
    run_steps(callback, state, now, [(1.0, 100, 32), (2.0, 300, 32), (4.0, 500, 64)])
    flops = 100 * by_hand_flops_per_token(32) + 300 * by_hand_flops_per_token(32) + 500 * by_hand_flops_per_token(64)
    metrics = state.metrics.values
    assert metrics["perf/mfu"] == pytest.approx(flops / (7.0 * 2 * peak))
    assert metrics["perf/hfu"] == pytest.approx(metrics["perf/mfu"])
    assert metrics["perf/model_flops_per_token"] == by_hand_flops_per_token(64)


def test_hfu_counts_the_recomputed_forward(monkeypatch):
    now = fake_clock(monkeypatch)
    callback = Throughput(warmup_steps=0, peak_flops_per_device=1e9, include_embedding=False)
    state = training_state(checkpointing="mlp", log_every_n_steps=2)
    started(callback, state)
    run_steps(callback, state, now, [(1.0, 100, 64), (1.0, 100, 64)])
    mlp_forward = 2 * 2 * (3 * 64 * 128)  # one more forward of each layer's MLP
    ratio = (by_hand_flops_per_token(64) + mlp_forward) / by_hand_flops_per_token(64)
    assert state.metrics.values["perf/hfu"] / state.metrics.values["perf/mfu"] == pytest.approx(ratio)


def test_peak_table_matches_device_names_exactly():
    assert peak_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert peak_flops("NVIDIA L40S") == 362e12 and peak_flops("NVIDIA L4") == 121e12  # not each other's
    assert peak_flops("NVIDIA H100 80GB HBM3 (custom)") is None and peak_flops("Some GPU") is None


def test_progress_bar_numbers_are_readable():
    assert [readable(x) for x in (1_020_000, 8_900, 2.56034, 2_500_000_000, 512.0)] == [
        "1.02M",
        "8.9k",
        "2.560",
        "2.5G",
        "512",
    ]


def test_progress_lines_count_time_from_the_start_of_training_across_epochs(tmp_path, tmp_path_factory) -> None:
    """A run over several passes of a tiny corpus: elapsed never restarts at an epoch."""
    import re

    from tests.run_helpers import TINY, run_train

    settings = [o for o in TINY if not o.startswith(("data.source.max_documents=", "token_budget="))]
    result = run_train(
        [
            *settings,
            "data.source.max_documents=40",
            "data.val_fraction=0.1",
            "token_budget=12800",
            "callbacks.progress_bar.lines=true",
            "callbacks.progress_bar.line_interval_s=0.5",
            "+callbacks.pace._target_=benchmarks.pace.Pace",
            "+callbacks.pace.seconds=0.03",
        ],
        tmp_path / "run",
        tmp_path_factory.getbasetemp() / "cache",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr
    elapsed = [60 * int(m) + int(s) for m, s in re.findall(r"(\d+)m(\d+)s elapsed", output)]
    assert len(elapsed) >= 4 and elapsed == sorted(elapsed) and elapsed[-1] >= 2


def test_a_diverged_validation_loss_gives_an_infinite_perplexity_not_an_error():
    """A study's tuning run at an extreme point (loss 1e3 nats) once ended the sweep with
    ``OverflowError: math range error`` from exp(loss)."""
    from lightning_modules.llama_module import perplexity

    assert perplexity(2.0) == pytest.approx(7.38905609893065)
    assert perplexity(709.0) == pytest.approx(8.218407461554972e307)
    assert perplexity(1e3) == float("inf")
    assert perplexity(float("nan")) != perplexity(float("nan"))  # NaN stays NaN

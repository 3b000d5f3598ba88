"""A run stopped and resumed continues exactly as if it had not stopped (CPU, bitwise)."""

import signal
import subprocess
import sys

import pytest
import torch

from tests.run_helpers import OBSERVED, REPO, TINY, checkpoint_weights, run_to_completion, train_losses

STEPS = 9


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.getbasetemp() / "cache"


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, cache):
    run_dir = tmp_path_factory.mktemp("uninterrupted")
    run_to_completion(TINY + OBSERVED + [f"trainer.max_steps={STEPS}"], run_dir, cache)
    return run_dir


def resume(checkpoint, run_dir, cache):
    overrides = TINY + OBSERVED + [f"trainer.max_steps={STEPS}", f"ckpt_path={checkpoint}"]
    run_to_completion(overrides, run_dir, cache)


def assert_same_run(resumed_dir, reference_dir, first_resumed_step: int):
    reference, resumed = train_losses(reference_dir), train_losses(resumed_dir)
    assert min(resumed) == first_resumed_step
    assert {step: reference[step] for step in resumed} == resumed
    final = checkpoint_weights(reference_dir / "checkpoints" / "last.ckpt")
    for name, value in checkpoint_weights(resumed_dir / "checkpoints" / "last.ckpt").items():
        assert torch.equal(value, final[name]), name


def test_stop_at_max_steps_then_resume(uninterrupted, tmp_path, cache):
    run_to_completion(TINY + OBSERVED + ["trainer.max_steps=4"], tmp_path / "first", cache)
    resume(tmp_path / "first/checkpoints/last.ckpt", tmp_path / "resumed", cache)
    assert_same_run(tmp_path / "resumed", uninterrupted, first_resumed_step=5)


def test_sigterm_saves_mid_accumulation_and_resumes_exactly(uninterrupted, tmp_path, cache):
    """SIGTERM (preemption) lands while a step accumulates its 4 micro-batches."""
    command = [
        sys.executable,
        str(REPO / "train.py"),
        f"hydra.run.dir={tmp_path / 'killed'}",
        f"paths.cache_dir={cache}",
        *TINY,
        *OBSERVED,
        f"trainer.max_steps={STEPS}",
        "+callbacks.slow._target_=tests.slow_steps.SlowSteps",
    ]
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = ""
    while "SLOW STEP 3" not in seen:  # printed by the slow-down callback in micro-batch 2 of step 4
        line = process.stdout.readline()
        assert line, f"run ended before step 3:\n{seen[-3000:]}"
        seen += line
    process.send_signal(signal.SIGTERM)
    output = seen + process.stdout.read()
    assert process.wait(timeout=120) == 0, output[-3000:]
    assert "SIGTERM: saved" in output and "at step 3" in output

    resume(tmp_path / "killed/checkpoints/last.ckpt", tmp_path / "resumed", cache)
    assert_same_run(tmp_path / "resumed", uninterrupted, first_resumed_step=4)

"""The LR schedule against values worked out by hand from its documented formula."""

import math

import pytest

from lightning_modules.lr_schedule import LRScheduleSettings, learning_rate
from tests.run_helpers import default_settings

PEAK, BUDGET = 1.0, 1000
# The settings that each test does not name: no warmup, so the hand-computed values stay simple.
NONE_NAMED = {"warmup_steps": 0, "warmup_tokens": 0}


def schedule(**settings) -> LRScheduleSettings:
    """conf/train.yaml's lr_schedule with these settings (the YAML holds the defaults)."""
    return default_settings(LRScheduleSettings, "lr_schedule", **{**NONE_NAMED, **settings})


def lr(name: str, step: int, tokens: int, **kwargs) -> float:
    return learning_rate(PEAK, schedule(name=name, **kwargs), step, tokens, BUDGET)


def test_step_warmup_is_linear_in_steps():
    assert lr("constant", 1, 0, warmup_steps=4) == pytest.approx(0.25)
    assert lr("constant", 3, 0, warmup_steps=4) == pytest.approx(0.75)
    assert lr("constant", 4, 0, warmup_steps=4) == pytest.approx(1.0)
    assert lr("constant", 50, 0, warmup_steps=4) == pytest.approx(1.0)


def test_token_warmup_then_decay_starts_after_warmup_tokens():
    # warmup over 200 tokens; cosine decay from 200 to 1000 tokens, floor 0.1
    assert lr("cosine", 1, 50, warmup_tokens=200, min_lr_ratio=0.1) == pytest.approx(0.25)
    assert lr("cosine", 9, 200, warmup_tokens=200, min_lr_ratio=0.1) == pytest.approx(1.0)
    assert lr("cosine", 9, 600, warmup_tokens=200, min_lr_ratio=0.1) == pytest.approx(0.1 + 0.9 * 0.5)
    assert lr("cosine", 9, 1000, warmup_tokens=200, min_lr_ratio=0.1) == pytest.approx(0.1)


@pytest.mark.parametrize(
    ("name", "tokens", "expected"),
    [
        ("linear", 250, 0.0 + 1.0 * 0.75),
        ("cosine", 250, 0.5 * (1 + math.cos(math.pi * 0.25))),
        ("constant", 900, 1.0),
        ("wsd", 700, 1.0),  # stable until 1 - 0.2 = 80% of the budget
        ("wsd", 900, 0.5),  # halfway through the final 20%
        ("linear", 5000, 0.0),  # past the budget: stays at the floor
    ],
)
def test_decay_shapes_with_zero_floor(name, tokens, expected):
    assert lr(name, 10_000, tokens, min_lr_ratio=0.0, decay_fraction=0.2) == pytest.approx(expected)


def test_lr_depends_on_tokens_not_on_steps_after_warmup():
    """Same token count, different batching (step counts): same LR once warmup is over."""
    a = lr("cosine", 20, 480, warmup_steps=10)
    b = lr("cosine", 400, 480, warmup_steps=10)
    assert a == pytest.approx(b)


def test_bad_settings_name_the_key():
    with pytest.raises(ValueError, match="lr_schedule.name"):
        schedule(name="exponential")
    with pytest.raises(ValueError, match="warmup_steps and lr_schedule.warmup_tokens"):
        schedule(warmup_steps=5, warmup_tokens=5)
    with pytest.raises(ValueError, match="token budget"):
        learning_rate(1.0, schedule(name="cosine"), 1, 0, None)

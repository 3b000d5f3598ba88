"""Sequence-length warmup: DeepSpeed's schedule by hand, truncate / reshape, token counting,
token-based LR, config errors, and exact resume in the middle of the warmup."""

import lightning as L
import pytest
import torch

from callbacks.seq_len_warmup.cutting import reshape, truncate
from common.errors import ConfigError
from launch.from_config import read_settings
from tests.run_helpers import (
    OBSERVED,
    TINY,
    MemoryLogger,
    checkpoint_weights,
    compose_config,
    fit_in_process,
    run_to_completion,
    run_train,
)


def warmup_overrides(**settings) -> list[str]:
    return ["+technique=seq_len_warmup"] + [
        f"technique.seq_len_warmup.{key}={value}" for key, value in settings.items()
    ]


def warmup_settings(tmp_path, seq_len: int = 64, **settings):
    cfg = compose_config(TINY + [f"data.seq_len={seq_len}"] + warmup_overrides(**settings), tmp_path)
    return read_settings(cfg).techniques["seq_len_warmup"]


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        # floor(8 + 56 t/10), minus its remainder mod 8: t=1 -> 13 -> 8, t=3 -> 24, t=5 -> 36 -> 32
        (
            dict(schedule_type="fixed_linear", min_difficulty=8, max_difficulty=64, total_curriculum_step=10),
            {1: 8, 3: 24, 5: 32, 9: 56, 10: 64, 50: 64},
        ),
        # floor(8 + 56 sqrt(t/10)): t=1 -> 25 -> 24, t=4 -> 43 -> 40, t=9 -> 61 -> 56
        (
            dict(
                schedule_type="fixed_root", min_difficulty=8, max_difficulty=64, total_curriculum_step=10, root_degree=2
            ),
            {1: 24, 4: 40, 9: 56, 10: 64, 11: 64},
        ),
        (
            dict(schedule_type="fixed_discrete", difficulty=[16, 32, 64], max_step=[5, 10]),
            {1: 16, 5: 16, 6: 32, 10: 32, 11: 64},
        ),
    ],
)
def test_schedule_matches_hand_computed_values(settings, expected, tmp_path):
    warmup = warmup_settings(tmp_path, **{k: str(v).replace(" ", "") for k, v in settings.items()})
    assert {step: warmup.length_at(step, packed_length=64) for step in expected} == expected


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (dict(min_difficulty=12), "min_difficulty=12 must be a positive multiple of difficulty_step=8"),
        (dict(max_difficulty=128), "max_difficulty=128 is longer than the packed length data.seq_len=64"),
        (dict(total_curriculum_step=0), "total_curriculum_step=0 must be > 0"),
        (dict(mode="pad"), "mode='pad' is unknown"),
        (dict(schedule_type="fixed_discrete", difficulty=[8, 16], max_step=[]), "max_step` list one shorter"),
    ],
)
def test_invalid_settings_are_config_errors_naming_the_key(settings, message, tmp_path):
    with pytest.raises(ConfigError, match="technique.seq_len_warmup") as error:
        warmup_settings(tmp_path, **{k: str(v).replace(" ", "") for k, v in settings.items()})
    assert message in str(error.value)


def cut(mode: str, length: int, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {"truncate": truncate, "reshape": reshape}[mode](batch, length)


def test_truncate_keeps_the_first_tokens_and_their_labels():
    rows = torch.arange(2 * 33).view(2, 33)
    batch = cut("truncate", 8, {"input_ids": rows[:, :-1], "labels": rows[:, 1:]})
    assert torch.equal(batch["input_ids"], rows[:, :8]) and torch.equal(batch["labels"], rows[:, 1:9])


def test_reshape_keeps_every_token_once_in_rows_of_the_new_length():
    rows = torch.arange(2 * 33).view(2, 33)
    batch = cut("reshape", 8, {"input_ids": rows[:, :-1], "labels": rows[:, 1:]})
    assert batch["input_ids"].shape == (8, 8)
    assert torch.equal(batch["input_ids"].flatten(), rows[:, :-1].flatten())
    assert torch.equal(batch["labels"] - batch["input_ids"], torch.ones(8, 8, dtype=torch.long))


def test_reshape_drops_only_the_remainder_of_each_row():
    rows = torch.arange(2 * 33).view(2, 33)
    batch = cut("reshape", 24, {"input_ids": rows[:, :-1], "labels": rows[:, 1:]})
    assert torch.equal(batch["input_ids"], rows[:, :24])  # 32 // 24 = 1 row of 24 per packed row


class FullLengthValidation(L.Callback):
    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        assert batch["input_ids"].shape[1] == 32, "validation must run at the full packed length"


def fit(tmp_path, overrides: list[str]):
    """Six steps; per step (tokens before it, its LR, its trained length) from the logged rows."""
    cfg = compose_config(
        TINY
        + [
            "trainer.max_steps=6",
            "lr_schedule.warmup_steps=1",
            "logger=none",
            "callbacks.validation_schedule.every_n_steps=2",
        ]
        + overrides,
        tmp_path,
    )
    logger = MemoryLogger()
    module, _ = fit_in_process(cfg, callbacks=[FullLengthValidation()], loggers=[logger])
    rows = [row for _, row in logger.rows if "train/lr" in row]
    steps = [
        (row["train/tokens_seen"] - 8 * row["train/seq_len"], row["train/lr"], row["train/seq_len"]) for row in rows
    ]
    return module, steps


def test_tokens_and_lr_follow_the_truncated_lengths(tmp_path):
    """Steps 1-2 at 16 tokens, then 32: the clock counts what was trained on, and the LR at a
    given token count equals the LR of a run without warmup at that token count."""
    discrete = warmup_overrides(schedule_type="fixed_discrete", difficulty="[16,32]", max_step="[2]")
    warm, warm_steps = fit(tmp_path / "warm", discrete)
    _, plain_steps = fit(tmp_path / "plain", [])
    assert [length for _, _, length in warm_steps] == [16, 16, 32, 32, 32, 32]
    assert warm.training_state.clock.tokens == 8 * (16 + 16 + 32 * 4)
    plain_lr = {tokens: lr for tokens, lr, _ in plain_steps}
    shared = [(tokens, lr) for tokens, lr, _ in warm_steps if tokens in plain_lr and tokens > 0]
    assert len(shared) >= 3
    for tokens, lr in shared:
        assert lr == pytest.approx(plain_lr[tokens], rel=1e-12)


def test_resume_mid_warmup_gives_identical_weights(tmp_path):
    cache = tmp_path / "cache"
    warmup = warmup_overrides(min_difficulty=8, max_difficulty=32, total_curriculum_step=6, mode="reshape")
    base = TINY + OBSERVED + warmup
    run_to_completion(base + ["trainer.max_steps=8"], tmp_path / "full", cache)
    run_to_completion(base + ["trainer.max_steps=3"], tmp_path / "first", cache)
    resumed = run_train(
        base + ["trainer.max_steps=8", f"ckpt_path={tmp_path / 'first/checkpoints/last.ckpt'}"],
        tmp_path / "resumed",
        cache,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    expected = checkpoint_weights(tmp_path / "full/checkpoints/last.ckpt")
    for name, value in checkpoint_weights(tmp_path / "resumed/checkpoints/last.ckpt").items():
        assert torch.equal(value, expected[name]), name
    full_state = torch.load(tmp_path / "full/checkpoints/last.ckpt", weights_only=False)["training_state"]
    resumed_state = torch.load(tmp_path / "resumed/checkpoints/last.ckpt", weights_only=False)["training_state"]
    assert full_state == resumed_state

"""Global batch arithmetic against values computed by hand."""

import pytest

from lightning_modules.global_batch import BatchConfig, BatchConfigError, GlobalBatch


def make(global_batch: int = 32, micro: int = 4, ranks: int = 2, cap: int | None = None) -> GlobalBatch:
    return GlobalBatch(BatchConfig(global_batch, micro, cap), data_parallel_size=ranks)


def test_accumulation_is_global_over_micro_times_ranks():
    assert make(32, 4, 2).accumulation == 4
    assert make(8, 8, 1).accumulation == 1


def test_requests_round_up_cap_and_apply_at_next_step():
    batch = make(32, 4, 2, cap=100)
    assert batch.request(33) == 40  # next multiple of 4 x 2
    assert batch.size == 32  # not before the next step begins
    batch.apply_pending()
    assert (batch.size, batch.accumulation) == (40, 5)
    assert batch.request(1000) == 96  # capped at the largest multiple of 8 under 100
    batch.apply_pending()
    assert batch.size == 96


def test_invalid_global_batch_names_the_key_and_a_fix():
    with pytest.raises(BatchConfigError, match=r"global_batch_size=30 .* 4 x 2 = 8; set it to 32"):
        make(30, 4, 2)
    with pytest.raises(BatchConfigError, match="max_global_batch_size"):
        make(32, 4, 2, cap=16)


def test_state_round_trip_keeps_a_pending_request():
    batch = make()
    batch.request(48)
    restored = make()
    restored.load_state_dict(batch.state_dict())
    restored.apply_pending()
    assert restored.size == 48

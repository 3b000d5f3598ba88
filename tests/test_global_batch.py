"""Global batch arithmetic and the automatic micro-batch, against values computed by hand."""

import pytest

from common.errors import CheckpointError, ConfigError
from lightning_modules.global_batch import BatchSettings, GlobalBatch, micro_batch_size_for


def config(global_batch: int = 32, micro: int | None = 4, cap: int | None = None, max_micro: int = 16) -> BatchSettings:
    return BatchSettings(
        global_batch_size=global_batch,
        micro_batch_size=micro,
        max_micro_batch_size=max_micro,
        max_global_batch_size=cap,
    )


def make(
    global_batch: int = 32, micro: int = 4, ranks: int = 2, cap: int | None = None, replicas: int = 1
) -> GlobalBatch:
    return GlobalBatch(config(global_batch, micro, cap), micro, data_parallel_size=ranks, sequential_replicas=replicas)


def test_accumulation_is_global_over_micro_times_ranks_times_replicas():
    assert make(32, 4, 2).accumulation == 4
    assert make(8, 8, 1).accumulation == 1
    simulated = make(32, 4, 1, replicas=2)  # 2 replicas taking turns: 16 sequences each
    assert (simulated.accumulation, simulated.sequences_per_optimizer_step, simulated.granularity) == (4, 16, 8)


def test_requests_round_up_cap_and_apply_at_next_step():
    batch = make(32, 4, 2, cap=100)
    assert batch.request(33) == 40  # next multiple of 4 x 2
    assert batch.size == 32  # not before the next step begins
    batch.apply_pending()
    assert (batch.size, batch.accumulation) == (40, 5)
    assert batch.request(1000) == 96  # capped at the largest multiple of 8 under 100
    batch.apply_pending()
    assert batch.size == 96


@pytest.mark.parametrize(
    ("global_batch", "ranks", "replicas", "max_micro", "micro"),
    [
        (16, 1, 1, 16, 16),  # the default: one micro-batch of 16
        (16, 2, 1, 16, 8),  # 2 devices: 8 each
        (16, 8, 1, 16, 2),  # 8 devices: 2 each
        (32, 1, 4, 16, 8),  # 4 simulated replicas: 8 each
        (16, 1, 1, 4, 4),  # memory allows 4: 4 micro-batches of 4
        (24, 1, 1, 16, 12),  # the largest divisor of 24 up to 16
        (26, 1, 1, 12, 2),  # 26 = 2 x 13: 13 > 12, so 2
    ],
)
def test_automatic_micro_batch_is_the_largest_divisor_of_each_ranks_share(
    global_batch, ranks, replicas, max_micro, micro
):
    assert micro_batch_size_for(config(global_batch, None, max_micro=max_micro), ranks, replicas) == micro


def test_a_batch_that_cannot_be_split_names_the_key_and_a_fix():
    with pytest.raises(
        ConfigError, match=r"global_batch_size=30 does not split evenly over 4 data-parallel rank\(s\); .* 32"
    ):
        micro_batch_size_for(config(30, None), 4)
    with pytest.raises(ConfigError, match=r"micro_batch_size=4 does not divide each rank's share .* = 6 sequences"):
        micro_batch_size_for(config(12, 4), 2)
    with pytest.raises(ConfigError, match="exceeds batch.max_global_batch_size"):
        config(32, 4, cap=16)


def test_state_round_trip_keeps_a_pending_request_and_refuses_another_granularity():
    batch = make()
    batch.request(48)
    restored = make()
    restored.load_state_dict(batch.state_dict())
    restored.apply_pending()
    assert restored.size == 48
    with pytest.raises(CheckpointError, match="not a multiple of micro_batch x ranks = 12"):
        make(36, 6, 2).load_state_dict({"size": 32, "pending": None})


def test_automatic_micro_batch_leaves_the_accumulation_a_technique_needs():
    """The adaptive batch's micro-step samples need 2 micro-batches: 16 on one device -> 2 of 8."""
    assert micro_batch_size_for(config(16, None), 1, min_accumulation=2) == 8
    assert micro_batch_size_for(config(16, None, max_micro=4), 1, min_accumulation=2) == 4
    assert micro_batch_size_for(config(2, None), 2, min_accumulation=2) == 1  # as far as it can

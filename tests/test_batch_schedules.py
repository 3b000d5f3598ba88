"""Batch-size decisions and baseline schedules against values worked out by hand."""

from types import SimpleNamespace

import pytest

from callbacks.adaptive_batch import AdaptiveBatchSize
from callbacks.batch_schedules import ConstantBatch, LinearBatchRampup, StagewiseBatchWarmup
from callbacks.batch_size_tests import SampleSums, required_batch
from lightning_modules.clock import TrainingClock
from lightning_modules.global_batch import BatchConfig, BatchConfigError, GlobalBatch, check_single_controller


def fake_module(global_batch: int, micro: int, ranks: int = 1, cap: int | None = None, budget: int | None = None):
    config = BatchConfig(global_batch_size=global_batch, micro_batch_size=micro, max_global_batch_size=cap)
    return SimpleNamespace(
        global_batch=GlobalBatch(config, data_parallel_size=ranks),
        batch_config=config,
        token_budget=budget,
        step_metrics={},
        log_this_step=False,
    )


# n = 4 samples of b_s = 2: tr(Sigma) = 2 * (7 - 4 * 1) / 3 = 2 and ||g||^2 = 1, so the
# noise scale is 2 and the norm test at eta = 0.1 asks for 2 / 0.01 = 200 sequences.
NOISY = SampleSums(n=4, sample_size=2, sum_sq=7.0, g_sq=1.0, dot_sum=4.0, dot_sq_sum=4.75)


def test_test_formulas_by_hand():
    assert required_batch(NOISY, "norm", eta=0.1, theta=1, nu=1) == pytest.approx(200)
    # inner product: 2 * (4.75 - 16 / 4) / 3 = 0.5, over theta^2 ||g||^4 = 0.25: 2
    assert required_batch(NOISY, "inner_product", eta=1, theta=0.5, nu=1) == pytest.approx(2)
    # orthogonal: 2 * (7 - 4.75 / 1) / 3 = 1.5, over nu^2 ||g||^2 = 0.01: 150 > 2
    assert required_batch(NOISY, "augmented_inner_product", eta=1, theta=0.5, nu=0.1) == pytest.approx(150)


def decide(callback: AdaptiveBatchSize, module, sums: SampleSums) -> tuple[float, float]:
    callback._decide(module, sums)
    module.global_batch.apply_pending()
    return callback.last["adaptive_bs/proposed_batch"], callback.last["adaptive_bs/applied_batch"]


def test_growth_is_rounded_up_and_capped_by_the_batch_config():
    module = fake_module(global_batch=8, micro=2, cap=100)
    assert decide(AdaptiveBatchSize(eta=0.1), module, NOISY) == (200, 100)  # 200 > cap 100
    assert module.global_batch.size == 100 and module.log_this_step


def test_growth_is_rounded_to_micro_batch_times_ranks_and_capped_by_the_callback():
    module = fake_module(global_batch=16, micro=4, ranks=2)  # granularity 8
    callback = AdaptiveBatchSize(eta=math_eta(37.5), max_global_batch_size=64)
    assert decide(callback, module, NOISY) == (38, 40)  # ceil(37.5) = 38, rounded up to 40
    callback.eta = math_eta(1000)
    assert decide(callback, module, NOISY) == (64, 64)  # the callback's cap


def math_eta(required: float) -> float:
    """The eta at which NOISY's norm test asks for `required` sequences."""
    return (2 / required) ** 0.5


def test_batch_never_shrinks():
    module = fake_module(global_batch=32, micro=2)
    callback = AdaptiveBatchSize(eta=math_eta(10))
    assert decide(callback, module, NOISY) == (32, 32)
    callback.eta = math_eta(40)
    assert decide(callback, module, NOISY) == (40, 40)
    callback.eta = math_eta(20)
    assert decide(callback, module, NOISY) == (40, 40)
    assert module.global_batch.size == 40


def test_stagewise_warmup_splits_the_token_budget_evenly():
    warmup = StagewiseBatchWarmup(sizes=[16, 32, 64])
    warmup.prepare(fake_module(global_batch=16, micro=8, budget=3000))
    expected = {0: 16, 999: 16, 1000: 32, 1999: 32, 2000: 64, 2500: 64, 9000: 64}
    for tokens, size in expected.items():
        assert warmup.size_at(TrainingClock(tokens=tokens)) == size, tokens


def test_linear_rampup_follows_megatron():
    """16 -> 128 by 16: 7 increments over 4800 samples, one every 685.71 samples."""
    rampup = LinearBatchRampup(start=16, increment=16, ramp_samples=4800)
    rampup.prepare(fake_module(global_batch=128, micro=8))
    expected = {0: 16, 685: 16, 686: 32, 1372: 48, 2742: 64, 2743: 80, 4114: 96, 4799: 112, 4800: 128, 10**6: 128}
    for sequences, size in expected.items():
        assert rampup.size_at(TrainingClock(sequences=sequences)) == size, sequences


def test_constant_batch_and_invalid_schedules():
    assert ConstantBatch(size=48).size_at(TrainingClock(tokens=10**9)) == 48
    with pytest.raises(BatchConfigError, match="multiple of increment"):
        LinearBatchRampup(start=16, increment=24, ramp_samples=100).prepare(fake_module(global_batch=128, micro=8))
    with pytest.raises(BatchConfigError, match="token_budget is null"):
        StagewiseBatchWarmup(sizes=[8, 16]).prepare(fake_module(global_batch=8, micro=8))
    with pytest.raises(ValueError, match="non-empty"):
        StagewiseBatchWarmup(sizes=[])


def test_only_one_callback_may_set_the_batch():
    with pytest.raises(BatchConfigError, match="ConstantBatch, AdaptiveBatchSize"):
        check_single_controller([ConstantBatch(size=8), AdaptiveBatchSize()])


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"test": "variance"}, "test='variance' is unknown"),
        ({"samples": "layers"}, "samples='layers' is unknown"),
        ({"eta": 0}, "eta=0 must be > 0"),
        ({"every_n_steps": 0}, "every_n_steps=0"),
        ({"min_global_batch_size": 64, "max_global_batch_size": 32}, "exceeds"),
    ],
)
def test_adaptive_settings_are_checked(settings, message):
    with pytest.raises(ValueError, match=message):
        AdaptiveBatchSize(**settings)

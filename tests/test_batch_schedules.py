"""Batch-size decisions and baseline schedules against values worked out by hand."""

import math

import pytest

from analysis.runs import load_run
from callbacks.batch_size.adaptive import AdaptiveBatchSize
from callbacks.batch_size.lr_scaling import lr_scaling_for
from callbacks.batch_size.noise_tests import SampleSums, noise_scale, required_batch
from common.errors import ConfigError
from launch.from_config import read_settings
from lightning_modules.clock import TrainingClock
from tests.run_helpers import TINY, compose_config, run_to_completion, run_train, training_state

# n = 4 samples of b_s = 2: tr(Sigma) = 2 * (7 - 4 * 1) / 3 = 2 and ||g||^2 = 1, so the
# noise scale is 2 and the norm test at eta = 0.1 asks for 2 / 0.01 = 200 sequences.
NOISY = SampleSums(n=4, sample_size=2, sum_sq=7.0, g_sq=1.0, dot_sum=4.0, dot_sq_sum=4.75)


def test_test_formulas_by_hand():
    assert required_batch(NOISY, "norm", eta=0.1, theta=1, nu=1) == pytest.approx(200)
    # inner product: 2 * (4.75 - 16 / 4) / 3 = 0.5, over theta^2 ||g||^4 = 0.25: 2
    assert required_batch(NOISY, "inner_product", eta=1, theta=0.5, nu=1) == pytest.approx(2)
    # orthogonal: 2 * (7 - 4.75 / 1) / 3 = 1.5, over nu^2 ||g||^2 = 0.01: 150 > 2
    assert required_batch(NOISY, "augmented_inner_product", eta=1, theta=0.5, nu=0.1) == pytest.approx(150)


def settings_of(name: str, tmp_path, overrides: list[str]):
    """A technique's settings as the config files and these overrides give them."""
    cfg = compose_config(TINY + [f"+technique={name}"] + overrides, tmp_path)
    return read_settings(cfg).techniques[name]


def adaptive(tmp_path, eta: float, cap: int | None = None) -> AdaptiveBatchSize:
    cap_setting = "null" if cap is None else cap
    settings = settings_of(
        "adaptive_batch",
        tmp_path,
        [f"technique.adaptive_batch.eta={eta}", f"technique.adaptive_batch.max_global_batch_size={cap_setting}"],
    )
    return AdaptiveBatchSize(settings, sample_kind="micro_batch", lr_scaling=None)


def decide(callback: AdaptiveBatchSize, state, sums: SampleSums) -> tuple[float, float]:
    """One test whose samples cover the whole global batch, then the next step begins."""
    callback._proposal = 0
    callback._propose(state, sums)
    callback._decide(state)
    state.global_batch.apply_pending()
    return callback.last["adaptive_bs/proposed_batch"], callback.last["adaptive_bs/applied_batch"]


def test_growth_is_rounded_up_and_capped_by_the_batch_config(tmp_path):
    state = training_state(global_batch=8, micro=2, cap=100)
    assert decide(adaptive(tmp_path, eta=0.1), state, NOISY) == (200, 100)  # 200 > cap 100
    assert state.global_batch.size == 100 and state.metrics.forced


def samples_of(global_batch: int) -> SampleSums:
    """NOISY's sums for 4 samples that make up the whole global batch."""
    return SampleSums(n=4, sample_size=global_batch // 4, sum_sq=7.0, g_sq=1.0)


def test_growth_is_rounded_to_micro_batch_times_ranks_and_capped_by_the_technique(tmp_path):
    state, sums = training_state(global_batch=16, micro=4, ranks=2), samples_of(16)  # granularity 8
    callback = adaptive(tmp_path, eta=eta_for(37.5, sums), cap=64)
    assert decide(callback, state, sums) == (38, 40)  # ceil(37.5) = 38, rounded up to 40
    callback.settings.eta = eta_for(1000, sums)
    assert decide(callback, state, sums) == (64, 64)  # the technique's cap


def test_a_replicas_proposal_is_scaled_to_the_global_batch(tmp_path):
    """2 simulated replicas: each turn's samples cover half the global batch of 16, so the
    test's 37.5 for one replica's gradient means 75 over both."""
    state = training_state(global_batch=16, micro=2, replicas=2)
    half = samples_of(8)
    assert decide(adaptive(tmp_path, eta=eta_for(37.5, half)), state, half) == (75, 76)


def eta_for(required: float, sums: SampleSums) -> float:
    """The eta at which the norm test on these sums asks for `required` sequences."""
    return (noise_scale(sums) / required) ** 0.5


def test_batch_never_shrinks(tmp_path):
    state = training_state(global_batch=32, micro=2)
    callback = adaptive(tmp_path, eta=eta_for(10, samples_of(32)))
    assert decide(callback, state, samples_of(32)) == (32, 32)
    callback.settings.eta = eta_for(40, samples_of(32))
    assert decide(callback, state, samples_of(32)) == (40, 40)
    callback.settings.eta = eta_for(20, samples_of(40))
    assert decide(callback, state, samples_of(40)) == (40, 40)
    assert state.global_batch.size == 40


def test_stagewise_warmup_splits_the_token_budget_evenly(tmp_path):
    overrides = [
        "technique.batch_warmup.stage_sizes=[16,32,64]",
        "token_budget=3000",
        "batch.global_batch_size=16",
        "batch.micro_batch_size=8",
        "batch.max_global_batch_size=64",
    ]
    cfg = compose_config(TINY + ["+technique=batch_warmup"] + overrides, tmp_path)
    settings = read_settings(cfg)
    warmup = settings.techniques["batch_warmup"]
    expected = {0: 16, 999: 16, 1000: 32, 1999: 32, 2000: 64, 2500: 64, 9000: 64}
    for tokens, size in expected.items():
        assert warmup.size_at(TrainingClock(tokens=tokens), settings.run) == size, tokens


@pytest.mark.parametrize(("rule", "power"), [("none", 0.0), ("sqrt", 0.5), ("linear", 1.0)])
def test_lr_scaling_follows_the_batch_from_its_starting_size(rule, power):
    scaling = lr_scaling_for(rule, reference=16)
    for size in (16, 32, 48, 128):
        factor = 1.0 if scaling is None else scaling.factor(size)
        assert factor == pytest.approx((size / 16) ** power, rel=1e-15)


def test_a_warmup_run_logs_the_linearly_scaled_learning_rate(tmp_path, tmp_path_factory):
    """Stages 8 -> 16 -> 32 at a constant schedule: the logged LR is the peak times B / 8."""
    overrides = TINY + [
        "+technique=batch_warmup",
        "technique.batch_warmup.stage_sizes=[8,16,32]",
        "technique.batch_warmup.lr_scaling=linear",
        "token_budget=6000",
        "lr_schedule.name=constant",
        "lr_schedule.warmup_steps=0",
        "batch.max_global_batch_size=32",
        "logger=csv",
    ]
    run_to_completion(overrides, tmp_path / "run", tmp_path_factory.getbasetemp() / "cache")
    rows = [row for row in load_run(tmp_path / "run").rows if "train/lr" in row]
    assert {row["train/global_batch_size"] for row in rows} == {8, 16, 32}
    for row in rows:
        assert row["train/lr"] == pytest.approx(4e-3 * row["train/global_batch_size"] / 8, rel=1e-12)
        assert row["train/lr_scale"] == row["train/global_batch_size"] / 8


def test_linear_rampup_follows_megatron(tmp_path):
    """16 -> 128 by 16: 7 increments over 4800 samples, one every 685.71 samples."""
    cfg = compose_config(
        TINY + ["+technique=batch_rampup", "batch.global_batch_size=128", "batch.micro_batch_size=8"], tmp_path
    )
    settings = read_settings(cfg)
    rampup = settings.techniques["batch_rampup"]
    expected = {0: 16, 685: 16, 686: 32, 1372: 48, 2742: 64, 2743: 80, 4114: 96, 4799: 112, 4800: 128, 10**6: 128}
    for sequences, size in expected.items():
        assert rampup.size_at(TrainingClock(sequences=sequences), settings.run) == size, sequences


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["+technique=batch_rampup", "technique.batch_rampup.increment=24", "batch.global_batch_size=128"],
            "multiple of increment",
        ),
        (
            ["+technique=batch_warmup", "token_budget=null", "trainer.max_steps=5", "lr_schedule.name=constant"],
            "token_budget is null",
        ),
        (["+technique=batch_warmup", "technique.batch_warmup.stage_sizes=[]"], "non-empty"),
        (["+technique=batch_warmup", "batch.max_global_batch_size=64"], "stage_sizes[3]=128 is not a multiple"),
        (
            ["+technique=constant_batch", "technique.constant_batch.size=9"],
            "size=9 is not a multiple of micro_batch x ranks = 2",
        ),
        (
            ["+technique=[constant_batch,adaptive_batch]"],
            "technique.constant_batch and technique.adaptive_batch both do",
        ),
        (["+technique=adaptive_batch", "technique.adaptive_batch.test=variance"], "test='variance' is unknown"),
        (["+technique=adaptive_batch", "technique.adaptive_batch.samples=layers"], "samples='layers' is unknown"),
        (["+technique=adaptive_batch", "technique.adaptive_batch.eta=0"], "eta=0.0 must be > 0"),
        (["+technique=adaptive_batch", "technique.adaptive_batch.every_n_steps=0"], "every_n_steps=0"),
        (
            [
                "+technique=adaptive_batch",
                "technique.adaptive_batch.min_global_batch_size=64",
                "technique.adaptive_batch.max_global_batch_size=32",
            ],
            "exceeds",
        ),
        (["+technique=adaptive_batch", "technique.adaptive_batch.samples=rank"], "samples=rank needs strategy=ddp"),
        (["+technique=adaptive_batch", "batch.global_batch_size=2"], "needs >= 2 samples"),
        (
            ["+technique=adaptive_batch", "technique.adaptive_batch.min_global_batch_size=9"],
            "min_global_batch_size=9 must be a multiple",
        ),
        (
            ["+technique=adaptive_batch", "technique.adaptive_batch.eta=abc"],
            "technique.adaptive_batch.eta='abc' must be a number",
        ),
        (["+technique=batch_warmup", "technique.batch_warmup.lr_scaling=cubic"], "lr_scaling='cubic' is unknown"),
    ],
)
def test_impossible_settings_are_config_errors_naming_the_key(overrides, message, tmp_path):
    with pytest.raises(ConfigError) as error:
        read_settings(compose_config(TINY + overrides, tmp_path))
    assert message in str(error.value)


def seesaw_settings(tmp_path, *overrides):
    cfg = compose_config(
        TINY
        + [
            "+technique=seesaw",
            "lr_schedule.warmup_steps=0",
            "token_budget=1000",
            "batch.max_global_batch_size=64",
            *overrides,
        ],
        tmp_path,
    )
    settings = read_settings(cfg)
    return settings.techniques["seesaw"], settings.run


def test_seesaw_trades_each_lr_cut_for_a_batch_increase(tmp_path):
    """Meterez et al.'s rule against the run's cosine (to 0.1) written out: after k halvings of
    the scheduled rate, batch 8 x 2^k and LR x 2^(-k/2); beyond the cap (64 = 8 x 2^3) the LR
    takes the cuts in full."""
    seesaw, run = seesaw_settings(tmp_path)
    seen = set()
    for tokens in range(0, 1001, 5):
        reference = 0.1 + 0.9 * (1 + math.cos(math.pi * tokens / 1000)) / 2
        k = 0
        while reference < 2.0 ** -(k + 1) - 1e-12:
            k += 1
        batch_cuts = min(k, 3)
        assert seesaw.size_at(TrainingClock(tokens=tokens), run) == 8 * 2**batch_cuts, tokens
        assert seesaw.lr_factor(tokens, run) == pytest.approx(2.0 ** (-batch_cuts / 2 - (k - batch_cuts))), tokens
        seen.add(k)
    assert seen == {0, 1, 2, 3}  # cosine to 0.1 halves the rate three times


def test_seesaw_settings_are_checked_and_a_constant_schedule_has_no_cuts(tmp_path):
    with pytest.raises(ConfigError, match="factor=1.0 must be > 1"):
        seesaw_settings(tmp_path, "technique.seesaw.factor=1")
    with pytest.raises(ConfigError, match=r"start x factor\^3=27 is not a multiple of micro_batch x ranks = 2"):
        seesaw_settings(tmp_path, "technique.seesaw.factor=1.5")
    seesaw, run = seesaw_settings(tmp_path, "lr_schedule.name=constant")
    assert {seesaw.size_at(TrainingClock(tokens=t), run) for t in range(0, 1001, 50)} == {8}


def test_a_seesaw_run_logs_the_rule_and_resumes_exactly(tmp_path, tmp_path_factory):
    cache = tmp_path_factory.getbasetemp() / "cache"
    overrides = TINY + [
        "+technique=seesaw",
        "lr_schedule.warmup_steps=0",
        "token_budget=6000",
        "batch.max_global_batch_size=32",
        "logger=csv",
        "callbacks.model_checkpoint.every_n_train_steps=5",
    ]
    run_to_completion(overrides, tmp_path / "full", cache)
    rows = [row for row in load_run(tmp_path / "full").rows if "train/lr" in row]
    assert {row["train/global_batch_size"] for row in rows} == {8, 16, 32}
    for row in rows:  # the rule at the tokens seen when the step started (32 tokens a row)
        start = row["train/tokens_seen"] - 32 * row["train/global_batch_size"]
        reference = 0.1 + 0.9 * (1 + math.cos(math.pi * start / 6000)) / 2
        k = math.floor(math.log2(1 / reference) + 1e-9)
        assert row["train/global_batch_size"] == 8 * 2 ** min(k, 2)
        assert row["train/lr"] == pytest.approx(4e-3 * 2.0 ** (-min(k, 2) / 2 - max(k - 2, 0)), rel=1e-12)
    resumed = run_train(
        overrides + [f"ckpt_path={tmp_path / 'full/checkpoints/step000005.ckpt'}"], tmp_path / "resumed", cache
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    again = [row for row in load_run(tmp_path / "resumed").rows if "train/lr" in row]
    assert [(r["step"], r["train/lr"], r["train/global_batch_size"], r["train/loss"]) for r in again] == [
        (r["step"], r["train/lr"], r["train/global_batch_size"], r["train/loss"]) for r in rows if r["step"] > 5
    ]

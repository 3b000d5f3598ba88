"""train.py as a user runs it: bad configs fail fast and clearly; W&B works offline."""

import csv

import pytest
import torch
from omegaconf import OmegaConf

from common.errors import ConfigError
from launch.builders import build_module
from launch.from_config import read_settings, wandb_identity, wandb_tags
from tests.run_helpers import REPO, TINY, compose_config, export_matches_checkpoint, run_train


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["batch.global_batch_size=31"],
            "batch.micro_batch_size=2 does not divide each rank's share of the global batch (31",
        ),
        (["+model.n_experts=8"], "unknown key(s) model.n_experts"),
        (["optimizer.lr=-1"], "optimizer.lr=-1"),
        (["lr_schedule.name=step"], "lr_schedule.name='step' is unknown"),
        (["trainer.devices=2", "trainer.accelerator=cpu"], "need a distributed strategy: add strategy=ddp"),
        (["strategy=fsdp", "trainer.accelerator=cpu"], "strategy=fsdp (FSDP1) needs GPUs"),
        (["token_budget=null", "trainer.max_steps=-1"], "set token_budget or trainer.max_steps"),
        (["model.n_heads=3"], "n_heads"),
        (
            ["strategy=fsdp2", "strategy.tensor_parallel_size=two"],
            "strategy.tensor_parallel_size='two' must be an integer >= 1",
        ),
        (
            ["strategy=fsdp2", "strategy.pipeline_parallel_size=0"],
            "strategy.pipeline_parallel_size=0 must be an integer >= 1",
        ),
        (
            ["strategy=fsdp2", "trainer.devices=2", "strategy.data_parallel_size=3"],
            "strategy.data_parallel_size=3 x strategy.tensor_parallel_size=1 must equal the 2 processes",
        ),
    ],
)
def test_bad_config_is_rejected_with_a_message_naming_the_key(overrides, message, tmp_path):
    with pytest.raises(ConfigError) as error:
        read_settings(compose_config(TINY + overrides, tmp_path))
    assert message in str(error.value)


def test_bad_config_exits_before_any_work(tmp_path):
    result = run_train(TINY + ["batch.global_batch_size=31"], tmp_path / "run", tmp_path / "cache", timeout=120)
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    assert result.stderr.startswith("error: batch.micro_batch_size=2 does not divide")
    assert not (tmp_path / "cache").exists(), "config errors must be raised before tokenizing"
    assert not (tmp_path / "run").exists(), "a failed run leaves no folder"


def test_mistakes_found_as_the_run_starts_leave_no_run_folder(tmp_path):
    """A mistyped callback class and a sharded checkpoint folder under a single-device run are
    found by the sections' service checks: one line, exit 2, before the default logger starts."""
    shards = tmp_path / "last.ckpt"
    shards.mkdir()
    cases = {
        "typo": (
            ["callbacks.throughput._target_=callbacks.infrastructure.throughput.Throughputt"],
            "callbacks.throughput._target_='callbacks.infrastructure.throughput.Throughputt' is not a class that exists",
        ),
        "shards": (
            [f"ckpt_path={shards}"],
            "is a distributed checkpoint (a folder of shards), which strategy=single_device cannot read",
        ),
    }
    for name, (overrides, message) in cases.items():
        result = run_train(TINY + overrides, tmp_path / name, tmp_path / "cache", timeout=120)
        assert result.returncode == 2, result.stderr[-2000:]
        assert result.stderr.startswith("error: ") and message in result.stderr, result.stderr[-2000:]
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr[-2000:]
        assert not (tmp_path / name).exists(), "a failed run leaves no folder"


def test_end_to_end_run_writes_an_offline_wandb_run_and_consistent_mfu(tmp_path):
    run_dir, peak = tmp_path / "run", 1e11
    overrides = [
        "logger=[wandb,csv]",
        "trainer.max_steps=6",
        "+experiment=baseline",
        "trainer.log_every_n_steps=2",
        f"callbacks.throughput.peak_flops_per_device={peak}",
        "callbacks.throughput.warmup_steps=1",
    ]
    result = run_train(TINY + overrides, run_dir, tmp_path / "cache")
    assert result.returncode == 0, result.stderr[-3000:]
    runs = list((run_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, list(run_dir.rglob("*"))[:20]
    assert list(runs[0].glob("*.wandb")), "the offline run holds no W&B data file"
    assert (run_dir / "checkpoints" / "last.ckpt").exists()

    output = result.stdout + result.stderr
    for noise in ("litlogger", "weights_only", "LeafSpec", "anonymous setting", "v_num"):
        assert noise not in output, noise
    assert output.count("GPU available") == 1  # every log line once, not again through a second handler
    assert "1.54k/1.54k tokens" in output  # 6 steps of 256 tokens: the bar ends at max_steps, not the budget

    with open(run_dir / "csv" / "metrics.csv") as file:
        rows = [row for row in csv.DictReader(file) if row.get("perf/mfu")]
    assert len(rows) >= 3
    for row in rows:  # MFU = tokens/s per device x FLOPs per token / peak, from the logged numbers
        expected = float(row["perf/tokens_per_sec_per_device"]) * float(row["perf/model_flops_per_token"]) / peak
        assert float(row["perf/mfu"]) == pytest.approx(expected, rel=1e-6)


def test_trained_checkpoint_exports_to_hf_and_seeds_a_new_run(tmp_path):
    """train -> scripts/export_hf.py -> transformers loads it with our logits -> init_from_hf."""
    pytest.importorskip("transformers")
    run_dir, export_dir = tmp_path / "run", tmp_path / "hf"
    result = run_train(TINY + ["logger=none", "trainer.max_steps=2"], run_dir, tmp_path / "cache")
    assert result.returncode == 0, result.stderr[-3000:]
    _, state_dict = export_matches_checkpoint(run_dir / "checkpoints" / "last.ckpt", export_dir)

    cfg = compose_config(TINY + [f"init_from_hf={export_dir}"], tmp_path / "seeded")
    module = build_module(read_settings(cfg, processes=1), vocab_size=257)
    module.configure_model()
    for name, value in module.model.state_dict().items():
        assert torch.equal(value, state_dict[name]), name


def test_wandb_tags_name_the_experiment_model_and_techniques(tmp_path):
    cfg = compose_config(["+experiment=adaptive_bs", "model=diloco_35m"], tmp_path)
    assert wandb_tags(cfg) == ["adaptive_bs", "model:diloco_35m", "strategy:single_device", "technique:adaptive_batch"]


def test_wandb_groups_a_study_and_takes_the_arm_as_job_type(tmp_path):
    """In a multirun the sweep is the W&B group and the arm (or the overrides less the seed)
    the job type, so the seeds of one arm show together."""
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig

    from tests.run_helpers import REPO

    def identity(overrides: list[str]) -> dict[str, str]:
        with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
            cfg = compose("train", overrides=overrides, return_hydra_config=True)
        cfg.hydra.mode, cfg.hydra.job.num = "MULTIRUN", 3
        cfg.hydra.sweep.dir, cfg.hydra.overrides.task = str(tmp_path / "2026-01-01_00-00-00"), overrides
        HydraConfig.instance().set_config(cfg)
        try:
            return wandb_identity(cfg)
        finally:
            HydraConfig.instance().cfg = None

    study = identity(["+sweep=batch_schedules", "batch.global_batch_size=64", "study.arm=constant_64", "seed=2"])
    assert study["group"] == "study_batch_schedules/2026-01-01_00-00-00" and study["job_type"] == "constant_64"
    plain = identity(["optimizer.lr=1e-3", "seed=2"])
    assert plain["job_type"] == "optimizer.lr=1e-3" and plain["group"] == "default/2026-01-01_00-00-00"


def test_a_preset_that_trades_loss_for_steps_says_so_as_it_starts(tmp_path):
    """Its note is the first line the run itself prints (``experiment_note``)."""
    result = run_train(
        [*TINY, "+experiment=bs_warmup", "batch.global_batch_size=16", "trainer.max_steps=1", "logger=csv"],
        tmp_path / "run",
        tmp_path / "cache",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    note = OmegaConf.load(REPO / "conf" / "experiment" / "bs_warmup.yaml").experiment_note
    ours = [
        line for line in (result.stdout + result.stderr).splitlines() if "][launch." in line or "][callbacks." in line
    ]
    assert ours[0].endswith(f"[INFO] - bs_warmup: {note}"), ours[:3]

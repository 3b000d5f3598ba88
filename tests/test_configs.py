"""Every config choice composes and passes the checks; the SLURM launcher config composes."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from launch.from_config import read_settings
from tests.run_helpers import REPO, compose_config


def choices(group: str) -> list[str]:
    return sorted(path.stem for path in (REPO / "conf" / group).glob("*.yaml"))


@pytest.mark.parametrize(
    "override",
    [f"model={name}" for name in choices("model")]
    + [f"+experiment={name}" for name in choices("experiment")]
    + [f"+technique={name}" for name in choices("technique")]
    + [f"logger={name}" for name in choices("logger")]
    + [f"callbacks={name}" for name in choices("callbacks")]
    + ["trainer=gpu", "strategy=ddp", "strategy=fsdp2"],
)
def test_choice_composes_and_passes_checks(override: str, tmp_path: Path):
    read_settings(compose_config([override], tmp_path))


def test_slurm_launcher_composes():
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=["hydra/launcher=slurm", "trainer.devices=8"], return_hydra_config=True)
    assert cfg.hydra.launcher._target_.endswith("SlurmLauncher")
    assert cfg.hydra.launcher.tasks_per_node == 8


def test_two_techniques_compose_into_one_run(tmp_path: Path):
    """The README's combination: each technique file adds its node, experiments compose them alike."""
    cfg = compose_config(["+technique=[seq_len_warmup,adaptive_batch]", "batch.max_micro_batch_size=4"], tmp_path)
    settings = read_settings(cfg)
    assert list(settings.techniques) == ["seq_len_warmup", "adaptive_batch"]
    combined = read_settings(compose_config(["+experiment=combined"], tmp_path)).techniques
    assert list(combined) == ["seq_len_warmup", "adaptive_batch", "diloco"]

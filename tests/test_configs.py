"""Every config choice composes and passes the checks; the SLURM launcher config composes."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from launch.config_checks import check_config
from tests.run_helpers import REPO, compose_config


def choices(group: str) -> list[str]:
    return sorted(path.stem for path in (REPO / "conf" / group).glob("*.yaml"))


@pytest.mark.parametrize(
    "override",
    [f"model={name}" for name in choices("model")]
    + [f"+experiment={name}" for name in choices("experiment")]
    + [f"logger={name}" for name in choices("logger")]
    + [f"callbacks={name}" for name in choices("callbacks")]
    + ["trainer=gpu", "strategy=ddp", "strategy=fsdp2"],
)
def test_choice_composes_and_passes_checks(override: str, tmp_path: Path):
    check_config(compose_config([override], tmp_path))


def test_slurm_launcher_composes():
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=["hydra/launcher=slurm", "trainer.devices=8"], return_hydra_config=True)
    assert cfg.hydra.launcher._target_.endswith("SlurmLauncher")
    assert cfg.hydra.launcher.tasks_per_node == 8

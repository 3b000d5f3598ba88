"""Sweep presets in conf/sweep/: every job of every preset composes and passes the config checks.

Hydra refuses `python train.py -m +sweep=NAME --cfg job` ("Only one of --run, --multirun,
--cfg ... can be specified"), so the jobs are composed here the way the sweeper makes
them: the preset's `hydra.sweeper.params` expanded into one override list per job.
"""

import itertools
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import IntervalSweep, Override
from omegaconf import DictConfig, OmegaConf

from launch.from_config import read_settings
from lightning_modules.llama_settings import default_mlp_hidden
from study.coordinate_search import first_design
from study.jobs import study_jobs
from study.preset import StudySpec
from study.search_space import SearchSpace, format_value
from tests.run_helpers import REPO, TINY, run_train

PRESETS = sorted(path.stem for path in (REPO / "conf" / "sweep").glob("*.yaml"))
PARSER = OverridesParser.create()


def compose_train(overrides: list[str]) -> DictConfig:
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return compose("train", overrides=overrides, return_hydra_config=True)


def job_values(override: Override) -> list[str]:
    """The values a sweeper would try: every choice or range value; an interval's two ends."""
    if isinstance(override.value(), IntervalSweep):
        return [str(override.value().start), str(override.value().end)]
    return (
        list(override.sweep_string_iterator())
        if override.is_sweep_override()
        else [override.get_value_element_as_str()]
    )


def jobs(params: dict[str, str]) -> list[list[str]]:
    """One override list per job: the cross product of every parameter's values."""
    parsed = PARSER.parse_overrides([f"{key}={value}" for key, value in params.items()])
    axes = [[f"{o.get_key_element()}={value}" for value in job_values(o)] for o in parsed]
    return [list(job) for job in itertools.product(*axes)]


def assert_applied(cfg: DictConfig, job: list[str]) -> None:
    """Each override of the job is in the composed config: a group as the chosen option, a value as set."""
    for override in PARSER.parse_overrides(job):
        key = override.key_or_group
        if key in cfg.hydra.runtime.choices:
            assert cfg.hydra.runtime.choices[key] == override.value(), override.input_line
        else:
            assert OmegaConf.select(cfg, key) == override.value(), override.input_line


def preset_jobs(preset: str) -> list[list[str]]:
    """The jobs of a preset: its swept parameters and, for a study, crossed with arms and seeds."""
    cfg = compose_train([f"+sweep={preset}"])
    params = OmegaConf.to_container(cfg.hydra.sweeper.params) if cfg.hydra.sweeper.params else {}
    base = jobs(params) if params else [[]]
    if "study" not in cfg:
        assert params, f"conf/sweep/{preset}.yaml sets neither hydra.sweeper.params nor a study"
        return base
    assert cfg.hydra.sweeper._target_.endswith("StudySweeper")
    spec = StudySpec.from_config(OmegaConf.to_container(cfg.study))
    if spec.tuned:
        return [
            [*spec.arms[arm], *spec.spaces[arm].overrides(point), f"study.arm={arm}"]
            for arm in spec.arms
            for point in [*searched_points(spec.spaces[arm]), *spec.searches[arm].anchors]
        ]
    return study_jobs(spec, base)


def searched_points(space: SearchSpace) -> list[tuple[int, ...]]:
    """A tuned arm's first design, and its centre with each range at each of its hard limits
    (the anchors are added beside them)."""
    points, centre = first_design(space), space.centre()
    for axis, dimension in enumerate(space.dimensions):
        for limit in (getattr(dimension, "min", None), getattr(dimension, "max", None)):
            if limit is not None:
                points.append((*centre[:axis], dimension.index_of(format_value(limit)), *centre[axis + 1 :]))
    return points


@pytest.mark.parametrize("preset", PRESETS)
def test_every_job_of_the_preset_composes_and_passes_the_config_checks(preset: str) -> None:
    for job in preset_jobs(preset):
        cfg = compose_train([f"+sweep={preset}", *job])
        assert_applied(cfg, job)
        read_settings(cfg)
        # A recipe's note ("expect a higher val/loss ...") is about its own run: a job prints
        # one only when its arm names an experiment.
        assert cfg.get("experiment_note") is None or any(o.startswith("+experiment=") for o in job), job


def test_presets_cover_the_research_questions() -> None:
    assert {
        "batch_schedules",
        "seqlen_lr",
        "diloco_recipe",
        "layout",
        "model_ladder",
        "tiny_ladder",
        "optuna_lr",
    } <= set(PRESETS)
    optuna = compose_train(["+sweep=optuna_lr"])
    assert optuna.hydra.sweeper._target_.endswith("StudySweeper") and optuna.study.searcher == "gp"


def sweep_jobs(tmp_path: Path, cache: Path, overrides: list[str]) -> list[dict]:
    """Run `python train.py -m` with tiny settings; each job's resolved config, in job order."""
    sweep = tmp_path / "sweep"
    # hydra.mode=MULTIRUN is `-m` as an override: run_train puts its own overrides first.
    result = run_train(
        [
            "hydra.mode=MULTIRUN",
            f"hydra.sweep.dir={sweep}",
            *overrides,
            "trainer.max_steps=2",
            "token_budget=null",
            "lr_schedule.name=constant",
        ],
        tmp_path / "unused",
        cache,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = sorted((path for path in sweep.iterdir() if path.name.isdigit()), key=lambda path: int(path.name))
    return [yaml.safe_load((job / "csv" / "hparams.yaml").read_text()) for job in jobs]


def test_seqlen_lr_runs_and_a_command_line_value_replaces_the_presets_list(tmp_path: Path, tmp_path_factory) -> None:
    """`+sweep=seqlen_lr optimizer.lr=4e-3 'study.seeds=[1]'`: both arms, at that LR and seed only (2 jobs, not 30)."""
    overrides = [
        "+sweep=seqlen_lr",
        *TINY,
        "batch.global_batch_size=8",
        "batch.micro_batch_size=2",
        "optimizer.lr=4e-3",
        "study.seeds=[1]",
    ]
    configs = sweep_jobs(tmp_path, tmp_path_factory.getbasetemp() / "cache", overrides)
    assert [config["optimizer"]["lr"] for config in configs] == [4e-3, 4e-3]
    assert [config["study"]["arm"] for config in configs] == ["baseline", "seqlen_warmup"]
    assert ["seq_len_warmup" in config.get("technique", {}) for config in configs] == [False, True]
    assert {config["experiment_name"] for config in configs} == {"study_seqlen_lr"}


def test_a_preset_with_the_slurm_launcher_composes() -> None:
    cfg = compose_train(
        [
            "+sweep=model_ladder",
            "hydra/launcher=slurm",
            "hydra.launcher.partition=gpu",
            "trainer=gpu",
            "trainer.devices=8",
            "strategy=fsdp2",
        ]
    )
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("SlurmLauncher") and launcher.partition == "gpu"
    assert (launcher.gpus_per_node, launcher.tasks_per_node, launcher.nodes) == (8, 8, 1)
    assert cfg.hydra.sweeper.params.model.startswith("diloco_35m,")


def test_tiny_ladder_runs_end_to_end_on_cpu(tmp_path: Path, tmp_path_factory) -> None:
    """Two widths of the CPU ladder through `train.py -m +sweep=tiny_ladder`; the preset picks the logger."""
    tiny = [o for o in TINY if not o.startswith(("model.d_model=", "model.mlp_hidden="))]
    overrides = ["+sweep=tiny_ladder", *tiny, "model.d_model=32,64", "optimizer.lr=4e-3"]
    configs = sweep_jobs(tmp_path, tmp_path_factory.getbasetemp() / "cache", overrides)
    assert [config["model"]["d_model"] for config in configs] == [32, 64]
    # The preset's mlp_hidden: null gives Llama's rule at each width.
    assert [config["model"]["mlp_hidden"] for config in configs] == [default_mlp_hidden(32), default_mlp_hidden(64)]

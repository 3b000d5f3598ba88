"""The composed Hydra config read once, into the run's typed settings tree.

This is the one module that reads the composed ``DictConfig`` (besides the entry points that
compose it and the study sweeper's Hydra adapter): every section becomes its typed class
(``settings/typed.py`` checks keys and types), the nodes that name a class to instantiate
(data module, trainer, strategy, loggers, callbacks) are kept as plain resolved values, and
``launch/run_settings.py`` assembles and checks the tree. Everything here is cheap and
imports neither Lightning nor the data libraries.

It also derives, from the whole config, what the sections cannot see alone: the settings
that jobs training one model together must share (``shared_settings``), and how a multirun
names its runs in W&B.
"""

import dataclasses
import typing
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import InterpolationResolutionError

from callbacks.technique import TechniqueSettings
from data.settings import DataSettings
from launch.run_settings import RunSettings, assemble
from lightning_modules.global_batch import BatchSettings
from lightning_modules.layout_settings import LayoutSettings
from lightning_modules.llama_settings import LlamaSettings
from lightning_modules.lr_schedule import LRScheduleSettings
from lightning_modules.optimizers.settings import OptimizerSettings
from settings.callbacks import CallbackSettings
from settings.job import JobSettings
from settings.loggers import LoggerSettings
from settings.strategy import StrategySettings
from settings.trainer import TrainerSettings
from settings.typed import class_named, coerce, settings_from_config

WANDB_JOB_TYPE_LENGTH = 64  # W&B refuses longer job types


def read_settings(cfg: DictConfig, processes: int | None = None) -> RunSettings:
    """The run's settings from its composed config, checked; ``processes`` overrides the count
    the config states (``trainer.devices`` x ``trainer.num_nodes``). The config is resolved
    once; every section reads its node of that tree."""
    tree = _hyperparameters(cfg)
    return assemble(
        processes=processes,
        job=_job(tree),
        model=settings_from_config(LlamaSettings, tree["model"], "model"),
        batch=settings_from_config(BatchSettings, tree["batch"], "batch"),
        lr_schedule=settings_from_config(LRScheduleSettings, tree["lr_schedule"], "lr_schedule"),
        layout=settings_from_config(LayoutSettings, tree["layout"], "layout"),
        techniques=_techniques(tree),
        optimizer=_optimizer(tree),
        data=DataSettings(spec=tree["data"]),
        strategy=StrategySettings.from_spec(tree["strategy"]),
        trainer=TrainerSettings.from_spec(tree["trainer"]),
        logger=LoggerSettings(
            specs=tree.get("logger") or {},
            identity=wandb_identity(cfg),
            tags=wandb_tags(cfg),
            hyperparameters=tree,
        ),
        callbacks=CallbackSettings(
            specs=tree.get("callbacks") or {},
            evaluation=_instantiable(tree, "evaluation"),
            samples=_instantiable(tree, "samples"),
        ),
        shared_settings=shared_settings(cfg, tree),
    )


def config_file(path: Path) -> dict[str, Any]:
    """A YAML file of ``conf/`` (or a run's saved ``.hydra/config.yaml``) as plain values, read
    as Hydra reads it (YAML 1.2 numbers such as ``1e-3``, interpolations resolved as ``plain``)."""
    return plain(OmegaConf.load(path))


def plain(node: Any) -> Any:
    """A config node as plain Python values, interpolations resolved. Outside a Hydra run (a
    config composed by a test or a documented command, a run's saved config read back) the
    values only Hydra's runtime resolves (``${hydra:runtime.output_dir}``) stay as written."""
    if not isinstance(node, (DictConfig, ListConfig)):
        return node
    try:
        return OmegaConf.to_container(node, resolve=True)
    except InterpolationResolutionError:
        if HydraConfig.initialized():
            raise
        return _resolved_where_possible(node)


def _resolved_where_possible(node: DictConfig | ListConfig) -> Any:
    keys = node.keys() if isinstance(node, DictConfig) else range(len(node))
    values = {}
    for key in keys:
        try:
            child = node[key]
        except InterpolationResolutionError:
            child = OmegaConf.to_container(node, resolve=False)[key]
        values[key] = _resolved_where_possible(child) if isinstance(child, (DictConfig, ListConfig)) else child
    return values if isinstance(node, DictConfig) else list(values.values())


def _hyperparameters(cfg: DictConfig) -> dict[str, Any]:
    """The config the loggers record: every key but Hydra's own (a composed config may hold it)."""
    return plain(OmegaConf.masked_copy(cfg, [key for key in cfg if key != "hydra"]))


def _job(tree: dict[str, Any]) -> JobSettings:
    hints = typing.get_type_hints(JobSettings)
    fields = [field.name for field in dataclasses.fields(JobSettings)]
    return JobSettings(**{name: coerce(tree.get(name), hints[name], name) for name in fields})


def _techniques(tree: dict[str, Any]) -> dict[str, TechniqueSettings]:
    """Each ``technique.NAME`` node as the settings class its ``_target_`` names."""
    techniques = {}
    for name, node in (tree.get("technique") or {}).items():
        key = f"technique.{name}"
        cls = class_named(
            _target(node),
            f"{key}._target_",
            TechniqueSettings,
            "a TechniqueSettings class",
            "technique configs come from conf/technique/ (e.g. +technique=adaptive_batch)",
        )
        techniques[name] = settings_from_config(cls, node, key)
    return techniques


def _optimizer(tree: dict[str, Any]) -> OptimizerSettings:
    """The ``optimizer`` node as the settings class its ``_target_`` names (``conf/optimizer/``)."""
    cls = class_named(
        _target(tree["optimizer"]),
        "optimizer._target_",
        OptimizerSettings,
        "a OptimizerSettings class",
        "choose one from conf/optimizer/ (e.g. optimizer=muon)",
    )
    return settings_from_config(cls, tree["optimizer"], "optimizer")


def _target(node: Any) -> Any:
    return node.get("_target_") if isinstance(node, dict) else None


def _instantiable(tree: dict[str, Any], key: str) -> dict[str, Any] | None:
    """A node that names a class to build, or None where its choice (``none``) names none."""
    node = tree.get(key) or {}
    return node if node.get("_target_") else None


# ---------------------------------------------------------------- shared settings
# Fault-tolerant DiLoCo runs each replica group as a job of its own, started with its own
# command; a group started with another seed, learning rate or corpus would train a different
# model and average it in silently. The groups therefore compare what every one of them
# trains with: each key of the resolved config (``model.d_model``, ``optimizer.lr``, ``seed``,
# ...) with its value, less the keys that differ between groups by design (which group it is,
# where it writes, the lighthouse it asks, how it logs) and plus the tokens' own fingerprint,
# which the data module adds (``data.tokens``, a digest of the token ids): the same path can
# hold other files, and identical copies of a corpus sit at other paths on other hosts, so
# the data's locations (``DATA_LOCATIONS``) are not compared, their content is. Settings left
# at ``auto`` are compared as each job resolves them (the DiLoCo callback adds them).
# A run may name more per-job keys in ``technique.diloco.torchft.per_group_keys`` (e.g. a
# callback of its own that writes to each group's folder); they must not change training.

#: Keys (and the subtrees under them) that may differ between the jobs of one run.
PER_JOB = (
    "technique.diloco.torchft.group",
    "technique.diloco.torchft.lighthouse",
    "technique.diloco.torchft.host",
    "paths",
    "data.cache_dir",
    "trainer.default_root_dir",
    "callbacks.model_checkpoint.dirpath",
    "callbacks.progress_bar",
    "logger",
    "experiment_name",
    "experiment_note",
    "ckpt_path",
    "hydra",
)
#: Where a run names keys of its own that may differ between its jobs.
MORE_PER_JOB = "technique.diloco.torchft.per_group_keys"
#: Where the data are, which may differ between hosts: the jobs compare the tokens' content
#: instead (``data/content_digest.py``). Key suffixes under ``data.`` (a mixture's sources too).
DATA_LOCATIONS = (".source.paths", ".source.val_paths", "data.tokenizer.path")


def shared_settings(cfg: DictConfig, resolved: dict[str, Any] | None = None) -> tuple[tuple[str, str], ...]:
    """Every leaf of ``cfg`` but the per-job ones, as (dotted key, value's repr), sorted; a
    value that cannot be resolved here (a Hydra runtime path outside a run) as written.
    ``resolved``: ``cfg`` as plain values already (``_hyperparameters``)."""
    per_job = (*PER_JOB, *(OmegaConf.select(cfg, MORE_PER_JOB, default=None) or ()))
    leaves: dict[str, str] = {}
    _flatten(resolved if resolved is not None else _hyperparameters(cfg), "", leaves, per_job)
    return tuple(sorted(leaves.items()))


def _per_job(key: str, per_job: tuple[str, ...]) -> bool:
    located = key.startswith("data.") and key.endswith(DATA_LOCATIONS)
    return located or any(key == prefix or key.startswith(f"{prefix}.") for prefix in per_job)


def _flatten(node: Any, prefix: str, leaves: dict[str, str], per_job: tuple[str, ...]) -> None:
    if isinstance(node, dict):
        for key, child in node.items():
            path = f"{prefix}{key}"
            if not _per_job(path, per_job):
                _flatten(child, f"{path}.", leaves, per_job)
        return
    leaves[prefix.rstrip(".")] = repr(node)


# ---------------------------------------------------------------- W&B identity
def wandb_identity(cfg: DictConfig) -> dict[str, str]:
    """Group, job type and name of a run's W&B run.

    A multirun (a study, any sweep) is one group, and its arms are job types: a study's
    ``study.arm``, or else the job's overrides less the seed, so the W&B UI shows the seeds
    of one arm together. A single run is grouped by its experiment.
    """
    if not (HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN):
        return {"group": cfg.experiment_name, "name": cfg.experiment_name, "job_type": "train"}
    hydra = HydraConfig.get()
    task = [o for o in hydra.overrides.task if not o.startswith(("seed=", "study.arm="))]
    arm = OmegaConf.select(cfg, "study.arm") or " ".join(task) or "defaults"
    return {
        "group": f"{cfg.experiment_name}/{Path(hydra.sweep.dir).name}",
        "name": f"{hydra.job.num}:{hydra.job.override_dirname or 'defaults'}",
        "job_type": str(arm)[:WANDB_JOB_TYPE_LENGTH],
    }


def wandb_tags(cfg: DictConfig) -> list[str]:
    """Tags to filter runs by in the W&B UI: experiment, model, strategy, the techniques on, sweep or not."""
    strategy = HydraConfig.get().runtime.choices.get("strategy") if HydraConfig.initialized() else None
    tags = [cfg.experiment_name, f"model:{cfg.model.get('name', 'custom')}", f"strategy:{strategy or 'single_device'}"]
    tags += [f"technique:{name}" for name in (cfg.get("technique") or {})]
    if HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN:
        tags.append("sweep")
    return tags

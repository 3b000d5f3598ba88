"""The composed config as typed, checked settings: the fail-fast phase of every run.

Everything here is cheap and imports neither Lightning nor the data libraries: it runs
before any data is tokenized, any process is launched or anything is written. Each error
names the config key and how to fix it. ``check_config`` runs once with the process count
the config states, and again once the Trainer has counted them (``devices: auto``).
"""

import dataclasses
import importlib
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from callbacks.technique import RunContext, TechniqueSettings
from data.config_checks import check_seq_len
from common.errors import ConfigError
from launch.shared_settings import shared_settings
from launch.typed_settings import coerce, plain, settings_from_config
from common.data_groups import DataGroups
from lightning_modules.global_batch import BatchConfig, micro_batch_size_for
from lightning_modules.llama import LlamaConfig
from lightning_modules.lr_schedule import LRScheduleConfig
from lightning_modules.optimizers.settings import OptimizerSettings
from lightning_modules.float8 import check_float8_settings
from lightning_modules.parallelism import LayoutConfig

STRATEGY_BY_CLASS = {
    "DDPStrategy": "ddp",
    "FSDPStrategy": "fsdp",
    "ModelParallelStrategy": "fsdp2",
}
TOP_LEVEL_TYPES = {"seed": int, "token_budget": int | None, "ckpt_path": str | None, "init_from_hf": str | None}


@dataclasses.dataclass
class RunSettings:
    """The typed settings a run is built from."""

    model: LlamaConfig
    optimizer: OptimizerSettings
    lr_schedule: LRScheduleConfig
    batch: BatchConfig
    layout: LayoutConfig
    techniques: dict[str, TechniqueSettings]
    run: RunContext
    token_budget: int | None


def world_size(trainer: DictConfig) -> int | None:
    """Processes the run will use, when the config states it as numbers."""
    devices, nodes = trainer.get("devices"), trainer.get("num_nodes", 1)
    if isinstance(nodes, int) and isinstance(devices, int) and devices > 0:
        return devices * nodes
    if isinstance(nodes, int) and isinstance(devices, (list, tuple)):
        return len(devices) * nodes
    return None


def strategy_name(strategy: DictConfig) -> str:
    target = str(strategy.get("_target_", ""))
    return STRATEGY_BY_CLASS.get(target.rsplit(".", 1)[-1], "single_device")


def technique_settings(cfg: DictConfig) -> dict[str, TechniqueSettings]:
    """Each ``technique.NAME`` node as its settings class (named by the node's ``_target_``)."""
    techniques = {}
    for name, node in (cfg.get("technique") or {}).items():
        key = f"technique.{name}"
        target = node.get("_target_") if isinstance(node, DictConfig) else None
        cls = _settings_class(target, key, TechniqueSettings, "technique configs come from conf/technique/ (e.g. +technique=adaptive_batch)")
        techniques[name] = settings_from_config(cls, node, key)
    setters = [f"technique.{name}" for name, s in techniques.items() if s.sets_global_batch]
    if len(setters) > 1:
        raise ConfigError(
            f"only one technique may set the global batch, but {' and '.join(setters)} both do; keep one of them."
        )
    return techniques


def _settings_class(target: Any, key: str, base: type, hint: str) -> type:
    """The settings class a config node names in ``_target_``, which must derive from ``base``."""
    module_name, _, class_name = str(target).rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), class_name) if module_name else None
    except (ImportError, AttributeError):
        cls = None
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise ConfigError(f"{key}._target_={target!r} is not a {base.__name__} class; {hint}.")
    return cls


def optimizer_settings(cfg: DictConfig) -> OptimizerSettings:
    """The ``optimizer`` node as the settings class its ``_target_`` names (``conf/optimizer/``)."""
    node = cfg.optimizer
    target = node.get("_target_") if isinstance(node, DictConfig) else None
    cls = _settings_class(target, "optimizer", OptimizerSettings, "choose one from conf/optimizer/ (e.g. optimizer=muon)")
    return settings_from_config(cls, node, "optimizer")


def _seq_len(cfg: DictConfig) -> int:
    seq_len = plain(cfg.data.get("seq_len"))
    check_seq_len(seq_len)
    return seq_len


def _top_level(cfg: DictConfig) -> dict[str, Any]:
    return {key: coerce(plain(cfg.get(key)), hint, key) for key, hint in TOP_LEVEL_TYPES.items()}


def check_files(cfg: DictConfig) -> None:
    """The folders and files the run reads, checked as the run starts (not in ``check_config``,
    which checks settings alone, e.g. of documented commands with placeholder paths)."""
    folder = cfg.get("init_from_hf")
    if folder and not (Path(folder) / "config.json").is_file():
        raise ConfigError(
            f"init_from_hf={folder}: {Path(folder) / 'config.json'} does not exist; give a local Hugging Face Llama"
            " folder (config.json and *.safetensors)."
        )


def check_config(cfg: DictConfig, processes: int | None = None) -> RunSettings:
    """Validate the whole run config; ``processes`` overrides the count the config states."""
    top = _top_level(cfg)
    model = settings_from_config(LlamaConfig, cfg.model, "model")
    batch = settings_from_config(BatchConfig, cfg.batch, "batch")
    lr_schedule = settings_from_config(LRScheduleConfig, cfg.lr_schedule, "lr_schedule")
    layout = settings_from_config(LayoutConfig, cfg.layout, "layout")
    techniques = technique_settings(cfg)
    optimizer = optimizer_settings(cfg)
    run = RunContext(
        world_size=processes or world_size(cfg.trainer),
        strategy=strategy_name(cfg.strategy),
        accelerator=str(cfg.trainer.get("accelerator", "auto")),
        batch=batch,
        token_budget=top["token_budget"],
        lr_schedule=lr_schedule,
        max_steps=coerce(plain(cfg.trainer.get("max_steps", -1)), int, "trainer.max_steps"),
        seq_len=_seq_len(cfg),
        save_distributed_checkpoint=bool(cfg.strategy.get("save_distributed_checkpoint", False)),
        n_layers=model.n_layers,
        shared_settings=shared_settings(cfg),
    )
    replicas = max([settings.sequential_replicas(run) for settings in techniques.values()], default=1)
    accumulation = max([settings.min_accumulation(run) for settings in techniques.values()], default=1)
    groups = max([settings.data_groups() for settings in techniques.values()], key=lambda g: g.count, default=DataGroups())
    ranks = groups.data_parallel_size(run.world_size) if run.world_size else None
    micro = micro_batch_size_for(batch, ranks, replicas, accumulation) if ranks else None
    run = dataclasses.replace(run, sequential_replicas=replicas, data_groups=groups, micro_batch_size=micro)
    _check_budget(run, lr_schedule)
    _check_strategy(run, layout, cfg)
    check_float8_settings(layout.float8, layout.float8_emulate, run.strategy, run.accelerator, _linear_dims(model))
    optimizer.check(run.strategy)
    for settings in techniques.values():
        settings.check(run)
    return RunSettings(
        model=model,
        optimizer=optimizer,
        lr_schedule=lr_schedule,
        batch=batch,
        layout=layout,
        techniques=techniques,
        run=run,
        token_budget=top["token_budget"],
    )


def _linear_dims(model: LlamaConfig) -> dict[str, int]:
    """The dimensions of the blocks' linear layers, by the setting that fixes each."""
    return {"model.d_model": model.d_model, "model.n_kv_heads x head_dim": model.n_kv_heads * model.head_dim,
            "model.mlp_hidden": model.mlp_hidden}  # fmt: skip


def _check_budget(run: RunContext, lr_schedule: LRScheduleConfig) -> None:
    if run.token_budget is not None and run.token_budget <= 0:
        raise ConfigError(f"token_budget={run.token_budget} must be > 0 (or null to train until trainer.max_steps).")
    if run.token_budget is None and run.max_steps < 0:
        raise ConfigError("set token_budget or trainer.max_steps: with neither, training would never stop.")
    if run.token_budget is None and lr_schedule.name != "constant":
        raise ConfigError(
            f"lr_schedule.name={lr_schedule.name} decays until the token budget: set token_budget,"
            " or use lr_schedule.name=constant."
        )


def _check_strategy(run: RunContext, layout: LayoutConfig, cfg: DictConfig) -> None:
    if run.strategy == "fsdp" and run.accelerator == "cpu":
        raise ConfigError("strategy=fsdp (FSDP1) needs GPUs; on CPU use strategy=fsdp2.")
    if run.strategy == "single_device" and run.world_size is not None and run.world_size > 1:
        raise ConfigError(
            f"trainer.devices x trainer.num_nodes = {run.world_size} processes need a distributed strategy:"
            " add strategy=ddp or strategy=fsdp2."
        )
    if run.strategy != "fsdp2" and not layout.reshard_after_forward:
        raise ConfigError("layout.reshard_after_forward=false only applies to strategy=fsdp2.")
    if str(cfg.trainer.get("precision")) in ("16-mixed", "16", "16-true"):
        raise ConfigError(
            f"trainer.precision={cfg.trainer.precision} (fp16) is not supported: use bf16-mixed on GPUs"
            " (trainer=gpu) or 32-true."
        )

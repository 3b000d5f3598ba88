"""Turn the composed Hydra config into typed settings, failing fast with clear messages.

Everything here is cheap: it runs before any data is tokenized, any process is launched
or any weight is allocated. Each error names the config key and how to fix it.
"""

import dataclasses
from typing import TypeVar

from omegaconf import DictConfig, OmegaConf

from lightning_modules.global_batch import BatchConfig, BatchConfigError, GlobalBatch
from lightning_modules.llama import LlamaConfig
from lightning_modules.lr_schedule import LRScheduleConfig
from lightning_modules.optim import OptimizerConfig
from lightning_modules.parallelism import LayoutConfig

T = TypeVar("T")


class ConfigError(ValueError):
    """A setting that cannot work; the message says which key and what to do."""


def build_settings(cls: type[T], node: DictConfig | dict | None, key: str) -> T:
    """Instantiate a settings dataclass from a config section, rejecting unknown keys."""
    values = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node or {})
    values.pop("_target_", None)
    known = {field.name for field in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(
            f"unknown key(s) {', '.join(f'{key}.{name}' for name in unknown)}; valid keys of"
            f" `{key}` are: {', '.join(sorted(known))}."
        )
    try:
        return cls(**values)
    except (TypeError, ValueError) as error:
        raise ConfigError(f"invalid `{key}` settings: {error}") from error


@dataclasses.dataclass
class RunSettings:
    """The typed settings the training module is built from."""

    model: LlamaConfig
    optimizer: OptimizerConfig
    lr_schedule: LRScheduleConfig
    batch: BatchConfig
    layout: LayoutConfig


def world_size(trainer: DictConfig) -> int | None:
    """Processes the run will use, when the config states it as numbers."""
    devices, nodes = trainer.get("devices"), trainer.get("num_nodes", 1)
    if isinstance(devices, int) and isinstance(nodes, int):
        return devices * nodes
    if isinstance(devices, (list, tuple)) and isinstance(nodes, int):
        return len(devices) * nodes
    return None


def _check_budget(cfg: DictConfig, lr_schedule: LRScheduleConfig) -> None:
    budget, max_steps = cfg.get("token_budget"), cfg.trainer.get("max_steps", -1)
    if budget is not None and budget <= 0:
        raise ConfigError(f"token_budget={budget} must be > 0 (or null to train until trainer.max_steps).")
    if budget is None and (max_steps is None or max_steps < 0):
        raise ConfigError("set token_budget or trainer.max_steps: with neither, training would never stop.")
    if budget is None and lr_schedule.name != "constant":
        raise ConfigError(
            f"lr_schedule.name={lr_schedule.name} decays until the token budget: set token_budget,"
            " or use lr_schedule.name=constant."
        )


def _check_strategy(cfg: DictConfig, layout: LayoutConfig, processes: int | None) -> None:
    target = str(cfg.strategy.get("_target_", ""))
    accelerator = str(cfg.trainer.get("accelerator", "auto"))
    if target.endswith("FSDPStrategy") and accelerator == "cpu":
        raise ConfigError("strategy=fsdp (FSDP1) needs GPUs; on CPU use strategy=fsdp2.")
    if not target and processes is not None and processes > 1:
        raise ConfigError(
            f"trainer.devices x trainer.num_nodes = {processes} processes need a distributed strategy:"
            " add strategy=ddp or strategy=fsdp2."
        )
    if not target.endswith("ModelParallelStrategy") and not layout.reshard_after_forward:
        raise ConfigError("layout.reshard_after_forward=false only applies to strategy=fsdp2.")


def check_config(cfg: DictConfig) -> RunSettings:
    """Validate the whole run config; returns the typed settings for the training module."""
    settings = RunSettings(
        model=build_settings(LlamaConfig, cfg.model, "model"),
        optimizer=build_settings(OptimizerConfig, cfg.optimizer, "optimizer"),
        lr_schedule=build_settings(LRScheduleConfig, cfg.lr_schedule, "lr_schedule"),
        batch=build_settings(BatchConfig, cfg.batch, "batch"),
        layout=build_settings(LayoutConfig, cfg.layout, "layout"),
    )
    processes = world_size(cfg.trainer)
    try:
        GlobalBatch(settings.batch, data_parallel_size=processes or 1)
    except BatchConfigError as error:
        raise ConfigError(str(error)) from error
    _check_budget(cfg, settings.lr_schedule)
    _check_strategy(cfg, settings.layout, processes)
    return settings


def check_vocab(model: LlamaConfig, tokenizer_vocab_size: int) -> LlamaConfig:
    """Fill a missing vocabulary size from the tokenizer, or check the model's covers it.

    A missing size is rounded up to a multiple of 64, which keeps the output matmul on
    efficient shapes; the extra rows are never targets.
    """
    if model.vocab_size is None:
        return dataclasses.replace(model, vocab_size=-(-tokenizer_vocab_size // 64) * 64)
    if model.vocab_size < tokenizer_vocab_size:
        raise ConfigError(
            f"model.vocab_size={model.vocab_size} is smaller than the tokenizer's {tokenizer_vocab_size}"
            f" tokens: set model.vocab_size={tokenizer_vocab_size} (or null to take it from the tokenizer)."
        )
    return model


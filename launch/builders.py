"""Instantiate the pieces of a run from its checked settings: data, model, callbacks, loggers, trainer."""

import dataclasses
from pathlib import Path
from typing import Any

import lightning as L
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.errors import InstantiationException
from hydra.types import RunMode
from hydra.utils import instantiate
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch.loggers import Logger, WandbLogger
from lightning.pytorch.strategies import Strategy
from omegaconf import DictConfig, OmegaConf

from data.datamodule import TextDataModule
from common.errors import ConfigError, UserError
from launch.run_settings import RunSettings, world_size
from lightning_modules.hf_interop import load_hf_pretrained
from lightning_modules.llama import LlamaConfig
from lightning_modules.llama_module import LlamaLightningModule


def instantiate_checked(node: DictConfig, key: str, **kwargs: Any) -> Any:
    """``hydra.utils.instantiate``, with a user mistake in the target's arguments kept as one."""
    try:
        return instantiate(node, **kwargs)
    except InstantiationException as error:
        cause = error.__cause__
        if isinstance(cause, UserError):
            raise cause from None
        if isinstance(cause, (ValueError, TypeError)):
            raise ConfigError(f"{key}: {cause}") from None
        raise


def processes(trainer: DictConfig) -> int:
    """The number of processes the Trainer will start, as Lightning counts ``devices: auto`` / -1."""
    stated = world_size(trainer)
    if stated is not None:
        return stated
    nodes = trainer.get("num_nodes", 1)
    accelerator = str(trainer.get("accelerator", "auto"))
    gpus = torch.cuda.device_count() if accelerator in ("auto", "gpu", "cuda") else 0
    return max(gpus, 1) * nodes


def build_datamodule(cfg: DictConfig, settings: RunSettings) -> TextDataModule:
    return instantiate_checked(
        cfg.data, "data", micro_batch_size=settings.run.micro_batch_size, data_groups=settings.run.data_groups, _convert_="all"
    )


def vocab_for(model: LlamaConfig, tokenizer_vocab_size: int) -> LlamaConfig:
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


def build_module(cfg: DictConfig, settings: RunSettings, vocab_size: int) -> LlamaLightningModule:
    """The training module; with ``init_from_hf`` the architecture and weights come from that folder."""
    model, init_state_dict = settings.model, None
    if cfg.get("init_from_hf"):
        model, init_state_dict = load_hf_pretrained(cfg.init_from_hf)
    return LlamaLightningModule(
        model=vocab_for(model, vocab_size),
        optimizer=settings.optimizer,
        lr_schedule=settings.lr_schedule,
        batch=settings.batch,
        layout=settings.layout,
        micro_batch_size=settings.run.micro_batch_size,
        token_budget=settings.token_budget,
        sequential_replicas=settings.run.sequential_replicas,
        data_groups=settings.run.data_groups,
        batch_scheduled=any(technique.sets_global_batch for technique in settings.techniques.values()),
        init_state_dict=init_state_dict,
    )


def build_callbacks(cfg: DictConfig, settings: RunSettings) -> list[L.Callback]:
    """The techniques (in config order), then the infrastructure callbacks of the ``callbacks``
    group, then evaluation and samples when they are switched on."""
    callbacks = [technique.build(settings.run) for technique in settings.techniques.values()]
    for name, node in (cfg.get("callbacks") or {}).items():
        callbacks.append(instantiate_checked(node, f"callbacks.{name}"))
    for key in ("evaluation", "samples"):
        if (cfg.get(key) or {}).get("_target_"):
            callbacks.append(instantiate_checked(cfg[key], key))
    return callbacks


WANDB_JOB_TYPE_LENGTH = 64  # W&B refuses longer job types


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


def build_logger(cfg: DictConfig, node: DictConfig) -> Logger:
    """One logger; a W&B logger without explicit group / name / tags gets them from the run."""
    if node.get("_target_", "").endswith("WandbLogger"):
        identity = wandb_identity(cfg)
        chosen = {key: node.get(key) or value for key, value in identity.items()}
        logger = instantiate(node, **chosen, tags=node.get("tags") or wandb_tags(cfg))
        # Lightning passes W&B an `anonymous` setting that W&B ignores, and W&B warns about
        # it on every run: leave it out of the arguments W&B is started with.
        logger._wandb_init.pop("anonymous", None)
        return logger
    return instantiate(node)


def build_loggers(cfg: DictConfig) -> list[Logger]:
    """Every logger of the chosen ``logger`` group, with the resolved config attached.

    W&B charts use tokens seen as their x-axis, since steps change meaning when the batch
    or sequence length changes.
    """
    loggers = [build_logger(cfg, node) for node in (cfg.get("logger") or {}).values()]
    resolved = OmegaConf.to_container(cfg, resolve=True)
    for logger in loggers:
        logger.log_hyperparams(resolved)
        if isinstance(logger, WandbLogger) and rank_zero_only.rank == 0:
            logger.experiment.define_metric("train/tokens_seen")
            logger.experiment.define_metric("*", step_metric="train/tokens_seen")
    return loggers


def close_loggers(loggers: list[Logger]) -> None:
    """End the W&B run, so the next job of an in-process multirun starts a new one."""
    if any(isinstance(logger, WandbLogger) for logger in loggers) and rank_zero_only.rank == 0:
        import wandb

        wandb.finish()


def build_strategy(cfg: DictConfig, settings: RunSettings) -> Strategy | str:
    """The configured strategy; FSDP2's data-parallel size defaults to every process."""
    if "_target_" not in cfg.strategy:
        return cfg.strategy.name
    if "data_parallel_size" in cfg.strategy and cfg.strategy.data_parallel_size is None:
        return instantiate(cfg.strategy, data_parallel_size=settings.run.world_size)
    return instantiate(cfg.strategy)


def build_trainer(cfg: DictConfig, settings: RunSettings, loggers: list[Logger], callbacks: list[L.Callback]) -> L.Trainer:
    return instantiate(cfg.trainer, callbacks=callbacks, logger=loggers or False, strategy=build_strategy(cfg, settings))

"""Instantiate the pieces of a run from its config: data, model, callbacks, loggers, trainer."""

from pathlib import Path

import lightning as L
from hydra.core.hydra_config import HydraConfig
from hydra.errors import InstantiationException
from hydra.types import RunMode
from hydra.utils import instantiate
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch.loggers import Logger, WandbLogger
from lightning.pytorch.strategies import Strategy
from omegaconf import DictConfig, OmegaConf

from launch.config_checks import ConfigError, RunSettings, check_vocab, world_size
from lightning_modules.hf_interop import load_hf_pretrained
from lightning_modules.llama_module import LlamaLightningModule


# Callbacks that change training (as opposed to measuring or saving it): tagged in W&B.
TECHNIQUE_CALLBACKS = (
    "adaptive_batch", "constant_batch", "batch_warmup", "batch_rampup", "seq_len_warmup", "diloco",
)  # fmt: skip


def build_datamodule(cfg: DictConfig) -> L.LightningDataModule:
    return instantiate(cfg.data, _convert_="all")


def build_module(cfg: DictConfig, settings: RunSettings, vocab_size: int) -> LlamaLightningModule:
    """The training module; with ``init_from_hf`` the architecture and weights come from that folder."""
    model, init_state_dict = settings.model, None
    if cfg.get("init_from_hf"):
        model, init_state_dict = load_hf_pretrained(cfg.init_from_hf)
    return LlamaLightningModule(
        model=check_vocab(model, vocab_size),
        optimizer=settings.optimizer,
        lr_schedule=settings.lr_schedule,
        batch=settings.batch,
        layout=settings.layout,
        token_budget=cfg.get("token_budget"),
        init_state_dict=init_state_dict,
    )


def wandb_group_and_name(cfg: DictConfig) -> tuple[str, str]:
    """Group runs by experiment, and by sweep in a multirun; name sweep runs by their overrides."""
    if HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN:
        hydra = HydraConfig.get()
        group = f"{cfg.experiment_name}/{Path(hydra.sweep.dir).name}"
        return group, f"{hydra.job.num}:{hydra.job.override_dirname or 'defaults'}"
    return cfg.experiment_name, cfg.experiment_name


def wandb_tags(cfg: DictConfig) -> list[str]:
    """Tags to filter runs by in the W&B UI: experiment, model, strategy, the techniques on, sweep or not."""
    strategy = HydraConfig.get().runtime.choices.get("strategy") if HydraConfig.initialized() else None
    tags = [cfg.experiment_name, f"model:{cfg.model.get('name', 'custom')}", f"strategy:{strategy or 'single_device'}"]
    tags += [f"callback:{name}" for name in (cfg.get("callbacks") or {}) if name in TECHNIQUE_CALLBACKS]
    if HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN:
        tags.append("sweep")
    return tags


def build_logger(cfg: DictConfig, node: DictConfig) -> Logger:
    """One logger; a W&B logger without explicit group / name / tags gets them from the run."""
    if node.get("_target_", "").endswith("WandbLogger"):
        group, name = wandb_group_and_name(cfg)
        return instantiate(
            node, group=node.get("group") or group, name=node.get("name") or name, tags=node.get("tags") or wandb_tags(cfg)
        )
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


def build_strategy(cfg: DictConfig) -> Strategy | str:
    """The configured strategy; FSDP2's data-parallel size defaults to every process."""
    if "_target_" not in cfg.strategy:
        return cfg.strategy.name
    if "data_parallel_size" in cfg.strategy and cfg.strategy.data_parallel_size is None:
        return instantiate(cfg.strategy, data_parallel_size=world_size(cfg.trainer) or "auto")
    return instantiate(cfg.strategy)


def build_callbacks(cfg: DictConfig) -> list[L.Callback]:
    """The ``callbacks`` group; a callback that rejects its settings becomes a ConfigError."""
    callbacks = []
    for name, node in (cfg.get("callbacks") or {}).items():
        try:
            callbacks.append(instantiate(node))
        except InstantiationException as error:
            cause = error.__cause__
            if isinstance(cause, ValueError):
                raise ConfigError(str(cause)) from error
            raise ConfigError(f"callbacks.{name}: {error}") from error
    return callbacks


def build_trainer(cfg: DictConfig, loggers: list[Logger], callbacks: list[L.Callback]) -> L.Trainer:
    return instantiate(cfg.trainer, callbacks=callbacks, logger=loggers or False, strategy=build_strategy(cfg))

"""Instantiate the pieces of a run from its checked settings: data, model, callbacks, loggers, trainer."""

from datetime import timedelta
from typing import Any

import lightning as L
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch.loggers import Logger, WandbLogger
from lightning.pytorch.strategies import Strategy

from common.errors import ConfigError, UserError
from data.datamodule import TextDataModule
from launch.run_settings import RunSettings
from lightning_modules.hf_interop import load_hf_pretrained
from lightning_modules.llama_module import LlamaLightningModule


def instantiate_checked(spec: dict[str, Any], key: str, **kwargs: Any) -> Any:
    """``hydra.utils.instantiate``, with a user mistake in the target's arguments kept as one."""
    try:
        return instantiate(spec, **kwargs)
    except InstantiationException as error:
        cause = error.__cause__
        if isinstance(cause, UserError):
            raise cause from None
        if isinstance(cause, (ValueError, TypeError)):
            raise ConfigError(f"{key}: {cause}") from None
        raise


def build_datamodule(settings: RunSettings) -> TextDataModule:
    return instantiate_checked(
        settings.data.spec,
        "data",
        micro_batch_size=settings.run.micro_batch_size,
        data_groups=settings.run.data_groups,
        _convert_="all",
    )


def build_module(settings: RunSettings, vocab_size: int) -> LlamaLightningModule:
    """The training module; with ``init_from_hf`` the architecture and weights come from that folder."""
    model, init_state_dict = settings.model, None
    if settings.job.init_from_hf:
        model, init_state_dict = load_hf_pretrained(settings.job.init_from_hf)
    return LlamaLightningModule(
        model=model.with_vocab(vocab_size),
        optimizer=settings.optimizer,
        lr_schedule=settings.lr_schedule,
        batch=settings.batch,
        layout=settings.layout,
        micro_batch_size=settings.run.micro_batch_size,
        token_budget=settings.job.token_budget,
        sequential_replicas=settings.run.sequential_replicas,
        data_groups=settings.run.data_groups,
        batch_scheduled=settings.batch_scheduled,
        init_state_dict=init_state_dict,
        pipeline_parallel_size=settings.run.pipeline_parallel_size,
    )


def build_callbacks(settings: RunSettings) -> list[L.Callback]:
    """The techniques (in config order), then the infrastructure callbacks of the ``callbacks``
    group, then evaluation and samples when they are switched on."""
    callbacks = [technique.build(settings.run) for technique in settings.techniques.values()]
    for name, spec in settings.callbacks.specs.items():
        callbacks.append(instantiate_checked(spec, f"callbacks.{name}"))
    for key, spec in (("evaluation", settings.callbacks.evaluation), ("samples", settings.callbacks.samples)):
        if spec is not None:
            callbacks.append(instantiate_checked(spec, key))
    return callbacks


def build_logger(settings: RunSettings, spec: dict[str, Any]) -> Logger:
    """One logger; a W&B logger without explicit group / name / tags gets them from the run."""
    if str(spec.get("_target_", "")).endswith("WandbLogger"):
        chosen = {key: spec.get(key) or value for key, value in settings.logger.identity.items()}
        logger = instantiate(spec, **chosen, tags=spec.get("tags") or settings.logger.tags)
        # Lightning passes W&B an `anonymous` setting that W&B ignores, and W&B warns about
        # it on every run: leave it out of the arguments W&B is started with.
        logger._wandb_init.pop("anonymous", None)
        return logger
    return instantiate(spec)


def build_loggers(settings: RunSettings) -> list[Logger]:
    """Every logger of the chosen ``logger`` group, with the resolved config attached.

    W&B charts use tokens seen as their x-axis, since steps change meaning when the batch
    or sequence length changes.
    """
    loggers = [build_logger(settings, spec) for spec in settings.logger.specs.values()]
    for logger in loggers:
        logger.log_hyperparams(settings.logger.hyperparameters)
        if isinstance(logger, WandbLogger) and rank_zero_only.rank == 0:
            logger.experiment.define_metric("train/tokens_seen")
            logger.experiment.define_metric("*", step_metric="train/tokens_seen")
    return loggers


def close_loggers(loggers: list[Logger]) -> None:
    """End the W&B run, so the next job of an in-process multirun starts a new one."""
    if any(isinstance(logger, WandbLogger) for logger in loggers) and rank_zero_only.rank == 0:
        import wandb

        wandb.finish()


def build_strategy(settings: RunSettings) -> Strategy | str:
    """The configured strategy, its collectives bounded by ``collective_timeout_s``; FSDP2's
    data-parallel size defaults to every process the tensor-parallel groups leave."""
    spec = settings.strategy.lightning_spec()
    if "_target_" not in spec:
        return spec["name"]
    given = {"timeout": timedelta(seconds=settings.job.collective_timeout_s)}
    if "data_parallel_size" in spec and spec["data_parallel_size"] is None:
        given["data_parallel_size"] = settings.run.world_size // settings.run.tensor_parallel_size
    return instantiate(spec, **given)


def build_trainer(settings: RunSettings, loggers: list[Logger], callbacks: list[L.Callback]) -> L.Trainer:
    return instantiate(
        settings.trainer.spec, callbacks=callbacks, logger=loggers or False, strategy=build_strategy(settings)
    )

"""One training run from checked settings: build the pieces, resume if asked, fit.

Imported only after the config has passed its checks, because it pulls in Lightning,
the data libraries and the loggers (several seconds of imports).
"""

import logging
import os
from dataclasses import dataclass

import lightning as L
import torch
from lightning.pytorch.utilities.exceptions import SIGTERMException
from omegaconf import DictConfig

from common.errors import StaleWeights
from launch.builders import (
    build_callbacks,
    build_datamodule,
    build_loggers,
    build_module,
    build_trainer,
    close_loggers,
    processes,
    vocab_for,
)
from launch.console import quiet_console
from launch.resume import check_resume
from launch.run_settings import RunSettings, check_config, check_files
from lightning_modules.memory_plan import check_fits, memory_plan
from lightning_modules.parallelism import check_kernels_available

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunResult:
    """The final metrics of a run, and whether it reached its end (not stopped by SIGTERM or Ctrl-C)."""

    metrics: dict[str, float]
    finished: bool


def check_device_memory(cfg: DictConfig, settings: RunSettings, vocab_size: int) -> None:
    """On a GPU run: log the memory plan per device, and refuse a model that cannot fit."""
    if settings.run.accelerator == "cpu" or not torch.cuda.is_available():
        return
    run = settings.run
    plan = memory_plan(
        vocab_for(settings.model, vocab_size), precision=str(cfg.trainer.precision), optimizer=settings.optimizer.kind,
        shards=run.world_size if run.strategy in ("fsdp", "fsdp2") else 1, micro_batch=run.micro_batch_size,
        seq_len=run.seq_len, checkpointing=settings.layout.activation_checkpointing, loss=settings.layout.loss,
    )  # fmt: skip
    name, memory = torch.cuda.get_device_name(), torch.cuda.get_device_properties(0).total_memory
    check_fits(plan, settings.model.name, name, memory)
    if int(os.environ.get("LOCAL_RANK", 0)) == 0:
        log.info("memory plan per device (%s, %.1f GiB): %s", name, memory / 2**30, plan.describe())


def train(cfg: DictConfig, settings: RunSettings) -> RunResult:
    """Run one training job; returns its final metrics (used by sweeps)."""
    quiet_console()
    check_files(cfg)
    for technique in settings.techniques.values():
        technique.check_services()
    world = processes(cfg.trainer)
    if settings.run.world_size != world:
        settings = check_config(cfg, processes=world)  # the checks that needed the process count
    check_kernels_available(settings.layout)
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    if cfg.get("experiment_note"):
        log.info("%s: %s", cfg.experiment_name, cfg.experiment_note)
    datamodule = build_datamodule(cfg, settings)
    check_device_memory(cfg, settings, datamodule.vocab_size)
    if int(os.environ.get("LOCAL_RANK", 0)) == 0:
        # Tokenize (or find the cache) and check it before any logger starts, so a data
        # mistake ends the run with its one line and no logger files; Lightning's own
        # prepare_data then finds the cache.
        datamodule.prepare(world)
    module = build_module(cfg, settings, datamodule.vocab_size)
    if cfg.get("ckpt_path"):
        check_resume(
            cfg.ckpt_path, module.model_config, datamodule.seq_len, settings.run.sequential_replicas, settings.optimizer.kind,
            world,
        )
    loggers = build_loggers(cfg)
    trainer = build_trainer(cfg, settings, loggers, build_callbacks(cfg, settings))
    stopped = False
    try:
        trainer.fit(module, datamodule=datamodule, ckpt_path=cfg.get("ckpt_path"))
    except SIGTERMException:
        stopped = True
        log.info("stopped by SIGTERM after saving a checkpoint")
    finally:
        close_loggers(loggers)
    metrics = {key: float(value) for key, value in trainer.callback_metrics.items()}
    finished = not (stopped or trainer.interrupted)
    clock = module.training_state.clock
    note = module.training_state.weights_note
    if trainer.is_global_zero and "val/loss" in metrics:
        log.info(
            "%s at step %d after %s tokens: val/loss %.4f (nats per token); outputs in %s",
            "stopped" if not finished else "finished" if note is None else "ended behind the run", clock.steps,
            f"{clock.tokens:,}", metrics["val/loss"], trainer.default_root_dir,
        )  # fmt: skip
    if finished and note is not None:
        raise StaleWeights(note)
    return RunResult(metrics, finished=finished)

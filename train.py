"""Train a Llama: compose the Hydra config, check it, build the pieces, fit.

    python train.py                          # tiny model on the embedded corpus
    python train.py +experiment=baseline     # an experiment from conf/experiment/
    python train.py -m seed=1,2,3            # a multirun sweep
"""

import logging
import sys

import hydra
import lightning as L
from lightning.pytorch.utilities.exceptions import SIGTERMException
from omegaconf import DictConfig

from launch.builders import (
    build_callbacks,
    build_datamodule,
    build_loggers,
    build_module,
    build_trainer,
    close_loggers,
)
from launch.config_checks import ConfigError, check_config
from lightning_modules.global_batch import BatchConfigError

log = logging.getLogger(__name__)


def train(cfg: DictConfig) -> dict[str, float]:
    """Run one training job; returns the final metrics (used by sweeps)."""
    settings = check_config(cfg)
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    datamodule = build_datamodule(cfg)
    module = build_module(cfg, settings, datamodule.vocab_size)
    callbacks = build_callbacks(cfg)
    loggers = build_loggers(cfg)
    trainer = build_trainer(cfg, loggers, callbacks)
    try:
        trainer.fit(module, datamodule=datamodule, ckpt_path=cfg.get("ckpt_path"))
    except SIGTERMException:
        log.info("stopped by SIGTERM after saving a checkpoint")
    finally:
        close_loggers(loggers)
    metrics = {key: float(value) for key, value in trainer.callback_metrics.items()}
    if trainer.is_global_zero and "val/loss" in metrics:
        log.info(
            "finished at step %d after %d tokens: val/loss %.4f (nats per token); outputs in %s",
            module.clock.steps, module.clock.tokens, metrics["val/loss"], trainer.default_root_dir,
        )
    return metrics


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> float | None:
    try:
        metrics = train(cfg)
    except (ConfigError, BatchConfigError) as error:
        log.error("config error: %s", error)
        sys.exit(2)
    return metrics.get("val/loss")


if __name__ == "__main__":
    main()

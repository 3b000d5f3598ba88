"""One training run from checked settings: build the pieces, resume if asked, fit.

Imported only after the config has passed its checks, because it pulls in Lightning,
the data libraries and the loggers (several seconds of imports).
"""

import logging
import os
from dataclasses import dataclass

import lightning as L
from lightning.pytorch.utilities.exceptions import SIGTERMException

from common.errors import PeerLost, StaleWeights
from launch.builders import build_callbacks, build_datamodule, build_loggers, build_module, build_trainer, close_loggers
from launch.console import quiet_console
from launch.peer_loss import is_lost_peer, lost_peer_message
from launch.resume import check_resume
from launch.run_settings import RunSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunResult:
    """The final metrics of a run, and whether it reached its end (not stopped by SIGTERM or Ctrl-C)."""

    metrics: dict[str, float]
    finished: bool


def train(settings: RunSettings) -> RunResult:
    """Run one training job; returns its final metrics (used by sweeps)."""
    quiet_console()
    settings = settings.for_processes(settings.trainer.processes())  # `devices: auto` counted
    L.seed_everything(settings.job.seed, workers=True, verbose=False)
    datamodule = build_datamodule(settings)  # cheap: the tokenizer is built on first use
    settings.check_services(lambda: datamodule.vocab_size)
    if settings.job.experiment_note:
        log.info("%s: %s", settings.job.experiment_name, settings.job.experiment_note)
    world = settings.run.world_size
    if int(os.environ.get("LOCAL_RANK", 0)) == 0:
        # Tokenize (or find the cache) and check it before any logger starts, so a data
        # mistake ends the run with its one line and no logger files; Lightning's own
        # prepare_data then finds the cache.
        datamodule.prepare(world)
    module = build_module(settings, datamodule.vocab_size)
    ckpt_path = settings.job.ckpt_path
    if ckpt_path:
        check_resume(
            ckpt_path,
            module.model_config,
            datamodule.seq_len,
            settings.run.sequential_replicas,
            settings.optimizer.kind,
            world,
        )
    loggers = build_loggers(settings)
    trainer = build_trainer(settings, loggers, build_callbacks(settings))
    stopped = False
    try:
        trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path)
    except SIGTERMException:
        stopped = True
        log.info("stopped by SIGTERM after saving a checkpoint")
    except Exception as error:
        if not is_lost_peer(error, trainer):
            raise
        step = module.training_state.clock.steps
        raise PeerLost(lost_peer_message(error, trainer, step, settings.job.collective_timeout_s)) from None
    finally:
        close_loggers(loggers)
    metrics = {key: float(value) for key, value in trainer.callback_metrics.items()}
    finished = not (stopped or trainer.interrupted)
    clock = module.training_state.clock
    note = module.training_state.weights_note
    if trainer.is_global_zero and "val/loss" in metrics:
        log.info(
            "%s at step %d after %s tokens: val/loss %.4f (nats per token); outputs in %s",
            "stopped" if not finished else "finished" if note is None else "ended behind the run",
            clock.steps,
            f"{clock.tokens:,}",
            metrics["val/loss"],
            trainer.default_root_dir,
        )
    if finished and note is not None:
        raise StaleWeights(note)
    return RunResult(metrics, finished=finished)

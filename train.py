"""Train a Llama: compose the Hydra config, check it, build the pieces, fit.

    python train.py                                        # tiny model on the embedded corpus
    python train.py +experiment=adaptive_bs                # an experiment from conf/experiment/
    python train.py '+technique=[seq_len_warmup,diloco]'   # techniques from conf/technique/
    python train.py -m seed=1,2,3                          # a multirun sweep
    python train.py -m +sweep=NAME hydra.sweep.dir=DIR     # a study; the same command resumes it
                                                           # (started twice: two workers)

The config is checked before the heavy imports, so a mistake is reported within a couple
of seconds, as one ``error:`` line with exit code 2 (``launch/cli.py``).
"""

import shutil
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from common.errors import PEER_LOST_EXIT, STALE_WEIGHTS_EXIT, PeerLost, StaleWeights, UserError
from launch.cli import fail, is_rank_zero, run_cli
from launch.from_config import read_settings
from launch.run_folder import shared_run_folder
from launch.run_settings import RunSettings
from launch.sweep_jobs import SweepJob, claim_folder, report_busy, report_resume, report_skip, report_stopped

HYDRA_ONLY = {".hydra", "train.log"}  # what Hydra writes into a run folder before the run starts


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> float | None:
    try:
        settings = read_settings(cfg)
        job = SweepJob.current()
        if job is None:
            folder = Path(HydraConfig.get().runtime.output_dir)
            with claim_folder(folder, settings.run.world_size) as holder:
                if holder is not None:  # e.g. two jobs started in the same second share the time-stamped folder
                    raise UserError(
                        f"{folder} is in use by another run ({holder}): give this run its own hydra.run.dir."
                    )
                return train_and_report(settings)
        with job.claim(settings.run.world_size) as holder:
            if holder is not None:  # a second worker of the same sweep command has it
                report_busy(job, holder)
                return None
            finished = job.finished_metrics()
            if finished is not None:  # a resumed sweep: this job finished in an earlier run
                report_skip(job, finished)
                return finished.get("val/loss")
            checkpoint = job.checkpoint()
            if checkpoint is not None:  # interrupted in an earlier run (which may have begun at ckpt_path)
                report_resume(job, checkpoint)
                settings = settings.resuming_from(str(checkpoint))
            return train_and_report(settings, job)
    except UserError as error:  # reported here, not by Hydra, which would add its own line
        if is_rank_zero():
            remove_empty_run_folder(Path(cfg.paths.output_dir) / "runs")
        fail(str(error))
    except StaleWeights as error:  # trained to the end, on weights that are not the run's
        fail(str(error), STALE_WEIGHTS_EXIT)
    except PeerLost as error:  # every node left says so: rank 0 may be the one that is gone
        fail(str(error), PEER_LOST_EXIT, every_node=True)


def train_and_report(settings: RunSettings, job: SweepJob | None = None) -> float | None:
    """Train; a sweep job that ran to its end leaves its marker. A job stopped by SIGTERM or
    Ctrl-C (after its checkpoint) ends the whole sweep: the scheduler wants the process gone,
    and the same command resumes the job. Returns the final val/loss."""
    from launch.training import train  # Lightning, torch, datasets: only for a valid config

    result = train(settings)
    if job is not None and result.finished:
        job.mark_finished(result.metrics)
    elif job is not None:
        report_stopped(job)
        raise SystemExit(0)
    return result.metrics.get("val/loss")


def remove_empty_run_folder(runs: Path) -> None:
    """A run that failed before it wrote anything leaves no folder behind (nor, in the default
    layout ``outputs/runs/<experiment>/<time>``, an empty experiment folder, ``runs`` or ``outputs``)."""
    folder = Path(HydraConfig.get().runtime.output_dir)
    if folder.is_dir() and {path.name for path in folder.iterdir()} <= HYDRA_ONLY:
        shutil.rmtree(folder, ignore_errors=True)
        outputs = runs.parent.resolve()
        for empty in folder.parents[:3]:  # runs/<experiment>, runs, then the outputs folder itself
            if outputs != empty.resolve() and outputs not in empty.resolve().parents:
                break
            try:
                empty.rmdir()  # only if empty; another run may have just written to it
            except OSError:
                break


def main_with_shared_folder() -> None:
    """``main``, every process of an externally launched run writing into one folder."""
    sys.argv += shared_run_folder(sys.argv[1:])
    main()


if __name__ == "__main__":
    run_cli(main_with_shared_folder)

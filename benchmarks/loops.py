"""The same training two ways: through train.py's pieces, and as a plain PyTorch loop.

Both sides build the model the same way (meta device, the configured layout: kernels,
checkpointing, compile), draw the same micro-batches from the data module, and run the
configured optimizer with the same parameter groups, accumulation, clipping and LR
schedule, without a host sync per step. The framework's rate is its Throughput callback's
over the timed steps; the plain loop times the same steps with ``time.perf_counter`` after
a device sync.
"""

import csv
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import lightning as L
import torch
from hydra import compose, initialize_config_dir

from benchmarks.memory_logger import MemoryLogger
from launch.builders import build_callbacks, build_datamodule, build_module, build_trainer
from launch.from_config import read_settings
from launch.run_settings import RunSettings
from lightning_modules.llama import Llama, seed_from_global_rng
from lightning_modules.lr_schedule import learning_rate
from lightning_modules.meta_init import materialize_and_init
from lightning_modules.parallelism import apply_layout, attention_backend

REPO = Path(__file__).resolve().parents[1]


def timed_overrides(steps: int, warmup: int, every_step: bool = False) -> list[str]:
    """A timed run: ``warmup`` untimed steps, then ``steps`` timed ones, logged once at the
    end (or, ``every_step``, after each: a rate per step); no checkpoints, no validation, no
    optimizer statistics."""
    return [
        "~callbacks.model_checkpoint",
        "~callbacks.last_checkpoint",
        "~callbacks.optimizer_stats",
        "~callbacks.progress_bar",
        "trainer.enable_checkpointing=false",
        "+trainer.enable_progress_bar=false",
        "trainer.num_sanity_val_steps=0",
        "+trainer.limit_val_batches=0",
        f"trainer.max_steps={warmup + steps}",
        f"trainer.log_every_n_steps={1 if every_step else warmup + steps}",
        "callbacks.validation_schedule.every_n_steps=1000000",
        f"callbacks.throughput.warmup_steps={warmup}",
    ]


def benchmark_settings(overrides: list[str], steps: int, warmup: int) -> RunSettings:
    """The run's settings for a timed run (``timed_overrides``), trained in this process."""
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose(
            "train",
            overrides=["logger=none", "paths.run_dir=/tmp/benchmark", *timed_overrides(steps, warmup), *overrides],
        )
    return read_settings(cfg)


@dataclass
class Measured:
    """What one timed run gave."""

    tokens_per_sec: float
    mfu: float | None
    hfu: float | None
    peak_memory_gb: float | None
    losses: dict[int, float]
    #: every logged rate (one per timed step with ``every_step``)
    rates: list[float] = field(default_factory=list)


def framework_run(settings: RunSettings) -> Measured:
    """Train through the framework's pieces (as train.py does) and read what it logged."""
    settings = settings.for_processes(settings.trainer.processes())
    L.seed_everything(settings.job.seed, verbose=False)
    datamodule = build_datamodule(settings)
    settings.check_services(lambda: datamodule.vocab_size)
    module = build_module(settings, datamodule.vocab_size)
    logger = MemoryLogger()
    trainer = build_trainer(settings, [logger], build_callbacks(settings))
    trainer.fit(module, datamodule=datamodule)
    return Measured(
        tokens_per_sec=logger.last("perf/tokens_per_sec"),
        mfu=logger.last("perf/mfu"),
        hfu=logger.last("perf/hfu"),
        peak_memory_gb=logger.last("perf/peak_memory_gb"),
        losses=logger.series("train/loss"),
    )


def processes_run(overrides: list[str], steps: int, warmup: int, every_step: bool = False) -> Measured:
    """Train a timed run as a fresh ``train.py`` (with its own processes: ``trainer.devices``
    of them, for layouts one process cannot hold) and read what it logged."""
    with tempfile.TemporaryDirectory(prefix="benchmark_run_") as folder:
        command = [sys.executable, str(REPO / "train.py"), "logger=csv", f"hydra.run.dir={folder}"]
        timed = timed_overrides(steps, warmup, every_step)
        result = subprocess.run([*command, *timed, *overrides], cwd=REPO, capture_output=True, text=True)
        if result.returncode != 0:
            lines = [line for line in result.stderr.splitlines() if line.strip()]
            raise RuntimeError(f"train.py exited {result.returncode}: {lines[-1] if lines else 'no output'}")
        with open(Path(folder) / "csv" / "metrics.csv") as file:
            rows = list(csv.DictReader(file))

    def last(name: str) -> float | None:
        values = [float(row[name]) for row in rows if row.get(name)]
        return values[-1] if values else None

    return Measured(
        tokens_per_sec=last("perf/tokens_per_sec"),
        mfu=last("perf/mfu"),
        hfu=last("perf/hfu"),
        peak_memory_gb=last("perf/peak_memory_gb"),
        losses={int(row["step"]): float(row["train/loss"]) for row in rows if row.get("train/loss")},
        rates=[float(row["perf/tokens_per_sec"]) for row in rows if row.get("perf/tokens_per_sec")],
    )


def synchronized_now(device: torch.device) -> float:
    """Wall time once the device has finished its queued work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def plain_tokens_per_sec(settings: RunSettings, steps: int, warmup: int) -> float:
    """The loop a researcher would write by hand around the same model, kernels and data."""
    settings = settings.for_processes(1)
    L.seed_everything(settings.job.seed, verbose=False)
    datamodule = build_datamodule(settings)
    settings.check_services(lambda: datamodule.vocab_size)
    datamodule.prepare_data()
    datamodule.setup("fit")
    device = torch.device("cuda" if torch.cuda.is_available() and settings.trainer.accelerator != "cpu" else "cpu")
    with torch.device("meta"):
        model = Llama(settings.model.with_vocab(datamodule.vocab_size))
    apply_layout(model, settings.layout)
    materialize_and_init(model, device, seed_from_global_rng())
    optimizer = settings.optimizer.build(model, fused=settings.layout.fused_adamw)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled="bf16" in settings.trainer.precision)
    accumulation = settings.batch.global_batch_size // settings.run.micro_batch_size
    batches, tokens, timed_from = iter(datamodule.train_dataloader()), 0, (0, 0.0)
    for step in range(warmup + steps):
        if step == warmup:
            timed_from = (tokens, synchronized_now(device))
        lr = learning_rate(settings.optimizer.lr, settings.lr_schedule, step + 1, tokens, settings.job.token_budget)
        for group in optimizer.param_groups:
            group["lr"] = lr
        for _ in range(accumulation):
            batch = {key: value.to(device, non_blocking=True) for key, value in next(batches).items()}
            with autocast, attention_backend(settings.layout.attention_backend):
                loss = model(batch["input_ids"], labels=batch["labels"])
            (loss / accumulation).backward()
            tokens += batch["labels"].numel()
        torch.nn.utils.clip_grad_norm_(model.parameters(), settings.optimizer.grad_clip or float("inf"))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return (tokens - timed_from[0]) / (synchronized_now(device) - timed_from[1])

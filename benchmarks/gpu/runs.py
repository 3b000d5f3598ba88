"""One timed run: its result, and training it in this process as a fresh process would."""

import gc
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import torch
import torch._dynamo

from benchmarks.loops import benchmark_settings, framework_run, plain_tokens_per_sec, processes_run


@dataclass
class RunResult:
    """One run: what it was, how it ended and what it measured."""

    label: str
    overrides: list[str]
    loop: str
    steps: int
    warmup: int
    status: str = "ok"
    seconds: float = 0.0
    tokens_per_sec: float | None = None
    mfu: float | None = None
    hfu: float | None = None
    peak_memory_gb: float | None = None
    losses: dict[int, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def measured(self) -> dict[str, Any]:
        """What a throughput table's row shows of the run (the tables' TOKENS, MFU, PEAK, STATUS columns and HFU)."""
        keys = ("tokens_per_sec", "mfu", "hfu", "peak_memory_gb", "status")
        return {key: getattr(self, key) for key in keys}

    def summary(self) -> str:
        if not self.ok or self.tokens_per_sec is None:
            return self.status
        return f"ok, {self.tokens_per_sec:,.0f} tokens/s"


def reset_device_state() -> None:
    """Forget compiled graphs and free cached device memory, so the next run starts as a fresh
    process would and its peak memory is its own."""
    torch._dynamo.reset()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def release_process_group() -> None:
    """FSDP runs start a (one-process) process group in this process: end it, so later runs
    see a plain single process again."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def is_out_of_memory(error: BaseException) -> bool:
    return isinstance(error, torch.cuda.OutOfMemoryError) or "out of memory" in str(error).lower()


def measure(result: RunResult, every_step: bool) -> None:
    """Train ``result``'s run and fill in what it measured, or why it did not finish."""
    overrides = result.overrides + (["trainer.log_every_n_steps=1"] if every_step else [])
    started = time.perf_counter()
    try:
        settings = benchmark_settings(overrides, result.steps, result.warmup)
        if result.loop == "plain":
            result.tokens_per_sec = plain_tokens_per_sec(settings, result.steps, result.warmup)
        else:
            # "processes": a fresh train.py with its own processes, one per device of the layout
            processes = result.loop == "processes"
            measured = processes_run(overrides, result.steps, result.warmup) if processes else framework_run(settings)
            for name in ("tokens_per_sec", "mfu", "hfu", "peak_memory_gb", "losses"):
                setattr(result, name, getattr(measured, name))
            if measured.tokens_per_sec is None:
                result.status = "no measurement (the run ended before its timed steps)"
    except Exception as error:  # one broken run must not cost the other rows of a 10-minute call
        message = " ".join(str(error).split()).replace("|", "/")  # one table cell
        result.status = (
            "out of memory" if is_out_of_memory(error) else f"failed: {type(error).__name__}: {message}"[:300]
        )
        if not is_out_of_memory(error):
            traceback.print_exc(file=sys.stderr)
    finally:
        result.seconds = time.perf_counter() - started
        release_process_group()
        reset_device_state()

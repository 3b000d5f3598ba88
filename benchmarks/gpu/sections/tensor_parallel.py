"""Tensor parallelism across devices: Llama-2 7B and 13B split over T = 1, 2, 4, 8 GPUs (one
data-parallel group, sequence parallelism on), by micro-batch and activation checkpointing;
the memory plan per device beside the measured peak.

Each layout is a fresh ``train.py`` with T processes. A layout needing more devices than the
machine has is not started: its row says how many it needs, with the plan that says whether
it would fit. One whose weights, gradients and optimizer state alone exceed a device is
refused by the run itself before its first step, and its row says so.
"""

import os
from typing import Any

import torch

from benchmarks.gpu.sections.large_model import ACCUMULATION, PLAN_COLUMNS, planned
from benchmarks.gpu.suite import Suite
from benchmarks.gpu.tables import MFU, PEAK, STATUS, TOKENS, Column, Table

TP_COLUMNS = [
    Column("model", "model"),
    Column("tensor_parallel", "T"),
    Column("micro_batch", "micro-batch"),
    Column("checkpointing", "checkpointing"),
    TOKENS,
    MFU,
    *PLAN_COLUMNS,
    PEAK,
    STATUS,
]


def devices_here(device: str) -> int:
    """GPUs on a CUDA machine; on CPU (the smoke plan), one gloo process per core."""
    return torch.cuda.device_count() if device == "cuda" else os.cpu_count() or 1


def tensor_parallel(suite: Suite) -> Table:
    plan, args = suite.plan, suite.args
    available = devices_here(plan.device)
    rows: list[dict[str, Any]] = []
    for model in plan.tp_models:
        for size in plan.tp_sizes:
            for micro in plan.tp_micro_batches:
                for checkpointing in plan.tp_checkpointing:
                    overrides = suite.overrides(
                        model,
                        f"batch.global_batch_size={ACCUMULATION * micro}",
                        f"batch.micro_batch_size={micro}",
                        "strategy=fsdp2",
                        f"trainer.devices={size}",
                        f"strategy.tensor_parallel_size={size}",
                        "strategy.save_distributed_checkpoint=false",
                        "layout.fsdp_mixed_precision=true",
                        f"layout.activation_checkpointing={checkpointing}",
                        seq_len=plan.tp_seq_len,
                    )
                    row = {
                        "model": model,
                        "tensor_parallel": size,
                        "micro_batch": micro,
                        "checkpointing": checkpointing,
                        **planned(overrides),
                    }
                    if size > available:
                        row["status"] = f"needs {size} devices (this machine has {available})"
                    else:
                        label = f"tp: {model} T {size} micro {micro} checkpointing {checkpointing}"
                        run = suite.run(label, overrides, args.steps, args.warmup, loop="processes")
                        row |= {
                            "tokens_per_sec": run.tokens_per_sec,
                            "mfu": run.mfu,
                            "peak_memory_gb": run.peak_memory_gb,
                            "status": run.status,
                        }
                    rows.append(row)
    return Table("tensor_parallel", TP_COLUMNS, rows)

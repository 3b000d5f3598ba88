"""A large model on one device: Llama-2-7B at 4,096 tokens, bf16 through FSDP2 with full
activation checkpointing and fused AdamW; the memory plan on paper beside the measured peak.

FSDP2 on one device shards nothing: it gives bf16 compute weights gathered one block at a
time (``layout.fsdp_mixed_precision``) over fp32 master weights, gradients and AdamW state,
16 bytes per parameter in all (``lightning_modules/memory_plan.py``). A model whose states
alone exceed the device is refused before its first step, and its row says so.
"""

from typing import Any

from benchmarks.gpu.suite import Suite
from benchmarks.gpu.tables import MFU, PEAK, STATUS, TOKENS, Column, Table
from benchmarks.loops import benchmark_settings
from launch.builders import build_datamodule
from lightning_modules.memory_plan import GIB

PLAN_COLUMNS = [
    Column("plan_states_gib", "plan: weights + grads + AdamW GiB", lambda v: f"{v:.1f}"),
    Column("plan_activations_gib", "plan: activations GiB", lambda v: f"{v:.1f}"),
    Column("plan_total_gib", "plan: total GiB", lambda v: f"{v:.1f}"),
]
LARGE_COLUMNS = [
    Column("model", "model"),
    Column("seq_len", "tokens"),
    Column("micro_batch", "micro-batch"),
    Column("global_batch", "global batch"),
    TOKENS,
    MFU,
    *PLAN_COLUMNS,
    PEAK,
    STATUS,
]
ACCUMULATION = 2  # micro-batches per step: the step's fixed costs (optimizer, gathers) shared by two


def planned(overrides: list[str]) -> dict[str, float]:
    """The run's memory plan per device (``PLAN_COLUMNS``), from its settings, as the run
    itself computes it."""
    settings = benchmark_settings(overrides, 1, 0)
    datamodule = build_datamodule(settings)
    memory = settings.layout.memory_plan(settings.services_run(lambda: datamodule.vocab_size))
    return {
        "plan_states_gib": memory.states / GIB,
        "plan_activations_gib": memory.activations / GIB,
        "plan_total_gib": memory.total / GIB,
    }


def large_model(suite: Suite) -> Table:
    plan, args = suite.plan, suite.args
    rows: list[dict[str, Any]] = []
    for micro in plan.large_micro_batches:
        batch = ACCUMULATION * micro
        overrides = suite.overrides(
            plan.large_model,
            f"batch.global_batch_size={batch}",
            f"batch.micro_batch_size={micro}",
            "strategy=fsdp2",
            "trainer.devices=1",
            "layout.fsdp_mixed_precision=true",
            "layout.activation_checkpointing=full",
            f"layout.compile={plan.work_compile}",
            *plan.work_kernels,
            seq_len=plan.large_seq_len,
        )
        run = suite.run(f"large model: {plan.large_model} micro {micro}", overrides, args.steps, args.warmup)
        rows.append(
            {
                "model": plan.large_model,
                "seq_len": plan.large_seq_len,
                "micro_batch": micro,
                "global_batch": batch,
                "tokens_per_sec": run.tokens_per_sec,
                "mfu": run.mfu,
                **planned(overrides),
                "peak_memory_gb": run.peak_memory_gb,
                "status": run.status,
            }
        )
    return Table("large_model", LARGE_COLUMNS, rows)

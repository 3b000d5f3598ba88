"""Layouts: the main model over micro-batch x checkpointing x compile; the smaller models at two layouts."""

import itertools
from typing import Any

from benchmarks.gpu.suite import Suite
from benchmarks.gpu.tables import MFU, PEAK, STATUS, TOKENS, Column, Table, mark_best, percent

ACTIVATION_CHECKPOINTING = ("none", "mlp", "full")


LAYOUT_COLUMNS = [
    Column("model", "model"),
    Column("micro_batch", "micro-batch"),
    Column("activation_checkpointing", "act. ckpt"),
    Column("compile", "compile"),
    Column("kernels", "kernels"),
    TOKENS,
    MFU,
    Column("hfu", "HFU", percent),
    PEAK,
    STATUS,
]


def layout_row(suite: Suite, model: str, micro: int, checkpointing: str, compile_mode: str) -> dict[str, Any]:
    plan, args = suite.plan, suite.args
    overrides = suite.overrides(
        model,
        f"batch.global_batch_size={plan.global_batch}",
        f"batch.micro_batch_size={micro}",
        f"layout.activation_checkpointing={checkpointing}",
        f"layout.compile={compile_mode}",
        *plan.kernels,
    )
    label = f"{model} micro {micro} ckpt {checkpointing} compile {compile_mode}"
    run = suite.run(label, overrides, args.steps, args.warmup)
    return {
        "model": model,
        "micro_batch": micro,
        "activation_checkpointing": checkpointing,
        "compile": compile_mode,
        "kernels": plan.kernels_label,
        **run.measured(),
    }


def layouts(suite: Suite) -> Table:
    """The main model over micro-batch x checkpointing x compile at a fixed global batch;
    then each smaller model with and without compile, at one micro-batch per step and no
    checkpointing (activations of models this small fit: only speed is in question)."""
    plan = suite.plan
    # Checkpointing outermost: the rows without it (the likely fastest where memory allows)
    # run first, so a tight budget skips the recomputing layouts rather than the fast ones.
    grid = itertools.product(ACTIVATION_CHECKPOINTING, plan.micro_batches, ("none", "blocks"))
    rows = [
        layout_row(suite, plan.model, micro, checkpointing, compile_mode) for checkpointing, micro, compile_mode in grid
    ]
    mark_best(rows, 0)
    searched_from = len(rows)
    for model in plan.small_models:
        rows += [
            layout_row(suite, model, plan.global_batch, "none", compile_mode) for compile_mode in ("none", "blocks")
        ]
    mark_best(rows, searched_from)
    return Table("layouts", LAYOUT_COLUMNS, rows)

"""Float8: the main model's blocks in float8 (torchao) against bf16 at the same layout, and
the losses of a few hundred steps of float8 against bf16 beside two bf16 runs' spread."""

from typing import Any

import torch

from benchmarks.gpu.plan import Plan
from benchmarks.gpu.sections.correctness import loss_differences
from benchmarks.gpu.suite import Suite
from benchmarks.gpu.tables import Column, Table, add_ratios, lever_columns, loss_columns, percent, scientific
from lightning_modules.flops import float8_peak_flops, peak_flops

# Float8 against bf16: the mean |difference| of the per-step losses over the last quarter of
# the comparison (the per-step maximum is reported too, but single steps jump about as
# training amplifies any rounding difference; the spread of two bf16 runs is the floor).
FLOAT8_LOSS_TOLERANCE = 2e-2
FLOAT8_THROUGHPUT_GOAL = 1.2  # tokens/s against bf16 (OLMo-core's 1B: 1.18x)

FLOAT8_COLUMNS = lever_columns("vs bf16", Column("float8_peak_share", "of the float8 peak", percent))
LOSS_COLUMNS = loss_columns(
    Column("tail_mean_abs_diff", "mean abs diff, last quarter", scientific),
    Column("tolerance", "tolerance (last quarter)", scientific),
)


def float8_variants(plan: Plan) -> list[tuple[str, list[str]]]:
    """(label, overrides): bf16 first (the reference), then each recipe, then tensorwise under
    FSDP2 with bf16 parameters, where the weights are all-gathered in float8."""
    bf16_parameters = ["strategy=fsdp2", "trainer.devices=1", "layout.fsdp_mixed_precision=true"]
    return [
        ("bf16", []),
        ("float8 tensorwise", ["layout.float8=tensorwise", *plan.float8]),
        ("float8 rowwise", ["layout.float8=rowwise", *plan.float8]),
        (
            "float8 tensorwise, FSDP2 bf16 parameters (float8 all-gather)",
            ["layout.float8=tensorwise", *plan.float8, *bf16_parameters],
        ),
    ]


def float8_peak_share(plan: Plan, mfu: float | None) -> float | None:
    """The run's model FLOP/s against the device's float8 peak (its MFU is against bf16's)."""
    if mfu is None or plan.device != "cuda":
        return None
    name = torch.cuda.get_device_name()
    bf16, float8 = peak_flops(name), float8_peak_flops(name)
    return mfu * bf16 / float8 if bf16 and float8 else None


def float8(suite: Suite) -> Table:
    """The main model, one micro-batch per step, compiled blocks, the best kernels."""
    plan, args = suite.plan, suite.args
    batch = plan.global_batch
    # The mfu section's reference layout, in its order of overrides: its bf16 row is this one's.
    base = suite.overrides(
        plan.model,
        f"batch.global_batch_size={batch}",
        "layout.activation_checkpointing=none",
        *plan.work_kernels,
        f"batch.micro_batch_size={batch}",
        f"layout.compile={plan.work_compile}",
    )
    rows: list[dict[str, Any]] = []
    for label, overrides in float8_variants(plan):
        run = suite.run(f"float8: {label}", [*base, *overrides], args.steps, args.warmup)
        share = float8_peak_share(plan, run.mfu)
        rows.append({"variant": label, "model": plan.model, **run.measured(), "float8_peak_share": share})
    add_ratios(rows)
    for row in rows[1:]:
        if row.get("ratio") is not None and rows[0].get("tokens_per_sec") is not None:
            goal = "met" if row["ratio"] >= FLOAT8_THROUGHPUT_GOAL else "under"
            row["status"] += f" ({goal}: goal >= {FLOAT8_THROUGHPUT_GOAL}x bf16)"
    return Table("float8", FLOAT8_COLUMNS, rows)


def tail_mean(reference: dict[int, float], other: dict[int, float]) -> float | None:
    """Mean |other - reference| over the last quarter of the steps both logged."""
    steps = sorted(set(reference) & set(other))
    tail = steps[len(steps) - max(1, len(steps) // 4) :]
    return sum(abs(other[step] - reference[step]) for step in tail) / len(tail) if tail else None


def float8_losses(suite: Suite) -> Table:
    """The correctness model trained ``plan.float8_loss_steps`` steps in bf16 twice (the
    spread: the floor any check stands on, not judged), and in each float8 recipe, from the
    same seed and data at the correctness LR, compiled as float8 is meant to run."""
    plan = suite.plan
    batch, steps = plan.correctness_batch, plan.float8_loss_steps
    bf16 = suite.work_layout(
        plan.correctness_model,
        f"batch.global_batch_size={batch}",
        f"optimizer.lr={plan.correctness_lr}",
        micro_batch=batch,
    )
    reference = suite.run("float8 losses: bf16", bf16, steps, 0, every_step=True)
    compared = [("bf16 against the same bf16 run again", bf16, 1)]
    compared += [
        (f"float8 {recipe} against bf16", [*bf16, f"layout.float8={recipe}", *plan.float8], 0)
        for recipe in ("tensorwise", "rowwise")
    ]
    rows = []
    for name, overrides, repeat in compared:
        run = suite.run(f"float8 losses: {name}", overrides, steps, 0, every_step=True, repeat=repeat)
        row = {
            "check": name,
            "model": plan.correctness_model,
            "tolerance": FLOAT8_LOSS_TOLERANCE,
            **loss_differences(reference, run),
            "tail_mean_abs_diff": tail_mean(reference.losses, run.losses),
        }
        failed = next((r.status for r in (reference, run) if not r.ok), None)
        within = row["tail_mean_abs_diff"] is not None and row["tail_mean_abs_diff"] <= FLOAT8_LOSS_TOLERANCE
        judged = "pass" if within else "FAIL"
        row["result"] = failed or (judged if repeat == 0 else "the floor (not judged)")
        row["reference_losses"], row["compared_losses"] = reference.losses, run.losses
        rows.append(row)
    return Table("float8_losses", LOSS_COLUMNS, rows)

"""MFU levers: the main model with the best kernels at the layouts the kernels section leaves out."""

from benchmarks.gpu.plan import Plan
from benchmarks.gpu.suite import Suite
from benchmarks.gpu.tables import Column, Table, add_ratios, lever_columns, mark_best, percent

MFU_COLUMNS = lever_columns("vs first row", Column("hfu", "HFU", percent))


def mfu_variants(plan: Plan) -> list[tuple[str, list[str]]]:
    """(label, layout overrides): the best layout measured so far first (the reference: one
    micro-batch per step, compiled blocks, 53.1% on an H100), then the levers left: the SDPA
    kernel (cuDNN's or FlashAttention's, where ``auto`` may pick either), twice the
    micro-batch with the MLPs recomputed (their activations are the largest), and the whole
    model compiled with Inductor's autotuning (compiles for minutes: last, so a tight budget
    skips it first)."""
    whole = plan.global_batch
    reference = [f"batch.micro_batch_size={whole}", "layout.compile=blocks"]
    return [
        (f"micro {whole} (no accumulation), compile blocks", reference),
        (f"micro {whole}, compile blocks, cuDNN attention", [*reference, "layout.attention_backend=cudnn"]),
        (f"micro {whole}, compile blocks, FlashAttention", [*reference, "layout.attention_backend=flash"]),
        (
            f"micro {2 * whole} (global {2 * whole}), compile blocks, MLPs recomputed",
            [
                f"batch.global_batch_size={2 * whole}",
                f"batch.micro_batch_size={2 * whole}",
                "layout.compile=blocks",
                "layout.activation_checkpointing=mlp",
            ],
        ),
        (
            f"micro {whole}, compile model, max-autotune-no-cudagraphs",
            [
                f"batch.micro_batch_size={whole}",
                "layout.compile=model",
                "layout.compile_mode=max-autotune-no-cudagraphs",
            ],
        ),
    ]


def mfu(suite: Suite) -> Table:
    """The main model with the best kernels of the first H100 run (Liger's cross-entropy,
    Inductor's norm/SwiGLU/RoPE, fused AdamW) at each lever of ``mfu_variants`` (no
    checkpointing unless the lever says); the ratio is against the first row that ran."""
    plan, args = suite.plan, suite.args
    base = suite.overrides(
        plan.model,
        f"batch.global_batch_size={plan.global_batch}",
        "layout.activation_checkpointing=none",
        *plan.work_kernels,
    )
    rows = []
    for label, overrides in mfu_variants(plan):
        run = suite.run(f"mfu: {label}", [*base, *overrides], args.steps, args.warmup)
        rows.append({"variant": label, "model": plan.model, **run.measured()})
    add_ratios(rows)
    mark_best(rows, 0)
    return Table("mfu", MFU_COLUMNS, rows)

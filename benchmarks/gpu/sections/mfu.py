"""MFU levers: the main model with the best kernels at the layouts the kernels section leaves out."""

from benchmarks.gpu.plan import Plan
from benchmarks.gpu.suite import Suite
from benchmarks.gpu.tables import MFU, PEAK, STATUS, TOKENS, Column, Table, add_ratios, decimals, mark_best, percent


MFU_COLUMNS = [Column("variant", "layout"), TOKENS, Column("ratio", "vs first row", decimals), MFU,
               Column("hfu", "HFU", percent), PEAK, STATUS]  # fmt: skip


def mfu_variants(plan: Plan) -> list[tuple[str, list[str]]]:
    """(label, layout overrides): the kernels section's layout first (the reference), then
    the levers it leaves out. One micro-batch per step saves the per-micro-batch work that
    does not shrink with it (autocast's weight casts, the loss head's launch); FSDP2's bf16
    parameters cast the weights once per step instead of once per micro-batch; compiling the
    whole model lets Inductor fuse across blocks and into the loss."""
    micro, whole = plan.kernel_layout[0], plan.global_batch
    bf16_parameters = ["strategy=fsdp2", "trainer.devices=1", "layout.fsdp_mixed_precision=true"]
    return [
        (f"micro {micro}, compile blocks", [f"batch.micro_batch_size={micro}", "layout.compile=blocks"]),
        (f"micro {whole} (no accumulation), compile blocks", [f"batch.micro_batch_size={whole}", "layout.compile=blocks"]),
        (f"micro {whole}, compile model", [f"batch.micro_batch_size={whole}", "layout.compile=model"]),
        (f"micro {micro}, compile model", [f"batch.micro_batch_size={micro}", "layout.compile=model"]),
        (f"micro {micro}, compile blocks, FSDP2 bf16 parameters",
         [f"batch.micro_batch_size={micro}", "layout.compile=blocks", *bf16_parameters]),
        (f"micro {whole}, compile blocks, FSDP2 bf16 parameters",
         [f"batch.micro_batch_size={whole}", "layout.compile=blocks", *bf16_parameters]),
    ]  # fmt: skip


def mfu(suite: Suite) -> Table:
    """The main model with the best kernels of the first H100 run (Liger's cross-entropy,
    Inductor's norm/SwiGLU/RoPE, fused AdamW), no checkpointing, at each lever of
    ``mfu_variants``; the ratio is against the first row that ran."""
    plan, args = suite.plan, suite.args
    base = suite.overrides(plan.model, f"batch.global_batch_size={plan.global_batch}",
                           f"layout.activation_checkpointing={plan.kernel_layout[1]}", *plan.work_kernels)  # fmt: skip
    rows = []
    for label, overrides in mfu_variants(plan):
        run = suite.run(f"mfu: {label}", [*base, *overrides], args.steps, args.warmup)
        rows.append({"variant": label, "model": plan.model, "tokens_per_sec": run.tokens_per_sec, "mfu": run.mfu,
                     "hfu": run.hfu, "peak_memory_gb": run.peak_memory_gb, "status": run.status})  # fmt: skip
    add_ratios(rows)
    mark_best(rows, 0)
    return Table("mfu", MFU_COLUMNS, rows)


"""Kernels: the main model at one layout with each choice of fused kernels and SDPA backend."""

from benchmarks.gpu.plan import Plan
from benchmarks.gpu.suite import Suite
from benchmarks.gpu.tables import MFU, PEAK, STATUS, TOKENS, Column, Table, add_ratios, decimals
from lightning_modules.liger_kernels import liger_available

KERNEL_COLUMNS = [
    Column("variant", "kernels"),
    Column("layout", "layout"),
    TOKENS,
    Column("ratio", "vs first row", decimals),
    MFU,
    PEAK,
    STATUS,
]


def kernel_variants(plan: Plan) -> list[tuple[str, list[str], str | None]]:
    """(label, kernel overrides, why it cannot run here or None): Liger's module kernels
    against Inductor's fusion of the same ops, the SDPA backend, Liger's loss against the
    chunked one."""
    no_liger = None if plan.device == "cuda" and liger_available() else "skipped: needs liger-kernel and CUDA"
    no_cudnn = None if plan.device == "cuda" else "skipped: cuDNN attention needs CUDA"
    liger_loss = ["layout.loss=liger", "layout.fused_adamw=true"]
    return [
        ("liger CE + liger norm/SwiGLU/RoPE", [*liger_loss, "layout.liger_kernels=true"], no_liger),
        ("liger CE + torch norm/SwiGLU/RoPE", [*liger_loss, "layout.liger_kernels=false"], no_liger),
        (
            "liger CE + torch norm/SwiGLU/RoPE + cuDNN attention",
            [*liger_loss, "layout.liger_kernels=false", "layout.attention_backend=cudnn"],
            no_liger or no_cudnn,
        ),
        (
            "chunked CE + torch norm/SwiGLU/RoPE",
            ["layout.loss=chunked", "layout.fused_adamw=true", "layout.liger_kernels=false"],
            None,
        ),
    ]


def kernels(suite: Suite) -> Table:
    """The main model at ``plan.kernel_layout`` with each kernel choice (fused AdamW in all);
    the ratio is against the first row that ran."""
    plan, args = suite.plan, suite.args
    micro, checkpointing, compile_mode = plan.kernel_layout
    layout = f"micro {micro}, ckpt {checkpointing}, compile {compile_mode}"
    base = suite.overrides(
        plan.model,
        f"batch.global_batch_size={plan.global_batch}",
        f"batch.micro_batch_size={micro}",
        f"layout.activation_checkpointing={checkpointing}",
        f"layout.compile={compile_mode}",
    )
    rows = []
    for label, overrides, unavailable in kernel_variants(plan):
        row = {"variant": label, "layout": layout, "model": plan.model}
        if unavailable:
            rows.append({**row, "status": unavailable})
            continue
        run = suite.run(f"kernels: {label}", [*base, *overrides], args.steps, args.warmup)
        row.update(tokens_per_sec=run.tokens_per_sec, mfu=run.mfu, peak_memory_gb=run.peak_memory_gb, status=run.status)
        rows.append(row)
    add_ratios(rows)
    return Table("kernels", KERNEL_COLUMNS, rows)

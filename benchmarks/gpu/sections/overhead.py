"""Framework overhead: the same model, kernels, data and batch through train.py's pieces and a plain loop."""

from benchmarks.gpu.suite import Suite
from benchmarks.gpu.tables import Column, Table, decimals, rate

MIN_FRAMEWORK_RATIO = 0.98


OVERHEAD_COLUMNS = [
    Column("model", "model"),
    Column("plain_tokens_per_sec", "plain PyTorch tokens/s", rate),
    Column("framework_tokens_per_sec", "framework tokens/s", rate),
    Column("ratio", "framework / plain", decimals),
    Column("result", f"target: >= {MIN_FRAMEWORK_RATIO}"),
]


def overhead(suite: Suite) -> Table:
    """The same model, kernels, data and batch through train.py's pieces and a plain loop."""
    plan, args = suite.plan, suite.args
    overrides = suite.work_layout(plan.model, f"batch.global_batch_size={plan.global_batch}")
    framework = suite.run("framework loop", overrides, args.steps, args.warmup)
    plain = suite.run("plain PyTorch loop", overrides, args.steps, args.warmup, loop="plain")
    row = {
        "model": plan.model,
        "plain_tokens_per_sec": plain.tokens_per_sec,
        "framework_tokens_per_sec": framework.tokens_per_sec,
    }
    if framework.tokens_per_sec is None or plain.tokens_per_sec is None:
        row["result"] = framework.status if not framework.ok else plain.status
    else:
        row["ratio"] = framework.tokens_per_sec / plain.tokens_per_sec
        row["result"] = "met" if row["ratio"] >= MIN_FRAMEWORK_RATIO else "MISSED"
    return Table("overhead", OVERHEAD_COLUMNS, [row])

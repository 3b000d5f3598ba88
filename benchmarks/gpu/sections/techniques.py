"""Techniques: the norm test, sequence-length warmup and simulated DiLoCo against the same training without them."""

import dataclasses
import json
from pathlib import Path
from typing import Any

from benchmarks.gpu.graph_count import GRAPH_COUNTER, GraphCounts
from benchmarks.gpu.runs import RunResult
from benchmarks.gpu.suite import Suite
from benchmarks.gpu.tables import Column, Table, decimals, percent, rate

NEVER_GROWS = [
    "technique.adaptive_batch.eta=1e6",
    "technique.adaptive_batch.theta=1e6",
    "technique.adaptive_batch.nu=1e6",
]
MAX_TECHNIQUE_OVERHEAD = 0.03
DILOCO_DEFAULT_H = 30  # technique.diloco.sync_every's default (conf/technique/diloco.yaml)


TECHNIQUE_COLUMNS = [
    Column("technique", "technique"),
    Column("baseline", "baseline"),
    Column("baseline_tokens_per_sec", "baseline tokens/s", rate),
    Column("tokens_per_sec", "with technique tokens/s", rate),
    Column("ratio", "ratio", decimals),
    Column("overhead", "overhead", percent),
    Column("result", f"target: overhead <= {MAX_TECHNIQUE_OVERHEAD:.0%}"),
    Column("note", "note"),
]


def short_curriculum(seq_len: int) -> list[str]:
    """Lengths L/4 and L/2 in the two warm-up steps, then L. Every length divides L, so in
    ``reshape`` mode each step trains on the baseline's tokens; the timed steps are at L."""
    return [
        "technique.seq_len_warmup.schedule_type=fixed_discrete",
        f"technique.seq_len_warmup.difficulty=[{seq_len // 4},{seq_len // 2},{seq_len}]",
        "technique.seq_len_warmup.max_step=[1,2]",
        "technique.seq_len_warmup.mode=reshape",
    ]


def technique_row(
    name: str, baseline_name: str, rate: float | None, baseline: RunResult, note: str, status: str = "ok"
) -> dict[str, Any]:
    row = {
        "technique": name,
        "baseline": baseline_name,
        "baseline_tokens_per_sec": baseline.tokens_per_sec,
        "tokens_per_sec": rate,
        "note": note,
    }
    if rate is None or baseline.tokens_per_sec is None:
        return {**row, "result": status if status != "ok" else baseline.status}
    ratio = rate / baseline.tokens_per_sec
    within = 1 - ratio <= MAX_TECHNIQUE_OVERHEAD
    return {**row, "ratio": ratio, "overhead": 1 - ratio, "result": "within" if within else "OVER"}


def rate_at_sync_every(turns: RunResult, with_outer: RunResult, measured_every: int, every: int) -> float | None:
    """DiLoCo's rate at another H: the per-step time without outer steps plus the outer
    step's cost, measured once per ``measured_every`` steps, spread over ``every`` steps."""
    if turns.tokens_per_sec is None or with_outer.tokens_per_sec is None:
        return None
    per_step, per_step_with_outer = 1 / turns.tokens_per_sec, 1 / with_outer.tokens_per_sec  # seconds per token
    return 1 / (per_step + (per_step_with_outer - per_step) * measured_every / every)


def recompile_note(path: Path, run: RunResult) -> tuple[str, dict[str, Any] | None]:
    """What the graph count says about the lengths after the first (it must be 0)."""
    if not run.ok or not path.is_file():
        return "graph count: not measured", None
    counts = GraphCounts(**json.loads(path.read_text()))
    new = counts.after_first_length()
    lengths = ", ".join(str(length) for length in counts.lengths())
    verdict = "ok" if new == 0 else "RECOMPILED"
    note = f"{new} graph(s) compiled after the first length ({verdict}); lengths {lengths}; {GRAPH_COUNTER}"
    return note, dataclasses.asdict(counts)


def techniques(suite: Suite) -> Table:
    """Each technique against the constant batch with the same tokens per optimizer step,
    in the plan's work layout (bf16 + compile on the GPU). DiLoCo runs twice: with no outer
    step in the timed steps (the cost of the replicas' turns) and with one (its cost),
    which together give its overhead at the experiment's H."""
    plan, args = suite.plan, suite.args
    batch, micro, sync_every = plan.global_batch, plan.work_micro_batch, max(1, args.steps // 2)
    work = suite.work_layout(plan.model)
    constant = [*work, "+experiment=constant_bs", f"batch.global_batch_size={batch}"]
    graphs_path = Path(args.out) / "dynamo_graph_counts.json"
    graphs_path.parent.mkdir(parents=True, exist_ok=True)
    graphs_path.unlink(missing_ok=True)
    baseline = suite.run(f"constant batch {batch}", constant, args.steps, args.warmup)
    norm = suite.run(
        "norm test",
        [*work, "+experiment=adaptive_bs", f"batch.global_batch_size={batch}", *NEVER_GROWS],
        args.steps,
        args.warmup,
    )
    warmup_overrides = [
        *constant,
        "+technique=seq_len_warmup",
        *short_curriculum(plan.seq_len),
        "+callbacks.graph_count._target_=benchmarks.gpu.graph_count.DynamoGraphCount",
        f"+callbacks.graph_count.path={graphs_path}",
    ]
    seq_len_warmup = suite.run("sequence-length warmup", warmup_overrides, args.steps, args.warmup)
    diloco = [*work, "+technique=diloco", f"batch.global_batch_size={2 * batch}"]
    never = args.warmup + args.steps + 1
    turns = suite.run(
        "simulated DiLoCo M=2, no outer step",
        [*diloco, f"technique.diloco.sync_every={never}"],
        args.steps,
        args.warmup,
    )
    outer = suite.run(
        f"simulated DiLoCo M=2, H={sync_every}",
        [*diloco, f"technique.diloco.sync_every={sync_every}"],
        args.steps,
        args.warmup,
    )
    recompiles, counts = recompile_note(graphs_path, seq_len_warmup)
    baseline_name = f"constant batch {batch}"
    warmup_row = technique_row(
        "sequence-length warmup",
        baseline_name,
        seq_len_warmup.tokens_per_sec,
        baseline,
        f"reshape mode, lengths L/4 and L/2 in the warm-up steps, then L; {recompiles}",
        seq_len_warmup.status,
    )
    warmup_row["dynamo_graph_counts"] = counts
    diloco_note = f"global batch {2 * batch}, each turn {batch}"
    at_h = rate_at_sync_every(turns, outer, sync_every, DILOCO_DEFAULT_H)
    rows = [
        technique_row(
            "norm test",
            baseline_name,
            norm.tokens_per_sec,
            baseline,
            f"tests every step on {batch // micro} micro-batch gradients; eta=theta=nu=1e6: the batch never grows",
            norm.status,
        ),
        warmup_row,
        technique_row(
            "simulated DiLoCo M=2, no outer step",
            baseline_name,
            turns.tokens_per_sec,
            baseline,
            f"{diloco_note}; H={never}: the replicas' turns only",
            turns.status,
        ),
        technique_row(
            f"simulated DiLoCo M=2, H={sync_every}",
            baseline_name,
            outer.tokens_per_sec,
            baseline,
            f"{diloco_note}; one outer step in the {args.steps} timed steps",
            outer.status,
        ),
        technique_row(
            f"simulated DiLoCo M=2 at H={DILOCO_DEFAULT_H}",
            baseline_name,
            at_h,
            baseline,
            f"derived from the two rows above: the outer step's cost spread over {DILOCO_DEFAULT_H} steps"
            " (the technique's default H)",
            turns.status if not turns.ok else outer.status,
        ),
    ]
    return Table("techniques", TECHNIQUE_COLUMNS, rows)

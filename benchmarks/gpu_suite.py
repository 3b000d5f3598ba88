"""The GPU benchmark in one call: layouts, correctness, technique overhead, framework overhead.

``scripts/benchmark_gpu.py`` runs this module. Within about nine minutes on one H100 it
measures, in one process and through the framework's own pieces (``benchmarks/loops.py``):

1. **layouts**: TinyLlama-1.1B at 2048 tokens, micro-batch x activation checkpointing x
   compile with the fused kernels on; micro_llama_300m and diloco_35m at the better of two
   layouts each;
2. **kernels**: TinyLlama at one layout with each choice of fused kernels (Liger's or
   Inductor's norm/SwiGLU/RoPE, Liger's or the chunked cross-entropy, the SDPA backend);
3. **mfu**: TinyLlama with the best kernels at the layouts the first two leave out: one
   micro-batch per step, bf16 parameters through FSDP2 (one cast per step), the whole model
   compiled;
4. **correctness**: per-step losses over 20 steps of bf16 against fp32, of FSDP1 and FSDP2
   on one device against one device, and of each fused path against the plain one, beside
   the spread of two identical runs (the GPU's reductions are not deterministic);
5. **techniques**: the norm test, sequence-length warmup (with Dynamo's count of graphs
   compiled after the first length) and simulated DiLoCo, each against the same training
   without it, under bf16 + compile;
6. **overhead**: the framework against a plain PyTorch loop with the same model and kernels.

Before each run Dynamo and the CUDA allocator are reset, so every run compiles and
allocates as a fresh process would (Inductor's on-disk cache stays: a graph compiled
before compiles faster, which only shortens untimed warm-up steps). A run that runs out
of memory, or fails, says so in its row and the suite goes on. The time budget is split
among the sections by their expected shares; a run whose expected time would pass its
section's deadline is reported as skipped, so one call never overruns. The report (a
markdown table per section and a JSON file with every number) is rewritten after each
section. ``docs/gpu_benchmark.md`` gives the plan, its time estimate and the command for a
bare GPU machine.
"""

import argparse
import dataclasses
import datetime
import gc
import itertools
import json
import logging
import platform
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch._dynamo
from torch._dynamo.utils import counters

from benchmarks.loops import benchmark_config, framework_run, plain_tokens_per_sec
from lightning_modules.step_callback import StepCallback
from lightning_modules.liger_kernels import liger_available
from lightning_modules.training_state import TrainingState

SECTIONS = ("layouts", "kernels", "mfu", "correctness", "techniques", "overhead")
ACTIVATION_CHECKPOINTING = ("none", "mlp", "full")
GRAPH_COUNTER = "torch._dynamo.utils.counters['stats']['unique_graphs']"
NEVER_GROWS = ["technique.adaptive_batch.eta=1e6", "technique.adaptive_batch.theta=1e6", "technique.adaptive_batch.nu=1e6"]
MAX_TECHNIQUE_OVERHEAD = 0.03
MIN_FRAMEWORK_RATIO = 0.98
REPORT_NAME = "benchmark_gpu"
# Each section's share of the time budget: its time on the H100 (docs/gpu_benchmark.md), rounded.
SHARES = {"layouts": 0.34, "kernels": 0.08, "mfu": 0.28, "correctness": 0.15, "techniques": 0.1, "overhead": 0.05}
DILOCO_EXPERIMENT_H = 30  # technique.diloco.sync_every of +experiment=diloco


# ---------------------------------------------------------------- what to run
@dataclass(frozen=True)
class Plan:
    """What one call runs: ``gpu_plan`` by default, ``quick_plan`` for the CPU smoke mode.

    ``work_micro_batch``, ``work_compile`` and ``work_kernels`` are the layout of the
    technique and overhead runs: micro-batches of 4 so that DiLoCo's five extra fp32 copies
    of TinyLlama (22 GB) still fit beside the activations on an 80 GB card, and Inductor's
    norm/SwiGLU/RoPE rather than Liger's, which Dynamo cannot compile with the dynamic
    shapes of sequence-length warmup (every technique run then has the baseline's kernels).
    ``kernel_layout`` (micro-batch, checkpointing, compile) is where the kernels section
    compares kernels: the fastest TinyLlama layout of the first H100 run.
    ``correctness_lr`` is TinyLlama's pretraining peak LR: the default recipe's 8e-3 (a
    0.8M model's) makes a 300M model's loss jump about within 20 steps, where any
    difference in rounding grows into a large loss difference and the checks test chaos.
    """

    name: str
    device: str
    base: tuple[str, ...]
    model: str
    small_models: tuple[str, ...]
    seq_len: int
    global_batch: int
    micro_batches: tuple[int, ...]
    work_micro_batch: int
    work_compile: str
    correctness_model: str
    correctness_batch: int
    correctness_lr: float
    precision: str
    kernels: tuple[str, ...]
    kernels_label: str
    work_kernels: tuple[str, ...]
    kernel_layout: tuple[int, str, str]
    run_seconds: float
    compile_seconds: float


def without_liger_modules(kernels: tuple[str, ...]) -> tuple[str, ...]:
    """The same kernels with Inductor's (or eager) norm, SwiGLU and RoPE in place of Liger's."""
    return tuple("layout.liger_kernels=false" if item == "layout.liger_kernels=true" else item for item in kernels)


def kernel_choice(device: str) -> tuple[tuple[str, ...], str]:
    """The fused kernels of every throughput run: Liger's where they can run (CUDA with
    liger-kernel installed), else the chunked cross-entropy; AdamW's fused kernel (on CPU
    the multi-tensor one)."""
    if device == "cuda" and liger_available():
        return ("layout.loss=liger", "layout.liger_kernels=true", "layout.fused_adamw=true"), (
            "liger CE + liger norm/SwiGLU/RoPE + fused AdamW"
        )
    adamw = "fused AdamW" if device == "cuda" else "foreach AdamW"
    return ("layout.loss=chunked", "layout.liger_kernels=false", "layout.fused_adamw=true"), f"chunked CE + {adamw}"


def gpu_plan() -> Plan:
    """TinyLlama-1.1B and two smaller models in bf16 on one GPU (estimates: docs/gpu_benchmark.md)."""
    if not torch.cuda.is_available():
        raise SystemExit("error: no CUDA device here; the CPU smoke mode is --quick.")
    kernels, label = kernel_choice("cuda")
    return Plan(
        name="gpu",
        device="cuda",
        base=("trainer=gpu", "data.source.max_tokens=2000000"),
        model="tinyllama_1b",
        small_models=("micro_llama_300m", "diloco_35m"),
        seq_len=2048,
        global_batch=16,
        micro_batches=(4, 8),
        work_micro_batch=4,
        work_compile="blocks",
        correctness_model="micro_llama_300m",
        correctness_batch=4,
        correctness_lr=4e-4,
        precision="bf16-mixed",
        kernels=kernels,
        kernels_label=label,
        work_kernels=without_liger_modules(kernels),
        kernel_layout=(8, "none", "blocks"),
        run_seconds=15.0,
        compile_seconds=25.0,
    )


def quick_plan() -> Plan:
    """The tiny model stands in for every model, in fp32 on CPU: the same sections
    and tables, in minutes, to check the suite itself."""
    kernels, label = kernel_choice("cpu")
    return Plan(
        name="quick (CPU, fp32; model=tiny stands in for every model)",
        device="cpu",
        base=("trainer.accelerator=cpu", "trainer.precision=32-true", "data.source.max_tokens=200000"),
        model="tiny",
        small_models=("tiny", "tiny"),
        seq_len=64,
        global_batch=8,
        micro_batches=(2, 4),
        work_micro_batch=2,
        work_compile="none",
        correctness_model="tiny",
        correctness_batch=4,
        correctness_lr=4e-4,
        precision="32-true",
        kernels=kernels,
        kernels_label=label,
        work_kernels=without_liger_modules(kernels),
        kernel_layout=(4, "none", "none"),
        run_seconds=5.0,
        compile_seconds=25.0,
    )


def override_value(overrides: list[str], key: str, default: str) -> str:
    """The value the last ``key=value`` override gives (Hydra applies the last one)."""
    values = [item.split("=", 1)[1] for item in overrides if item.split("=", 1)[0].lstrip("+~") == key]
    return values[-1] if values else default


# ---------------------------------------------------------------- one run
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
        cfg = benchmark_config(overrides, result.steps, result.warmup)
        if result.loop == "plain":
            result.tokens_per_sec = plain_tokens_per_sec(cfg, result.steps, result.warmup)
        else:
            measured = framework_run(cfg)
            for name in ("tokens_per_sec", "mfu", "hfu", "peak_memory_gb", "losses"):
                setattr(result, name, getattr(measured, name))
            if measured.tokens_per_sec is None:
                result.status = "no measurement (the run ended before its timed steps)"
    except Exception as error:  # one broken run must not cost the other rows of a 10-minute call
        message = " ".join(str(error).split()).replace("|", "/")  # one table cell
        result.status = "out of memory" if is_out_of_memory(error) else f"failed: {type(error).__name__}: {message}"[:300]
        if not is_out_of_memory(error):
            traceback.print_exc(file=sys.stderr)
    finally:
        result.seconds = time.perf_counter() - started
        release_process_group()
        reset_device_state()


# ---------------------------------------------------------------- Dynamo's graph count
def compiled_graphs() -> int:
    """Graphs Dynamo has compiled in this process so far (``torch._dynamo.reset`` does not
    clear the count: compare two readings). A recompilation is a new graph too."""
    return counters["stats"]["unique_graphs"]


@dataclass
class GraphCounts:
    """Dynamo's graph count over one run: before it, once training starts (after any
    full-length preallocation pass), and at the end of each optimizer step."""

    before: int
    at_train_start: int
    steps: list[tuple[int, int]]  # (sequence length trained on, graphs so far)

    def after_first_length(self) -> int:
        """Graphs compiled once the first length was compiled: counted from the preallocation
        pass when it compiled one (it runs the full length before step 1), else from the
        end of step 1."""
        first = self.at_train_start if self.at_train_start > self.before else self.steps[0][1]
        return self.steps[-1][1] - first

    def lengths(self) -> list[int]:
        return list(dict.fromkeys(length for length, _ in self.steps))


class DynamoGraphCount(StepCallback):
    """Records Dynamo's graph count through a run and writes it to ``path`` (JSON) at the end.

    Added to a run's config (``+callbacks.graph_count._target_=...``), so the run still goes
    through ``framework_run`` unchanged. Infrastructure callbacks come after the techniques,
    so ``on_train_start`` here reads the count after sequence-length warmup's preallocation.
    """

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self.counts = GraphCounts(before=compiled_graphs(), at_train_start=0, steps=[])

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.counts.at_train_start = compiled_graphs()

    def on_step_end(self, state: TrainingState) -> None:
        self.counts.steps.append((state.seq_len, compiled_graphs()))

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.path.write_text(json.dumps(dataclasses.asdict(self.counts)))


# ---------------------------------------------------------------- budget, runs, tables
class Budget:
    """Wall time since the suite started, split among the sections: section k may start runs
    until the sum of the shares of sections 1..k has passed, so time one section leaves
    goes to the next, and an overrunning section cannot starve the ones after it."""

    def __init__(self, seconds: float, shares: dict[str, float]) -> None:
        self.start = time.perf_counter()
        total = sum(shares.values())
        self.deadlines = {name: seconds * part / total for name, part in zip(shares, itertools.accumulate(shares.values()))}
        self.section = next(iter(shares))
        self.observed: dict[tuple, float] = {}

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def fits(self, cost_key: tuple, expected: float) -> bool:
        """A run fits if the longest run like it so far (or ``expected``) ends before the deadline."""
        return self.elapsed() + max(expected, self.observed.get(cost_key, 0.0)) <= self.deadlines[self.section]

    def record(self, cost_key: tuple, seconds: float) -> None:
        self.observed[cost_key] = max(seconds, self.observed.get(cost_key, 0.0))


@dataclass
class Column:
    key: str
    header: str
    format: Callable[[Any], str] = str


@dataclass
class Table:
    """One section's results: raw values per row (the JSON), formatted by column (the markdown)."""

    section: str
    columns: list[Column]
    rows: list[dict[str, Any]]

    def markdown(self) -> str:
        lines = [f"## {self.section}", "", "| " + " | ".join(c.header for c in self.columns) + " |"]
        lines.append("|" + "---|" * len(self.columns))
        for row in self.rows:
            cells = ["-" if row.get(c.key) is None else c.format(row[c.key]) for c in self.columns]
            lines.append("| " + " | ".join(cells) + " |")
        return "\n".join(lines)


def rate(value: float) -> str:
    return f"{value:,.0f}"


def percent(value: float) -> str:
    return f"{value:.1%}"


def decimals(value: float) -> str:
    return f"{value:.3f}"


def scientific(value: float) -> str:
    return f"{value:.2e}"


class Suite:
    """The runs of one call (each at most once: sections share baselines), the time budget and
    the progress log on stderr."""

    def __init__(self, plan: Plan, args: argparse.Namespace) -> None:
        self.plan, self.args = plan, args
        self.budget = Budget(args.budget_seconds, {name: SHARES[name] for name in args.sections})
        self.runs: dict[tuple, RunResult] = {}

    def log(self, message: str) -> None:
        print(f"[{self.budget.elapsed():6.1f} s] {message}", file=sys.stderr, flush=True)

    def overrides(self, model: str, *extra: str) -> list[str]:
        """Every run's overrides: the plan's base, the model, the packed length, shared cache."""
        cache = [f"paths.cache_dir={self.args.cache_dir}"] if self.args.cache_dir else []
        peak = [f"callbacks.throughput.peak_flops_per_device={self.args.peak_flops}"] if self.args.peak_flops else []
        return [*self.plan.base, *cache, *peak, f"model={model}", f"data.seq_len={self.plan.seq_len}", *extra]

    def run(self, label: str, overrides: list[str], steps: int, warmup: int, loop: str = "framework",
            every_step: bool = False, repeat: int = 0) -> RunResult:  # fmt: skip
        """Run once (or return the earlier result of the same run; ``repeat`` > 0 trains it
        again); skipped when it would pass the section's deadline."""
        key = (loop, steps, warmup, every_step, repeat, *overrides)
        if key in self.runs:
            return self.runs[key]
        result = RunResult(label, overrides, loop, steps, warmup)
        compile_mode = override_value(overrides, "layout.compile", "none")
        cost_key = (loop, steps + warmup, override_value(overrides, "model", "tiny"), compile_mode,
                    override_value(overrides, "trainer.precision", self.plan.precision))  # fmt: skip
        expected = self.plan.run_seconds + (self.plan.compile_seconds if compile_mode != "none" else 0.0)
        if self.budget.fits(cost_key, expected):
            self.log(f"{self.budget.section}: {label} ...")
            measure(result, every_step)
            self.budget.record(cost_key, result.seconds)
        else:
            result.status = "skipped (time budget)"
        self.log(f"{self.budget.section}: {label}: {result.summary()} ({result.seconds:.1f} s)")
        self.runs[key] = result
        return result


# ---------------------------------------------------------------- 1. layouts
TOKENS, MFU = Column("tokens_per_sec", "tokens/s", rate), Column("mfu", "MFU", percent)
PEAK, STATUS = Column("peak_memory_gb", "peak GB", lambda v: f"{v:.1f}"), Column("status", "status")
LAYOUT_COLUMNS = [
    Column("model", "model"),
    Column("micro_batch", "micro-batch"),
    Column("activation_checkpointing", "act. ckpt"),
    Column("compile", "compile"),
    Column("kernels", "kernels"),
    TOKENS, MFU, Column("hfu", "HFU", percent), PEAK, STATUS,
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
        "tokens_per_sec": run.tokens_per_sec,
        "mfu": run.mfu,
        "hfu": run.hfu,
        "peak_memory_gb": run.peak_memory_gb,
        "status": run.status,
    }


def mark_best(rows: list[dict[str, Any]], first: int) -> None:
    """Mark the fastest finished row of each model from row ``first`` on (a search's rows)."""
    for model in dict.fromkeys(row["model"] for row in rows[first:]):
        finished = [row for row in rows[first:] if row["model"] == model and row["tokens_per_sec"] is not None]
        if finished:
            best = max(finished, key=lambda row: row["tokens_per_sec"])
            best["status"] += " (best)"


def layouts(suite: Suite) -> Table:
    """The main model over micro-batch x checkpointing x compile at a fixed global batch;
    then each smaller model with and without compile, at one micro-batch per step and no
    checkpointing (activations of models this small fit: only speed is in question)."""
    plan = suite.plan
    # Checkpointing outermost: the rows without it (the likely fastest where memory allows)
    # run first, so a tight budget skips the recomputing layouts rather than the fast ones.
    grid = itertools.product(ACTIVATION_CHECKPOINTING, plan.micro_batches, ("none", "blocks"))
    rows = [layout_row(suite, plan.model, micro, checkpointing, compile_mode) for checkpointing, micro, compile_mode in grid]
    mark_best(rows, 0)
    searched_from = len(rows)
    for model in plan.small_models:
        rows += [layout_row(suite, model, plan.global_batch, "none", compile_mode) for compile_mode in ("none", "blocks")]
    mark_best(rows, searched_from)
    return Table("layouts", LAYOUT_COLUMNS, rows)


# ---------------------------------------------------------------- 2. kernels
KERNEL_COLUMNS = [Column("variant", "kernels"), Column("layout", "layout"), TOKENS,
                  Column("ratio", "vs first row", decimals), MFU, PEAK, STATUS]  # fmt: skip


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
        ("liger CE + torch norm/SwiGLU/RoPE + cuDNN attention",
         [*liger_loss, "layout.liger_kernels=false", "layout.attention_backend=cudnn"], no_liger or no_cudnn),
        ("chunked CE + torch norm/SwiGLU/RoPE",
         ["layout.loss=chunked", "layout.fused_adamw=true", "layout.liger_kernels=false"], None),
    ]  # fmt: skip


def kernels(suite: Suite) -> Table:
    """The main model at ``plan.kernel_layout`` with each kernel choice (fused AdamW in all);
    the ratio is against the first row that ran."""
    plan, args = suite.plan, suite.args
    micro, checkpointing, compile_mode = plan.kernel_layout
    layout = f"micro {micro}, ckpt {checkpointing}, compile {compile_mode}"
    base = suite.overrides(plan.model, f"batch.global_batch_size={plan.global_batch}", f"batch.micro_batch_size={micro}",
                           f"layout.activation_checkpointing={checkpointing}", f"layout.compile={compile_mode}")  # fmt: skip
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


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """Each measured row's tokens/s as a ratio against the first row that measured any."""
    measured = [row for row in rows if row.get("tokens_per_sec") is not None]
    for row in measured:
        row["ratio"] = row["tokens_per_sec"] / measured[0]["tokens_per_sec"]


# ---------------------------------------------------------------- 3. mfu
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


# ---------------------------------------------------------------- 4. correctness
CORRECTNESS_COLUMNS = [
    Column("check", "check"),
    Column("model", "model"),
    Column("steps", "steps compared"),
    Column("max_abs_diff", "max abs diff", scientific),
    Column("max_rel_diff", "max rel diff", scientific),
    Column("tolerance", "tolerance (abs)", scientific),
    Column("result", "result"),
]


def loss_differences(reference: RunResult, other: RunResult) -> dict[str, Any]:
    """Largest absolute and relative difference of the per-step losses of two runs."""
    steps = sorted(set(reference.losses) & set(other.losses))
    if not steps:
        return {"steps": 0, "max_abs_diff": None, "max_rel_diff": None}
    differences = [abs(other.losses[step] - reference.losses[step]) for step in steps]
    relative = [difference / abs(reference.losses[step]) for step, difference in zip(steps, differences)]
    return {"steps": len(steps), "max_abs_diff": max(differences), "max_rel_diff": max(relative)}


@dataclass(frozen=True)
class Check:
    """Two runs whose per-step losses are compared: ``compared`` against ``reference`` (the
    same overrides again when ``repeat``: the spread of identical runs); ``unavailable`` says
    why it cannot run here."""

    name: str
    reference: list[str]
    compared: list[str]
    unavailable: str | None = None
    repeat: bool = False


def correctness_checks(suite: Suite) -> list[Check]:
    plan = suite.plan
    batch = plan.correctness_batch
    base = suite.overrides(
        plan.correctness_model,
        f"batch.global_batch_size={batch}",
        f"batch.micro_batch_size={batch}",
        "layout.loss=plain",
        "layout.liger_kernels=false",
        "layout.compile=none",
        "layout.activation_checkpointing=none",
        "layout.fused_adamw=true",
        f"optimizer.lr={plan.correctness_lr}",
    )
    reference = [*base, f"trainer.precision={plan.precision}"]
    no_liger = None if plan.device == "cuda" and liger_available() else "skipped: needs liger-kernel and CUDA"
    no_fsdp1 = None if plan.device == "cuda" else "skipped: FSDP1 needs CUDA (Lightning refuses FSDP1 on CPU)"
    fp32, bf16 = [*base, "trainer.precision=32-true"], [*base, "trainer.precision=bf16-mixed"]
    one_device = ["trainer.devices=1"]
    spreads = [Check("fp32 against the same fp32 run again", fp32, fp32, repeat=True)]
    if reference != fp32:
        spreads.append(Check(f"{plan.precision} against the same run again", reference, reference, repeat=True))
    return [
        *spreads,
        Check("bf16-mixed against fp32 (32-true)", fp32, bf16),
        Check("loss=chunked against plain", reference, [*reference, "layout.loss=chunked"]),
        Check("loss=liger against plain", reference, [*reference, "layout.loss=liger"], no_liger),
        Check("liger_kernels=true against off", reference, [*reference, "layout.liger_kernels=true"], no_liger),
        Check("compile=model against none", reference, [*reference, "layout.compile=model"]),
        Check("strategy=fsdp2 (1 device) against single device", reference, [*reference, "strategy=fsdp2", *one_device]),
        Check("strategy=fsdp (FSDP1, 1 device) against single device", reference, [*reference, "strategy=fsdp", *one_device],
              no_fsdp1),
    ]  # fmt: skip


def correctness(suite: Suite) -> Table:
    """Each check trains both runs ``--correctness-steps`` steps from the same seed and data,
    logging the loss every step; the reference run is shared by the checks that use it."""
    rows = []
    steps = suite.args.correctness_steps
    for check in correctness_checks(suite):
        row = {"check": check.name, "model": suite.plan.correctness_model, "tolerance": suite.args.tolerance}
        if check.unavailable:
            rows.append({**row, "steps": 0, "result": check.unavailable})
            continue
        reference = suite.run(f"{check.name}: reference", check.reference, steps, 0, every_step=True)
        compared = suite.run(f"{check.name}: compared", check.compared, steps, 0, every_step=True, repeat=int(check.repeat))
        row.update(loss_differences(reference, compared))
        failed = next((run.status for run in (reference, compared) if not run.ok), None)
        within = row["max_abs_diff"] is not None and row["max_abs_diff"] <= suite.args.tolerance
        row["result"] = failed or ("pass" if within else "FAIL")
        row["reference_losses"], row["compared_losses"] = reference.losses, compared.losses
        rows.append(row)
    return Table("correctness", CORRECTNESS_COLUMNS, rows)


# ---------------------------------------------------------------- 5. techniques
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


def technique_row(name: str, baseline_name: str, rate: float | None, baseline: RunResult, note: str,
                  status: str = "ok") -> dict[str, Any]:  # fmt: skip
    row = {"technique": name, "baseline": baseline_name, "baseline_tokens_per_sec": baseline.tokens_per_sec,
           "tokens_per_sec": rate, "note": note}  # fmt: skip
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
    work = suite.overrides(plan.model, f"batch.micro_batch_size={micro}", f"layout.compile={plan.work_compile}",
                           "layout.activation_checkpointing=none", *plan.work_kernels)  # fmt: skip
    constant = [*work, "+experiment=constant_bs", f"batch.global_batch_size={batch}"]
    graphs_path = Path(args.out) / "dynamo_graph_counts.json"
    graphs_path.parent.mkdir(parents=True, exist_ok=True)
    graphs_path.unlink(missing_ok=True)
    baseline = suite.run(f"constant batch {batch}", constant, args.steps, args.warmup)
    norm = suite.run("norm test", [*work, "+experiment=adaptive_bs", f"batch.global_batch_size={batch}", *NEVER_GROWS],
                     args.steps, args.warmup)  # fmt: skip
    warmup_overrides = [*constant, "+technique=seq_len_warmup", *short_curriculum(plan.seq_len),
                        "+callbacks.graph_count._target_=benchmarks.gpu_suite.DynamoGraphCount",
                        f"+callbacks.graph_count.path={graphs_path}"]  # fmt: skip
    seq_len_warmup = suite.run("sequence-length warmup", warmup_overrides, args.steps, args.warmup)
    diloco = [*work, "+experiment=diloco", f"batch.global_batch_size={2 * batch}"]
    never = args.warmup + args.steps + 1
    turns = suite.run("simulated DiLoCo M=2, no outer step", [*diloco, f"technique.diloco.sync_every={never}"],
                      args.steps, args.warmup)  # fmt: skip
    outer = suite.run(f"simulated DiLoCo M=2, H={sync_every}", [*diloco, f"technique.diloco.sync_every={sync_every}"],
                      args.steps, args.warmup)  # fmt: skip
    recompiles, counts = recompile_note(graphs_path, seq_len_warmup)
    baseline_name = f"constant batch {batch}"
    warmup_row = technique_row("sequence-length warmup", baseline_name, seq_len_warmup.tokens_per_sec, baseline,
                               f"reshape mode, lengths L/4 and L/2 in the warm-up steps, then L; {recompiles}",
                               seq_len_warmup.status)  # fmt: skip
    warmup_row["dynamo_graph_counts"] = counts
    diloco_note = f"global batch {2 * batch}, each turn {batch}"
    at_h = rate_at_sync_every(turns, outer, sync_every, DILOCO_EXPERIMENT_H)
    rows = [
        technique_row("norm test", baseline_name, norm.tokens_per_sec, baseline,
                      f"tests every step on {batch // micro} micro-batch gradients; eta=theta=nu=1e6: the batch never grows",
                      norm.status),
        warmup_row,
        technique_row("simulated DiLoCo M=2, no outer step", baseline_name, turns.tokens_per_sec, baseline,
                      f"{diloco_note}; H={never}: the replicas' turns only", turns.status),
        technique_row(f"simulated DiLoCo M=2, H={sync_every}", baseline_name, outer.tokens_per_sec, baseline,
                      f"{diloco_note}; one outer step in the {args.steps} timed steps", outer.status),
        technique_row(f"simulated DiLoCo M=2 at H={DILOCO_EXPERIMENT_H}", baseline_name, at_h, baseline,
                      f"derived from the two rows above: the outer step's cost spread over {DILOCO_EXPERIMENT_H} steps"
                      " (+experiment=diloco's H)", turns.status if not turns.ok else outer.status),
    ]  # fmt: skip
    return Table("techniques", TECHNIQUE_COLUMNS, rows)


# ---------------------------------------------------------------- 5. framework overhead
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
    overrides = suite.overrides(plan.model, f"batch.global_batch_size={plan.global_batch}",
                                f"batch.micro_batch_size={plan.work_micro_batch}", f"layout.compile={plan.work_compile}",
                                "layout.activation_checkpointing=none", *plan.work_kernels)  # fmt: skip
    framework = suite.run("framework loop", overrides, args.steps, args.warmup)
    plain = suite.run("plain PyTorch loop", overrides, args.steps, args.warmup, loop="plain")
    row = {"model": plan.model, "plain_tokens_per_sec": plain.tokens_per_sec,
           "framework_tokens_per_sec": framework.tokens_per_sec}  # fmt: skip
    if framework.tokens_per_sec is None or plain.tokens_per_sec is None:
        row["result"] = framework.status if not framework.ok else plain.status
    else:
        row["ratio"] = framework.tokens_per_sec / plain.tokens_per_sec
        row["result"] = "met" if row["ratio"] >= MIN_FRAMEWORK_RATIO else "MISSED"
    return Table("overhead", OVERHEAD_COLUMNS, [row])


SECTION_RUNNERS: dict[str, Callable[[Suite], Table]] = {
    "layouts": layouts,
    "kernels": kernels,
    "mfu": mfu,
    "correctness": correctness,
    "techniques": techniques,
    "overhead": overhead,
}


# ---------------------------------------------------------------- report
def device_name(plan: Plan) -> str:
    if plan.device == "cuda":
        return torch.cuda.get_device_name()
    return f"CPU ({platform.machine()}, {torch.get_num_threads()} threads)"


def header(suite: Suite) -> dict[str, Any]:
    plan, args = suite.plan, suite.args
    return {
        "device": device_name(plan),
        "date": datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
        "plan": plan.name,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "liger_available": liger_available(),
        "kernels": plan.kernels_label,
        "work_kernels": list(plan.work_kernels),
        "sections": args.sections,
        "steps": args.steps,
        "warmup": args.warmup,
        "correctness_steps": args.correctness_steps,
        "global_batch": plan.global_batch,
        "seq_len": plan.seq_len,
        "tolerance": args.tolerance,
        "budget_seconds": args.budget_seconds,
        "elapsed_seconds": round(suite.budget.elapsed(), 1),
    }


def markdown(head: dict[str, Any], tables: list[Table]) -> str:
    title = f"# GPU benchmark: {head['device']}, {head['date']}"
    settings = (
        f"plan {head['plan']}; torch {head['torch']} (CUDA {head['cuda'] or 'none'}), Python {head['python']};"
        f" kernels: {head['kernels']} (techniques and overhead: {' '.join(head['work_kernels'])});"
        f" {head['warmup']} warm-up + {head['steps']} timed steps per throughput run,"
        f" global batch {head['global_batch']} x {head['seq_len']} tokens; correctness over {head['correctness_steps']}"
        f" steps; budget {head['budget_seconds']:.0f} s, took {head['elapsed_seconds']:.0f} s."
    )
    return "\n\n".join([title, settings, *(table.markdown() for table in tables)]) + "\n"


def write_report(suite: Suite, tables: list[Table]) -> str:
    """Write the markdown and the JSON (every number, every run) to ``--out``; return the markdown."""
    out = Path(suite.args.out)
    out.mkdir(parents=True, exist_ok=True)
    head = header(suite)
    text = markdown(head, tables)
    (out / f"{REPORT_NAME}.md").write_text(text)
    data = {
        "header": head,
        "sections": {table.section: table.rows for table in tables},
        "runs": [dataclasses.asdict(run) for run in suite.runs.values()],
    }
    (out / f"{REPORT_NAME}.json").write_text(json.dumps(data, indent=1, default=str))
    return text


# ---------------------------------------------------------------- command line
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--sections", default=",".join(SECTIONS), help=f"comma-separated, run in this order; of {', '.join(SECTIONS)}")
    add("--steps", type=int, default=None, help="timed optimizer steps per throughput run, even (default 4; --quick 2)")
    add("--warmup", type=int, default=2, help="untimed steps first, even, >= 2 (the length curriculum's)")
    add("--correctness-steps", type=int, default=None, help="steps per correctness run (default 20; --quick 3)")
    add("--out", type=Path, default=Path("outputs/benchmark_gpu"), help="folder for the .md and .json")
    add("--quick", action="store_true", help="CPU smoke mode: the tiny model in fp32, a few steps per run")
    add("--budget-seconds", type=float, default=540.0, help="start no run that would end after this")
    add("--tolerance", type=float, default=2e-2, help="largest per-step loss difference that passes (absolute)")
    add("--cache-dir", type=Path, default=None, help="token cache shared by the runs (default: paths.cache_dir)")
    add("--peak-flops", type=float, default=None, help="peak FLOP/s per device for MFU (default: the GPU table)")
    args = parser.parse_args(argv)
    args.sections = [name.strip() for name in args.sections.split(",") if name.strip()]
    unknown = [name for name in args.sections if name not in SECTIONS]
    if unknown or not args.sections:
        parser.error(f"--sections: unknown {unknown}; choose from {', '.join(SECTIONS)}")
    args.steps = args.steps if args.steps is not None else (2 if args.quick else 4)
    args.correctness_steps = args.correctness_steps if args.correctness_steps is not None else (3 if args.quick else 20)
    if args.steps < 2 or args.steps % 2 or args.warmup < 2 or args.warmup % 2:
        parser.error("--steps and --warmup must be even and >= 2: simulated DiLoCo's turns come in pairs, and the"
                     " length curriculum needs two warm-up steps")  # fmt: skip
    return args


@contextmanager
def quiet_lightning() -> Iterator[None]:
    """Keep the progress log readable: Lightning's per-run notices (devices, tips) go, and
    come back afterwards (the suite also runs inside test processes)."""
    loggers = [logging.getLogger(name) for name in ("lightning.pytorch", "lightning.fabric")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    plan = quick_plan() if args.quick else gpu_plan()
    suite = Suite(plan, args)
    sections = ", ".join(args.sections)
    suite.log(f"{device_name(plan)}; plan {plan.name}; sections {sections}; budget {args.budget_seconds:.0f} s")
    tables: list[Table] = []
    text = ""
    with quiet_lightning():
        for section in args.sections:
            suite.budget.section = section
            tables.append(SECTION_RUNNERS[section](suite))
            text = write_report(suite, tables)
    print(text)
    suite.log(f"wrote {args.out / REPORT_NAME}.md and .json")

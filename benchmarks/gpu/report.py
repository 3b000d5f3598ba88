"""The call's report: a markdown table per section and a JSON file with every number."""

import dataclasses
import datetime
import importlib.metadata
import json
import platform
from pathlib import Path
from typing import Any

import torch

from benchmarks.gpu.plan import Plan
from benchmarks.gpu.suite import Suite
from benchmarks.gpu.tables import Table
from lightning_modules.liger_kernels import liger_available

REPORT_NAME = "benchmark_gpu"


def device_name(plan: Plan) -> str:
    if plan.device == "cuda":
        return torch.cuda.get_device_name()
    return f"CPU ({platform.machine()}, {torch.get_num_threads()} threads)"


def torchao_version() -> str | None:
    try:
        return importlib.metadata.version("torchao")
    except importlib.metadata.PackageNotFoundError:
        return None


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
        "torchao": torchao_version(),
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
        f"plan {head['plan']}; torch {head['torch']} (CUDA {head['cuda'] or 'none'}), torchao {head['torchao']},"
        f" Python {head['python']};"
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

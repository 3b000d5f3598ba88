"""Running lm-eval tasks on an `LM`: this project's local tasks and lm-eval's own, by name.

Local tasks (such as `corpus_cloze`) are YAML files in a folder that lm-eval indexes
through `TaskManager(include_path=...)`; lm-eval's built-in tasks (hellaswag, piqa,
arc_easy, lambada_openai, ...) are indexed only when one is asked for (indexing them
takes seconds), and download their data from the Hugging Face Hub, so they need a network.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lm_eval import simple_evaluate
from lm_eval.api.model import LM
from lm_eval.tasks import TaskManager

# lm-eval names each result "<metric>,<filter>"; "none" is the filter of tasks without one.
NO_FILTER = "none"
STDERR_SUFFIX = "_stderr"


@dataclass(frozen=True)
class TaskSpec:
    """A task lm-eval loads by name; `include_path` is the folder of its YAML when the task
    is not one of lm-eval's own."""

    name: str
    include_path: Path | None = None


@dataclass(frozen=True)
class MetricRow:
    """One metric of one task, as lm-eval reports it (stderr None where it gives none)."""

    task: str
    metric: str
    value: float
    stderr: float | None


def task_manager(tasks: Sequence[TaskSpec]) -> TaskManager:
    """lm-eval's index of these tasks: their folders, and its built-in tasks only if needed."""
    include_paths = [str(task.include_path) for task in tasks if task.include_path is not None]
    built_in_needed = any(task.include_path is None for task in tasks)
    return TaskManager(include_path=include_paths or None, include_defaults=built_in_needed)


def known_task_names() -> list[str]:
    """Every task, group and tag name lm-eval knows of its own."""
    return TaskManager().all_tasks


def run_tasks(lm: LM, tasks: Sequence[TaskSpec], limit: int | None = None) -> dict[str, Any]:
    """lm-eval's results dict (`simple_evaluate`) for zero-shot runs of these tasks.

    `limit` caps the documents per task (for quick checks; the metrics are then not the
    published ones). Seeds are lm-eval's fixed defaults, so a run is repeatable.
    """
    return simple_evaluate(
        model=lm,
        tasks=[task.name for task in tasks],
        task_manager=task_manager(tasks),
        limit=limit,
        log_samples=False,
    )


def evaluate(lm: LM, tasks: Sequence[TaskSpec], limit: int | None = None) -> dict[str, dict[str, float]]:
    """{task: {metric: value}} for these tasks, e.g. {"corpus_cloze": {"acc": 0.31, "acc_norm": 0.34}}."""
    values: dict[str, dict[str, float]] = {}
    for row in metric_rows(run_tasks(lm, tasks, limit)):
        values.setdefault(row.task, {})[row.metric] = row.value
    return values


def metric_rows(results: dict[str, Any]) -> list[MetricRow]:
    """The metrics of lm-eval's results dict, with their standard errors beside them.

    A metric computed under a filter other than "none" (generation tasks) is named
    "<metric>,<filter>".
    """
    rows = []
    for task, entries in results["results"].items():
        for key, value in entries.items():
            metric, _, filter_name = key.partition(",")
            if not filter_name or metric.endswith(STDERR_SUFFIX) or not isinstance(value, (int, float)):
                continue
            stderr = entries.get(f"{metric}{STDERR_SUFFIX},{filter_name}")
            stderr = float(stderr) if isinstance(stderr, (int, float)) else None  # lm-eval writes "N/A" for none
            rows.append(MetricRow(task, metric if filter_name == NO_FILTER else key, float(value), stderr))
    return rows

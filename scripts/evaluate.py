"""Evaluate a checkpoint of this project with lm-evaluation-harness.

    python scripts/evaluate.py CHECKPOINT --tasks corpus_cloze[,hellaswag,piqa,arc_easy,...]
        [--limit N] [--batch-size B] [--out FILE.json] [--device cpu|cuda]

CHECKPOINT is a `.ckpt` file or a sharded checkpoint folder. The tokenizer and corpus are
rebuilt from the data settings it holds. `corpus_cloze` is built offline from the run's
held-out documents; any other name is one of lm-eval's own tasks (hellaswag, piqa,
arc_easy, lambada_openai, ...), whose data comes from the Hugging Face Hub (a network is
needed once). Prints a table of the metrics and writes lm-eval's results as JSON, with the
checkpoint's path, step and tokens (default: beside the checkpoint, `<name>.eval.json`).
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from pathlib import Path
from typing import Any

import torch

from common.errors import ConfigError
from common.extras import needs_extra
from launch.cli import exit_code

with needs_extra("scripts/evaluate.py"):
    from lm_eval.utils import handle_non_serializable

    from evaluation.checkpoint import EvaluationCheckpoint, load_checkpoint_for_evaluation
    from evaluation.corpus_cloze import DEFAULT_K, TASK_NAME, build_corpus_cloze_task
    from evaluation.harness import MetricRow, TaskSpec, known_task_names, metric_rows, run_tasks
    from evaluation.lm_adapter import DEFAULT_BATCH_SIZE, LlamaLM

LOCAL_TASKS = (TASK_NAME,)


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", type=Path, help=".ckpt file or sharded checkpoint folder")
    parser.add_argument("--tasks", required=True, help=f"comma-separated: {TASK_NAME} and/or lm-eval task names")
    parser.add_argument("--limit", type=positive_int, default=None, help="at most N documents per task (quick checks)")
    parser.add_argument("--batch-size", type=positive_int, default=DEFAULT_BATCH_SIZE, help="sequences per forward")
    parser.add_argument("--out", type=Path, default=None, help="results JSON (default: CHECKPOINT's .eval.json)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--max-length", type=positive_int, default=None, help="model window (default: train seq_len)")
    parser.add_argument("--cloze-k", type=positive_int, default=DEFAULT_K, help=f"{TASK_NAME}: number of items")
    parser.add_argument("--cloze-seed", type=int, default=0, help=f"{TASK_NAME}: seed choosing the items")
    parser.add_argument("--cache-dir", type=Path, default=None, help="data cache folder (default: the run's)")
    parser.add_argument(
        "--allow-stale-weights",
        action="store_true",
        help="evaluate a checkpoint whose weights are not its run's final ones (a DiLoCo group that ended behind)",
    )
    return parser.parse_args(argv)


def task_names(tasks: str) -> list[str]:
    """The requested task names, checked before the checkpoint is loaded: a typo fails early, with a suggestion."""
    names = [name.strip() for name in tasks.split(",") if name.strip()]
    if not names:
        raise ConfigError("--tasks is empty; name at least one task, e.g. --tasks corpus_cloze")
    public = [name for name in names if name not in LOCAL_TASKS]
    known = set(known_task_names()) if public else set()
    for name in public:
        if name not in known:
            close = difflib.get_close_matches(name, [*LOCAL_TASKS, *known], n=3)
            hint = f"did you mean {', '.join(close)}? " if close else ""
            raise ConfigError(
                f"unknown task {name!r} in --tasks; {hint}use {TASK_NAME} or a task lm-eval knows "
                "(list them with: lm-eval ls tasks)"
            )
    return names


def task_spec(name: str, checkpoint: EvaluationCheckpoint, args: argparse.Namespace) -> TaskSpec:
    """corpus_cloze is built from the checkpoint's corpus; other names go to lm-eval as they are."""
    if name == TASK_NAME:
        return build_corpus_cloze_task(checkpoint.data_settings, k=args.cloze_k, seed=args.cloze_seed)
    return TaskSpec(name)


def format_table(rows: list[MetricRow]) -> str:
    """task, metric, value and stderr, one metric a line, in aligned columns."""
    lines = [("task", "metric", "value", "stderr")]
    lines += [(r.task, r.metric, f"{r.value:.4f}", "" if r.stderr is None else f"{r.stderr:.4f}") for r in rows]
    widths = [max(len(line[column]) for line in lines) for column in range(4)]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip() for line in lines)


def report(results: dict[str, Any], checkpoint: EvaluationCheckpoint) -> dict[str, Any]:
    """lm-eval's results, with which checkpoint (and how far into training) they describe."""
    return {
        "checkpoint": str(checkpoint.path),
        "step": checkpoint.clock.get("steps"),
        "tokens": checkpoint.clock.get("tokens"),
        **results,
    }


def evaluate_checkpoint(args: argparse.Namespace) -> None:
    names = task_names(args.tasks)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda, but no GPU is visible; use --device cpu")
    checkpoint = load_checkpoint_for_evaluation(args.checkpoint, args.device, args.cache_dir, args.allow_stale_weights)
    max_length = args.max_length or checkpoint.data_settings["seq_len"]
    lm = LlamaLM(checkpoint.model, checkpoint.tokenizer, max_length=max_length, batch_size=args.batch_size)
    results = run_tasks(lm, [task_spec(name, checkpoint, args) for name in names], limit=args.limit)
    print(format_table(metric_rows(results)))
    out = args.out or args.checkpoint.with_suffix(".eval.json")
    out.write_text(json.dumps(report(results, checkpoint), indent=2, default=handle_non_serializable) + "\n")
    print(f"wrote {out}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return exit_code(lambda: evaluate_checkpoint(args))


if __name__ == "__main__":
    sys.exit(main())

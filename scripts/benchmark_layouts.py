"""Layout benchmark: train a few steps per layout and print tokens/s, MFU, HFU and memory.

Each layout is one ``train.py`` run (a fresh process, so peak memory is its own) with the
given overrides; the numbers are the Throughput callback's, read from the run's CSV log.
The global batch stays fixed, so layouts differ only in how the same work is done.

    # CPU, tiny model: micro-batch x activation checkpointing x compile (the default sweep)
    python scripts/benchmark_layouts.py --peak-flops 1e11
    # a GPU ablation in the spirit of Hagemann et al. 2023, Table 2
    python scripts/benchmark_layouts.py --steps 20 --global-batch 64 \\
        --sweep batch.micro_batch_size=1,2,4,8 --sweep layout.activation_checkpointing=none,mlp,full \\
        --sweep layout.compile=none,blocks -- model=tinyllama_1b data.seq_len=2048 trainer=gpu
"""

import argparse
import csv
import itertools
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_SWEEP = [
    "batch.micro_batch_size=4,16",
    "layout.activation_checkpointing=none,mlp,full",
    "layout.compile=none,blocks",
]
COLUMNS = ["tokens/s", "tokens/s/device", "MFU", "HFU", "peak memory GB"]
METRICS = ["perf/tokens_per_sec", "perf/tokens_per_sec_per_device", "perf/mfu", "perf/hfu", "perf/peak_memory_gb"]


def parse_sweep(items: list[str]) -> list[list[str]]:
    """['a=1,2', 'b=x,y'] -> every combination as override lists."""
    axes = []
    for item in items:
        key, _, values = item.partition("=")
        if not values:
            raise SystemExit(f"--sweep {item!r}: expected KEY=VALUE1,VALUE2,...")
        axes.append([f"{key}={value}" for value in values.split(",")])
    return [list(combination) for combination in itertools.product(*axes)]


def run_layout(layout: list[str], args: argparse.Namespace, run_dir: Path) -> dict[str, str]:
    """One training run; its last logged perf metrics, or the reason it failed."""
    overrides = [
        f"hydra.run.dir={run_dir}",
        f"batch.global_batch_size={args.global_batch}",
        f"trainer.max_steps={args.steps}",
        f"trainer.log_every_n_steps={args.steps}",  # one logged rate: over every step after the warm-up
        "trainer.num_sanity_val_steps=0",
        "logger=csv",
        "callbacks.validation_schedule.every_n_steps=1000000",
        "~callbacks.model_checkpoint",
        "~callbacks.last_checkpoint",
        "trainer.enable_checkpointing=false",
        f"callbacks.throughput.warmup_steps={args.warmup}",
        *([f"callbacks.throughput.peak_flops_per_device={args.peak_flops}"] if args.peak_flops else []),
        *args.overrides,
        *layout,
    ]
    result = subprocess.run(
        [sys.executable, str(REPO / "train.py"), *overrides], cwd=REPO, capture_output=True, text=True
    )
    if result.returncode != 0:
        reason = "out of memory" if "out of memory" in result.stderr.lower() else "failed"
        return {"status": f"{reason} (exit {result.returncode})", "log": result.stderr[-2000:]}
    with open(run_dir / "csv" / "metrics.csv") as file:
        rows = [row for row in csv.DictReader(file) if row.get("perf/tokens_per_sec")]
    return {"status": "ok", **{key: rows[-1].get(key, "") for key in METRICS}} if rows else {"status": "no data"}


def fmt(value: str, key: str) -> str:
    if not value:
        return "-"
    number = float(value)
    return f"{number:.1%}" if key in ("perf/mfu", "perf/hfu") else f"{number:,.0f}" if number > 100 else f"{number:.2f}"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sweep", action="append", help="KEY=V1,V2 (repeatable); default: " + " ".join(DEFAULT_SWEEP))
    parser.add_argument("--steps", type=int, default=8, help="optimizer steps per layout")
    parser.add_argument("--warmup", type=int, default=2, help="first steps left out of the measurement")
    parser.add_argument("--global-batch", type=int, default=16, help="sequences per optimizer step (fixed)")
    parser.add_argument("--peak-flops", type=float, default=None, help="peak FLOP/s per device (CPU / unlisted GPUs)")
    parser.add_argument(
        "--csv", type=Path, default=Path("outputs/layout_benchmark.csv"), help="where to write the table"
    )
    parser.add_argument("overrides", nargs="*", help="train.py overrides shared by every layout (after --)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.steps <= args.warmup + 1:
        raise SystemExit("--steps must exceed --warmup + 1 so that at least two steps are timed.")

    layouts = parse_sweep(args.sweep or DEFAULT_SWEEP)
    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        for index, layout in enumerate(layouts):
            print(f"running {' '.join(layout)} ...", file=sys.stderr, flush=True)
            result = run_layout(layout, args, Path(workdir) / str(index))
            if result["status"] != "ok" and os.environ.get("BENCHMARK_VERBOSE"):
                print(result.get("log", ""), file=sys.stderr)
            rows.append({"layout": " ".join(layout), **result})

    print(f"\n| layout | {' | '.join(COLUMNS)} | status |\n|---|{'---|' * len(COLUMNS)}---|")
    for row in rows:
        cells = [fmt(row.get(key, ""), key) for key in METRICS]
        print(f"| {row['layout']} | {' | '.join(cells)} | {row['status']} |")
    args.csv.parent.mkdir(parents=True, exist_ok=True)
    with open(args.csv, "w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=["layout", "status", *METRICS], extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    print(f"\nwrote {args.csv}", file=sys.stderr)


if __name__ == "__main__":
    main()

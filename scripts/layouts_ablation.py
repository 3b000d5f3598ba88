"""The layouts paper's ablation as one command (Hagemann et al. 2023): for a model, a number
of devices and a device memory, every layout of data x tensor x pipeline parallelism,
micro-batch, activation checkpointing, sequence parallelism and pipeline schedule; the
memory plan drops those that cannot fit (each said, with its plan), the survivors train a
few timed steps each, and one table and the paper's recommendations as claims with
verdicts are printed (and written to ``--out``). Every layout runs ``--repeats`` times, the
repeats interleaved, so the speed claims compare paired ratios (``benchmarks/layout_claims.py``).

    # CPU: 4 gloo processes, the tiny model (the table in docs/results.md)
    python scripts/layouts_ablation.py --devices 4 --device-memory-gib 0.045 --micro-batches 1,4 --repeats 3 \\
        --hardware "CPU, 4 gloo processes" -- model=tiny trainer.accelerator=cpu data.seq_len=128
    # GPUs: Llama-2 13B at 2,048 tokens on 8 GPUs of 80 GiB (docs/gpu_benchmark.md)
    python scripts/layouts_ablation.py --devices 8 --device-memory-gib 80 --global-batch 64 \\
        --micro-batches 1,2,4 --hardware "8x H100 80GB" -- model=llama2_13b data.seq_len=2048 trainer=gpu \\
        layout.fsdp_mixed_precision=true

Bad input (no layout survives, a device count below 1) is refused in one line, exit code 2,
before any run starts.
"""

import argparse
import shlex
import statistics
import sys
from pathlib import Path

from benchmarks.layout_claims import rate_range, verdicts
from benchmarks.layout_space import Planned, enumerate_layouts, plan_layouts
from benchmarks.loops import processes_run
from lightning_modules.layout_settings import ACTIVATION_CHECKPOINTING


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", type=int, required=True, help="processes (GPUs) every layout uses")
    parser.add_argument("--device-memory-gib", type=float, required=True, help="what the plan must fit in")
    parser.add_argument("--global-batch", type=int, default=16, help="sequences per optimizer step (fixed)")
    parser.add_argument("--micro-batches", default="1,2,4", help="comma-separated micro-batch sizes")
    parser.add_argument("--checkpointing", default="none,full", help="activation checkpointing modes, comma-separated")
    parser.add_argument("--steps", type=int, default=4, help="timed steps per layout and repeat")
    parser.add_argument(
        "--repeats", type=int, default=3, help="runs of every layout, interleaved (the speed claims' paired samples)"
    )
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps before them")
    parser.add_argument("--peak-flops", type=float, default=None, help="per device, for MFU on a CPU")
    parser.add_argument("--hardware", required=True, help="what the table was measured on, for its title")
    parser.add_argument("--out", type=Path, default=None, help="folder for layouts_ablation.md")
    parser.add_argument("--plan-only", action="store_true", help="print what fits, run nothing")
    parser.add_argument("overrides", nargs="*", help="train.py overrides after --")
    args = parser.parse_args(argv)
    if args.devices < 1:
        parser.exit(2, f"error: --devices={args.devices} must be at least 1.\n")
    if args.repeats < 1:
        parser.exit(
            2, f"error: --repeats={args.repeats} must be at least 1 (3 or more let the speed claims be tested).\n"
        )
    sizes = args.micro_batches.split(",")
    if not all(size.isdigit() and int(size) > 0 for size in sizes):
        parser.exit(2, f"error: --micro-batches={args.micro_batches} must be positive integers, e.g. 1,2,4.\n")
    args.micro_batches = [int(size) for size in sizes]
    args.checkpointing = tuple(args.checkpointing.split(","))
    unknown = sorted(set(args.checkpointing) - set(ACTIVATION_CHECKPOINTING))
    if unknown:
        parser.exit(2, f"error: --checkpointing has unknown modes {unknown}; choose from {ACTIVATION_CHECKPOINTING}.\n")
    return args


def refuse_empty(planned: list[Planned], device_gib: float) -> None:
    fitting = [entry for entry in planned if entry.refused is None]
    if fitting:
        return
    sized = [entry for entry in planned if entry.plan_gib]
    smallest = min(sized, key=lambda entry: entry.plan_gib) if sized else None
    need = f"; the smallest plan needs {smallest.plan_gib:.3g} GiB per device" if smallest else ""
    sys.stderr.write(f"error: no layout fits {device_gib:g} GiB per device{need}: give more memory or devices.\n")
    raise SystemExit(2)


def run(entry: Planned, args: argparse.Namespace) -> None:
    """One more repeat of a layout: its timed steps' rates join the others', its median is the
    repeat's rate; a layout that failed once is not run again."""
    if entry.measured.get("status", "ok") != "ok":
        return
    peak = [f"callbacks.throughput.peak_flops_per_device={args.peak_flops}"] if args.peak_flops else []
    try:
        result = processes_run([*entry.overrides, *peak], args.steps, args.warmup, every_step=True)
    except RuntimeError as error:
        entry.measured = {"status": str(error)}
        return
    measured = entry.measured
    measured["rates"] = [*measured.get("rates", []), *result.rates]
    measured["repeats"] = [*measured.get("repeats", []), statistics.median(result.rates)]
    measured.update(
        mfu=result.mfu, peak_gib=max(result.peak_memory_gb or 0.0, measured.get("peak_gib", 0.0)), status="ok"
    )


def row(entry: Planned, global_batch: int) -> str:
    layout = entry.layout
    cells = [
        layout.data,
        layout.tensor,
        "on" if layout.sequence_parallel else "-",
        layout.pipeline,
        layout.schedule,
        layout.micro_batch,
        layout.checkpointing,
        f"{layout.bubble(global_batch):.0%}",
        f"{entry.plan_gib:.3g}" if entry.plan_gib else "-",
    ]
    if entry.measured.get("rates"):
        low, median, high = rate_range(entry)
        mfu = entry.measured["mfu"]
        cells += [f"{median:,.0f} [{low:,.0f}, {high:,.0f}]", f"{mfu:.1%}" if mfu else "-"]
        cells += [f"{entry.measured['peak_gib']:.3g}", "ok"]
    else:
        cells += ["-", "-", "-", entry.refused or entry.measured.get("status", "fits")]
    return "| " + " | ".join(str(cell) for cell in cells) + " |"


HEADER = (
    "| D | T | SP | P | schedule | micro-batch | act. ckpt | bubble | plan GiB | tokens/s median [min, max]"
    " | MFU | peak GiB | status |\n|" + "---|" * 13
)


def report(planned: list[Planned], args: argparse.Namespace) -> str:
    lines = [
        f"## Layouts ablation: {args.hardware}",
        "",
        f"`{shlex.join(['python', 'scripts/layouts_ablation.py', *sys.argv[1:]])}`",
        "",
        (
            f"{args.devices} devices of {args.device_memory_gib:g} GiB, global batch {args.global_batch} sequences,"
            f" {args.repeats} interleaved repeats of {args.steps} timed steps after {args.warmup} (tokens/s: the median of"
            " every timed step, the range of them all); plan: the memory plan per device (the rank that needs"
            " the most); peak: the measured peak of rank 0 (on a CPU its resident memory, process overhead included)."
        ),
        "",
        HEADER,
        *(row(entry, args.global_batch) for entry in planned),
        "",
        "| claim | test | verdict | evidence |",
        "|---|---|---|---|",
        *(f"| {v.claim} | {v.test} | **{v.verdict}** | {v.evidence} |" for v in verdicts(planned)),
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    planned = plan_layouts(
        enumerate_layouts(args.devices, args.micro_batches, args.global_batch, args.checkpointing),
        args.overrides,
        args.global_batch,
        args.device_memory_gib,
    )
    refuse_empty(planned, args.device_memory_gib)
    for entry in planned:
        if entry.refused:
            print(f"left out: {row(entry, args.global_batch)}", flush=True)
    fitting = [entry for entry in planned if entry.refused is None]
    if args.plan_only:
        for entry in fitting:
            print(row(entry, args.global_batch), flush=True)
        return
    for repeat in range(args.repeats):  # interleaved: a drift in the machine's load falls on every layout alike
        for entry in fitting:
            run(entry, args)
            print(f"repeat {repeat + 1}/{args.repeats}: {row(entry, args.global_batch)}", flush=True)
    text = report(planned, args)
    print(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "layouts_ablation.md").write_text(text)


if __name__ == "__main__":
    main(sys.argv[1:])

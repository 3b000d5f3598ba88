"""The command line: which sections, how many steps, the time budget; runs them and writes the report."""

import argparse
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from benchmarks.gpu.plan import gpu_plan, quick_plan
from benchmarks.gpu.report import REPORT_NAME, device_name, write_report
from benchmarks.gpu.sections import (
    correctness,
    float8,
    kernels,
    large_model,
    layouts,
    mfu,
    norm_test,
    overhead,
    techniques,
    tensor_parallel,
)
from benchmarks.gpu.suite import Suite
from benchmarks.gpu.tables import Table

SECTION_RUNNERS: dict[str, Callable[[Suite], Table]] = {
    "layouts": layouts.layouts,
    "kernels": kernels.kernels,
    "mfu": mfu.mfu,
    "correctness": correctness.correctness,
    "techniques": techniques.techniques,
    "overhead": overhead.overhead,
    "float8": float8.float8,
    "float8_losses": float8.float8_losses,
    "norm_test": norm_test.norm_test,
    "large_model": large_model.large_model,
    "tensor_parallel": tensor_parallel.tensor_parallel,
}
SECTIONS = tuple(SECTION_RUNNERS)
# Each section's share of the time budget: its time on an H100 as a fraction of a 540 s call
# (docs/gpu_benchmark.md; the float8, norm test and large-model ones estimated before their
# first run), rounded. A call's deadlines scale its sections' shares to its budget.
SHARES = {
    "layouts": 0.34,
    "kernels": 0.08,
    "mfu": 0.28,
    "correctness": 0.15,
    "techniques": 0.1,
    "overhead": 0.05,
    "float8": 0.31,
    "float8_losses": 0.1,
    "norm_test": 0.19,
    "large_model": 0.22,
    "tensor_parallel": 0.3,
}


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
        parser.error(
            "--steps and --warmup must be even and >= 2: simulated DiLoCo's turns come in pairs, and the"
            " length curriculum needs two warm-up steps"
        )
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
    suite = Suite(plan, args, SHARES)
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

"""Framework overhead: the same model, kernels, data and batch through train.py's pieces and
through a minimal plain-PyTorch loop, alternated in one process; prints the tokens/s ratio.

    python scripts/benchmark_overhead.py                       # tiny model on CPU
    python scripts/benchmark_overhead.py --steps 30 -- trainer=gpu model=tinyllama_1b data.seq_len=2048

Both sides are described in ``benchmarks/loops.py``. The framework side runs the default
callbacks (validation schedule, throughput) but no checkpoint writes, no optimizer
statistics (extra work the plain loop does not do) and no logger of its own. Both leave
out the first ``--warmup`` steps.
"""

import argparse
import statistics
import sys

from benchmarks.loops import benchmark_settings, framework_run, plain_tokens_per_sec


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20, help="timed optimizer steps per run")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each side, alternated")
    parser.add_argument("overrides", nargs="*", help="train.py overrides (after --)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    settings = benchmark_settings(args.overrides, args.steps, args.warmup)

    framework, plain = [], []
    for repeat in range(args.repeats):
        framework.append(framework_run(settings).tokens_per_sec)
        plain.append(plain_tokens_per_sec(settings, args.steps, args.warmup))
        print(
            f"repeat {repeat + 1}: framework {framework[-1]:,.0f} tokens/s, plain {plain[-1]:,.0f} tokens/s",
            file=sys.stderr,
        )
    median_framework, median_plain = statistics.median(framework), statistics.median(plain)
    print("\n| loop | tokens/s (median) | runs |\n|---|---|---|")
    print(f"| plain PyTorch | {median_plain:,.0f} | {', '.join(f'{x:,.0f}' for x in plain)} |")
    print(f"| framework (train.py) | {median_framework:,.0f} | {', '.join(f'{x:,.0f}' for x in framework)} |")
    print(f"\nframework / plain = {median_framework / median_plain:.3f}")


if __name__ == "__main__":
    main()

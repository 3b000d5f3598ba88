"""Per-step cost of a technique against the same training without it, alternated in one process.

    python scripts/benchmark_technique_overhead.py                 # tiny model on CPU
    python scripts/benchmark_technique_overhead.py --steps 30 -- trainer=gpu model=tinyllama_1b

Pairs (technique vs baseline, same model, data and tokens per optimizer step):

- the adaptive norm test (and the inner-product test) testing every step, against the
  constant batch of the same size; eta is set so high that the batch never grows, so both
  sides do the same training work;
- simulated DiLoCo (M=2, H=30), every turn on B / M sequences, against plain training at
  batch B / M (the same work per optimizer step; the difference is the replica swaps and
  the outer steps).

Rates are the Throughput callback's tokens/s (medians over ``--repeats`` alternated runs).
The memory column counts fp32 copies of the (local shard of the) parameters or gradient.
"""

import argparse
import statistics
import sys

from benchmarks.loops import benchmark_settings, framework_run

NEVER_GROWS = [
    "technique.adaptive_batch.eta=1e6",
    "technique.adaptive_batch.theta=1e6",
    "technique.adaptive_batch.nu=1e6",
]


def pairs(batch: int, micro: int) -> dict[str, tuple[list[str], list[str], str]]:
    """name: (technique overrides, baseline overrides, memory it adds)."""
    constant = ["+experiment=constant_bs", f"batch.global_batch_size={batch}", f"batch.micro_batch_size={micro}"]
    adaptive = ["+experiment=adaptive_bs", f"batch.global_batch_size={batch}", f"batch.micro_batch_size={micro}"]
    samples = batch // micro
    return {
        "norm test": (adaptive + NEVER_GROWS, constant, "none"),
        "inner-product test": (
            adaptive + NEVER_GROWS + ["technique.adaptive_batch.test=augmented_inner_product"],
            constant,
            f"{samples} gradient copies",
        ),
        "simulated DiLoCo M=2": (
            [
                "+technique=diloco",
                f"batch.global_batch_size={2 * batch}",
                f"batch.micro_batch_size={micro}",
                "technique.diloco.sync_every=30",
            ],
            ["+experiment=constant_bs", f"batch.global_batch_size={batch}", f"batch.micro_batch_size={micro}"],
            "anchor + momentum + 1 weight copy + 1 AdamW state (5 fp32 copies)",
        ),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30, help="timed optimizer steps per run (even: DiLoCo turns)")
    parser.add_argument("--warmup", type=int, default=4, help="untimed steps first (even)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each side, alternated")
    parser.add_argument("--batch", type=int, default=64, help="global batch of the batch-size pairs")
    parser.add_argument("--micro-batch", type=int, default=16)
    parser.add_argument("overrides", nargs="*", help="train.py overrides (after --)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)

    rows = []
    for name, (technique, baseline, memory) in pairs(args.batch, args.micro_batch).items():
        rates: dict[str, list[float]] = {"technique": [], "baseline": []}
        for repeat in range(args.repeats):
            for side, overrides in (("technique", technique), ("baseline", baseline)):
                settings = benchmark_settings(overrides + args.overrides, args.steps, args.warmup)
                rates[side].append(framework_run(settings).tokens_per_sec)
            print(
                f"{name}, repeat {repeat + 1}: {rates['technique'][-1]:,.0f} vs {rates['baseline'][-1]:,.0f} tokens/s",
                file=sys.stderr,
            )
        with_it, without = statistics.median(rates["technique"]), statistics.median(rates["baseline"])
        rows.append((name, without, with_it, with_it / without, memory))

    print("\n| technique | baseline tokens/s | with technique tokens/s | ratio | memory added |\n|---|---|---|---|---|")
    for name, without, with_it, ratio, memory in rows:
        print(f"| {name} | {without:,.0f} | {with_it:,.0f} | {ratio:.3f} | {memory} |")


if __name__ == "__main__":
    main()

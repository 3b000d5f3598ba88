"""Data parallelism against DiLoCo with M = 1 and M = 2 at equal tokens, with the recipe of
Charles et al. 2025 ("Scaling Laws for DiLoCo"): H = 30, outer learning rate 0.4 for M = 1
and 0.6 for M = 2 (Nesterov momentum 0.9), AdamW with beta2 = 0.99, cosine decay to 5%,
enough global steps for 10 rounds; every setting with several seeds.

Prints a markdown table (final validation loss per run, mean per setting) and writes a PNG
of validation loss against tokens. Validation runs every two rounds, right after the outer
step, so DiLoCo runs are compared at synced weights.

    python scripts/study_diloco.py                          # tiny model on CPU, 2 runs side by side
    python scripts/study_diloco.py --seeds 1 2 3 -- model=diloco_35m trainer=gpu data=hub
"""

import argparse
import re
import statistics
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from analysis.report import markdown_table, plot_panels
from analysis.runs import Run, train_run

ROUNDS = 10
SYNC_EVERY = 30  # H


def settings() -> dict[str, list[str]]:
    """The compared settings, by name, as train.py overrides (outer LR by M: 0.4 and 0.6)."""
    diloco = ["+technique=diloco", f"technique.diloco.sync_every={SYNC_EVERY}"]
    return {
        "data parallel": [f"callbacks.validation_schedule.every_n_steps={2 * SYNC_EVERY}"],
        "DiLoCo M=1": diloco + ["technique.diloco.replicas=1", f"callbacks.validation_schedule.every_n_steps={2 * SYNC_EVERY}"],
        # Simulated replicas take M optimizer steps per global step.
        "DiLoCo M=2": diloco + ["technique.diloco.replicas=2", f"callbacks.validation_schedule.every_n_steps={4 * SYNC_EVERY}"],
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2], help="one run per setting and seed")
    parser.add_argument("--global-batch", type=int, default=16, help="sequences per global step (all replicas)")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--parallel", type=int, default=2, help="runs side by side, one CPU thread each")
    parser.add_argument("--out", type=Path, default=Path("outputs/study_diloco"))
    parser.add_argument("overrides", nargs="*", help="train.py overrides shared by every run (after --)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    tokens = ROUNDS * SYNC_EVERY * args.global_batch * args.seq_len  # exactly 10 rounds of global steps
    shared = [
        f"token_budget={tokens}",
        f"batch.global_batch_size={args.global_batch}",
        f"data.seq_len={args.seq_len}",
        "optimizer.betas=[0.9,0.99]",
        "lr_schedule.min_lr_ratio=0.05",
        *args.overrides,
    ]
    jobs = {f"{name} seed {seed}": overrides + shared + [f"seed={seed}"]
            for name, overrides in settings().items() for seed in args.seeds}  # fmt: skip
    threads = 1 if args.parallel > 1 else None
    with ThreadPoolExecutor(args.parallel) as pool:
        futures = {name: pool.submit(train_run, re.sub(r"\W+", "_", name), overrides, args.out, threads)
                   for name, overrides in jobs.items()}  # fmt: skip
        runs: dict[str, Run] = {name: future.result()[0] for name, future in futures.items()}

    rows = []
    for setting in settings():
        losses = [runs[f"{setting} seed {seed}"].final("val/loss") for seed in args.seeds]
        rows.append({"run": setting, **{f"seed {s}": f"{loss:.4f}" for s, loss in zip(args.seeds, losses)},
                     "mean val loss": f"{statistics.mean(losses):.4f}"})  # fmt: skip
    print(markdown_table(rows))
    first_seed = {name.removesuffix(f" seed {args.seeds[0]}"): run for name, run in runs.items()
                  if name.endswith(f"seed {args.seeds[0]}")}  # fmt: skip
    title = f"DP vs DiLoCo, H={SYNC_EVERY}, {tokens:,} tokens (seed {args.seeds[0]})"
    panels = [("val/loss", "validation loss (nats/token)"), ("train/loss", "training loss")]
    plot_panels(first_seed, panels, title, args.out / "study_diloco.png")
    print(f"\nwrote {args.out / 'study_diloco.png'}", file=sys.stderr)


if __name__ == "__main__":
    main()

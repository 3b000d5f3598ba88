"""Batch-size schedules at the same token budget on the same data: constant small, constant
large, stagewise warmup and the adaptive norm test (Lau, Liu, Kolar 2024).

Prints a markdown table (final validation loss, optimizer steps, final global batch, wall
time) and writes a PNG of validation loss and global batch against tokens.

    python scripts/compare_batch_schedules.py                         # tiny model on CPU
    python scripts/compare_batch_schedules.py --tokens 2e8 -- model=diloco_90m trainer=gpu data=hub

Every run validates at the same token counts (``--val-every`` tokens), so the curves share
their x positions. Extra arguments after ``--`` go to every run.
"""

import argparse
import re
import sys
from pathlib import Path


from analysis.report import markdown_table, plot_panels
from analysis.runs import Run, train_run


def schedules(args: argparse.Namespace) -> dict[str, list[str]]:
    """The runs of the comparison, by name, as train.py overrides."""
    small, large = args.small, args.large
    sizes = [small * 2**k for k in range(10) if small * 2**k <= large]
    return {
        f"constant {small}": ["+experiment=constant_bs", f"batch.global_batch_size={small}"],
        f"constant {large}": ["+experiment=constant_bs", f"batch.global_batch_size={large}"],
        "stagewise warmup": ["+experiment=bs_warmup", f"technique.batch_warmup.stage_sizes=[{','.join(map(str, sizes))}]"],
        "adaptive (norm test)": [
            "+experiment=adaptive_bs",
            f"batch.global_batch_size={small}",
            f"technique.adaptive_batch.eta={args.eta}",
        ],
    }


def summary(run: Run, seconds: float) -> dict[str, str]:
    return {
        "final val loss": f"{run.final('val/loss'):.4f}",
        "optimizer steps": f"{len(run.series('train/global_batch_size')[0])}",
        "final global batch": f"{run.final('train/global_batch_size'):.0f}",
        "tokens": f"{run.final('train/tokens_seen'):,.0f}",
        "wall time": f"{seconds:.0f} s",
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=float, default=1e6, help="token budget of every run")
    parser.add_argument("--small", type=int, default=16, help="constant-small batch, and where growing schedules start")
    parser.add_argument("--large", type=int, default=128, help="constant-large batch, and the cap of growing schedules")
    parser.add_argument("--micro-batch", type=int, default=4, help="micro-batch: the adaptive test's samples on one device")
    parser.add_argument("--eta", type=float, default=0.2, help="norm-test tolerance of the adaptive run")
    parser.add_argument("--val-every", type=float, default=1e5, help="validate every this many tokens")
    parser.add_argument("--out", type=Path, default=Path("outputs/compare_batch_schedules"))
    parser.add_argument("overrides", nargs="*", help="train.py overrides shared by every run (after --)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)

    shared = [
        f"token_budget={int(args.tokens)}",
        f"batch.micro_batch_size={args.micro_batch}",
        f"batch.max_global_batch_size={args.large}",
        "callbacks.validation_schedule.every_n_steps=null",
        f"callbacks.validation_schedule.every_n_tokens={int(args.val_every)}",
        *args.overrides,
    ]
    runs, rows = {}, []
    for name, overrides in schedules(args).items():
        runs[name], seconds = train_run(re.sub(r"\W+", "_", name).strip("_"), shared + overrides, args.out)
        rows.append({"schedule": name, **summary(runs[name], seconds)})

    print(markdown_table(rows))
    panels = [("val/loss", "validation loss (nats/token)"), ("train/global_batch_size", "global batch")]
    title = "Batch-size schedules at equal token budget"
    plot_panels(runs, panels, title, args.out / "batch_schedules.png", steps=("train/global_batch_size",))
    print(f"\nwrote {args.out / 'batch_schedules.png'}", file=sys.stderr)


if __name__ == "__main__":
    main()

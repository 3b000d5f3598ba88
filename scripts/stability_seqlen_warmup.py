"""Stability study: the baseline and sequence-length warmup at a large batch and LR.

Li, Zhang, He (2022) trained GPT-2 with 8x the batch and 4x the learning rate to provoke
instability, and showed that sequence-length warmup keeps such runs stable. This script
trains both on the same data and budget, then prints a table (loss spikes, max Adam
second moment, final validation loss, tokens, wall time) and writes a PNG of training
loss and sequence length against tokens.

    python scripts/stability_seqlen_warmup.py                      # tiny model on CPU
    python scripts/stability_seqlen_warmup.py --tokens 5e8 -- model=diloco_90m trainer=gpu data=hub

A loss spike is an optimizer step whose loss exceeds ``--spike-threshold`` times the
lowest loss seen before it (``stability/loss_spike_ratio``).
"""

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

from analysis.report import markdown_table, plot_panels
from analysis.runs import Run, train_run


def summary(run: Run, seconds: float, threshold: float) -> dict[str, str]:
    _, ratios = run.series("stability/loss_spike_ratio")
    _, adam_max = run.series("stability/adam_v_max")
    tokens, val = run.series("val/loss")
    return {
        "loss spikes": str(sum(ratio > threshold for ratio in ratios)),
        "max loss ratio": f"{max(ratios):.3f}",
        "max Adam v": f"{max(adam_max):.3g}",
        "final val loss": f"{val[-1]:.4f}",
        "tokens": f"{int(tokens[-1]):,}",
        "wall time": f"{seconds:.0f} s",
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=float, default=1.5e6, help="token budget of each run")
    parser.add_argument("--batch", type=int, default=128, help="global batch (8x the default 16)")
    parser.add_argument("--micro-batch", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1.6e-2, help="peak LR (4x the default 4e-3)")
    parser.add_argument("--lr-warmup-steps", type=int, default=10)
    parser.add_argument("--curriculum-steps", type=int, default=40, help="T: optimizer steps to full length")
    parser.add_argument("--start-length", type=int, default=8)
    parser.add_argument("--spike-threshold", type=float, default=1.1)
    parser.add_argument("--out", type=Path, default=Path("outputs/stability_seqlen_warmup"))
    parser.add_argument("overrides", nargs="*", help="train.py overrides shared by both runs (after --)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)

    shared = [
        f"token_budget={int(args.tokens)}",
        f"batch.global_batch_size={args.batch}",
        f"batch.micro_batch_size={args.micro_batch}",
        f"optimizer.lr={args.lr}",
        f"lr_schedule.warmup_steps={args.lr_warmup_steps}",
        "callbacks.validation_schedule.every_n_steps=1000000",  # validate once, at the end
        *args.overrides,
    ]
    warmup = [
        "+experiment=seqlen_warmup",
        f"technique.seq_len_warmup.total_curriculum_step={args.curriculum_steps}",
        f"technique.seq_len_warmup.min_difficulty={args.start_length}",
    ]
    runs, rows = {}, []
    for name, extra in (("baseline", []), ("seqlen warmup", warmup)):
        runs[name], seconds = train_run(name.replace(" ", "_"), shared + extra, args.out)
        rows.append({"run": name, **summary(runs[name], seconds, args.spike_threshold)})

    print(markdown_table(rows))
    panels = [("train/loss", "training loss (nats/token)"), ("train/seq_len", "training sequence length")]
    title = "Large batch and LR: baseline vs sequence-length warmup"
    plot_panels(runs, panels, title, args.out / "stability.png")
    print(f"\nwrote {args.out / 'stability.png'}", file=sys.stderr)


if __name__ == "__main__":
    main()

"""Report on finished runs from their local logs: PNG plots and a table of final metrics.

    python scripts/report.py outputs/multiruns/<experiment>/<time> --out report/
    python scripts/report.py outputs/runs/default/<time> outputs/runs/baseline/<time> --out report/

Each directory is a run folder or a sweep folder (searched for `csv/metrics.csv`, so runs
need `logger=csv` or `logger=[wandb,csv]`). Writes validation loss, learning rate, global
batch, sequence length and MFU against tokens seen (one line per run; a metric that no
run logged is skipped, and said so), and `report.md` with the table, which is also printed.
No W&B account or network is needed.
"""

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

from analysis.report import final_table, run_labels, write_report
from analysis.runs import find_runs


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dirs", nargs="+", type=Path, help="run folders or sweep folders")
    parser.add_argument("--out", type=Path, required=True, help="folder for the PNGs and report.md")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        runs = find_runs(args.dirs)
    except FileNotFoundError as error:
        raise SystemExit(str(error)) from error
    for message in write_report(runs, args.out):
        print(f"skipped {message}", file=sys.stderr)
    print(final_table(runs, run_labels(runs)))
    print(f"\nwrote {args.out / 'report.md'} ({len(runs)} runs)", file=sys.stderr)


if __name__ == "__main__":
    main()

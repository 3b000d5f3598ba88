"""Report on finished runs from their local logs: seeds grouped, plots with bands, verdicts.

    python scripts/report.py outputs/multiruns/<experiment>/<time>             # writes <that folder>/report/
    python scripts/report.py outputs/runs/default/<time> outputs/runs/baseline/<time> --out report/

Each directory is a run folder or a sweep folder (searched for `csv/metrics.csv`, so runs
need `logger=csv` or `'logger=[wandb,csv]'`). Runs that differ only in `seed` form a group
(a study's arm); the printed table gives each group's mean ± standard deviation over seeds
of the final validation loss, optimizer steps, tokens and training wall time, and a study
preset's claims get a verdict each: holds, fails, or inconclusive (the effect is within the
seed spread). In a sweep folder only finished jobs count: one interrupted or still training
is left out, and the report names it. The output folder gets `report.md` (these tables and
one row per run) and PNGs: each group's mean curve with a min-max band against tokens,
optimizer steps and wall time. No W&B account or network is needed.
"""

import argparse
import sys
from pathlib import Path

from common.errors import UserError
from launch.cli import exit_code
from study.report import study_report, write_report


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dirs", nargs="+", type=Path, help="run folders or sweep folders")
    parser.add_argument("--out", type=Path, help="folder for the PNGs and report.md (default: FIRST_DIR/report)")
    return parser.parse_args(argv)


def report(args: argparse.Namespace) -> None:
    try:
        result = study_report(args.dirs)
    except FileNotFoundError as error:
        raise UserError(str(error)) from error
    out = args.out or args.dirs[0] / "report"
    skipped = write_report(result, out)
    print(result.markdown(), flush=True)
    for message in skipped:
        print(f"skipped {message}", file=sys.stderr)
    print(f"\nwrote {out / 'report.md'} ({len(result.runs)} runs in {len(result.groups)} groups)", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    return exit_code(lambda: report(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())

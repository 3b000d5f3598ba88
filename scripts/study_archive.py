"""Carry a study's finished runs to another machine as a small folder of text (study/archive.py).

    python scripts/study_archive.py save SWEEP_DIR ARCHIVE_DIR      # after (or during) a session's runs
    python scripts/study_archive.py restore ARCHIVE_DIR SWEEP_DIR   # on the new machine, before resuming

After `restore`, the study's own `train.py -m ... hydra.sweep.dir=SWEEP_DIR` command skips the
archived jobs and continues its searches from their record; the reports read the same finals.
Saving over an archive that holds a run the sweep folder lacks is refused (restore it first).
"""

import argparse
import sys
from pathlib import Path

from launch.cli import exit_code
from study.archive import restore, save


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    saving = commands.add_parser("save", help="write the archive of a sweep folder's finished runs")
    saving.add_argument("sweep_dir", type=Path)
    saving.add_argument("archive_dir", type=Path)
    restoring = commands.add_parser("restore", help="lay an archive's runs into a sweep folder")
    restoring.add_argument("archive_dir", type=Path)
    restoring.add_argument("sweep_dir", type=Path)
    return parser.parse_args(argv)


def run(args: argparse.Namespace) -> None:
    if args.command == "save":
        print(
            f"archived {save(args.sweep_dir, args.archive_dir)} finished runs of {args.sweep_dir} in {args.archive_dir}"
        )
    else:
        print(
            f"restored {restore(args.archive_dir, args.sweep_dir)} runs from {args.archive_dir} into {args.sweep_dir}"
        )


def main(argv: list[str] | None = None) -> int:
    return exit_code(lambda: run(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())

"""Fit scaling laws to finished runs or sweeps (Charles et al. 2025, DiLoCo scaling laws).

    python scripts/fit_scaling_laws.py outputs/multiruns/<experiment>/<time> --predict 7e9
    python scripts/fit_scaling_laws.py --table paper --predict 2.4e9

Reads each run's final val/loss, its model size N (parameters of its model config),
DiLoCo replicas M (`diloco.replicas`; runs without a `diloco` section are data
parallel), inner LR (`optimizer.lr`) and batch in tokens (`batch.global_batch_size` x
`data.seq_len`). Keeps the best run per (M, N), then fits L(N) = A N^alpha per group
(`--offset`: also + C), the best inner LR and batch as a N^b, and the joint
L = A N^alpha M^beta over the DiLoCo runs. Prints every coefficient with its standard
error, predicts at `--predict N`, and writes a PNG. `--table paper` adds the paper's
Table 4 losses (no runs needed). Runs need `logger=csv` (or `logger=[wandb,csv]`).
"""

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from analysis.runs import find_runs  # noqa: E402
from analysis.scaling_laws import (  # noqa: E402
    PAPER_JOINT_FIT,
    Result,
    best_per_setting,
    edge_notes,
    fit_all,
    paper_results,
    plot_fits,
    predictions,
    results_of,
)


def gather(dirs: list[Path], table: str | None) -> list[Result]:
    """Results of the runs in `dirs` and of the built-in table; notes on stderr for skipped runs."""
    results = paper_results() if table == "paper" else []
    if dirs:
        try:
            runs = find_runs(dirs)
        except FileNotFoundError as error:
            raise SystemExit(str(error)) from error
        found, notes = results_of(runs)
        for note in notes:
            print(f"skipped {note}", file=sys.stderr)
        results += found
    if not results:
        raise SystemExit("nothing to fit: give run or sweep folders, or --table paper.")
    return results


def print_results(results: list[Result]) -> None:
    print("| group | N | final val loss | inner LR | batch tokens |\n|---|---|---|---|---|")
    for r in best_per_setting(results):
        print(f"| {r.group} | {r.n_params:,.0f} | {r.loss:.4f} | {f'{r.lr:.4g}' if r.lr is not None else '-'} |"
              f" {f'{r.batch_tokens:,.0f}' if r.batch_tokens else '-'} |")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dirs", nargs="*", type=Path, help="run folders or sweep folders")
    parser.add_argument("--table", choices=["paper"], help="add the DiLoCo paper's Table 4 losses")
    parser.add_argument("--predict", type=float, help="a model size N (parameters) to predict at")
    parser.add_argument("--offset", action="store_true", help="also fit L(N) = A N^alpha + C (3+ sizes)")
    parser.add_argument("--out", type=Path, default=Path("outputs/scaling_laws.png"), help="the PNG to write")
    args = parser.parse_args()

    results = gather(args.dirs, args.table)
    print_results(results)
    fits = fit_all(results, offset=args.offset)
    if not fits:
        raise SystemExit("no fit possible: every fit needs at least two model sizes.")
    print("\nfits (coefficient(± standard error); ±nan: as many points as coefficients):")
    for name, law in fits.items():
        target = name.split("(")[0]
        print(f"  {name}: {law.describe(target)}")
    if args.table == "paper":
        print("  paper's joint fit over all 7 sizes: L = {A} N^{alpha} M^{beta}".format(**PAPER_JOINT_FIT))
    for note in edge_notes(results):
        print(f"  note: {note}")
    if args.predict:
        replicas = sorted({r.replicas for r in results if r.replicas is not None})
        print("\npredictions:\n  " + "\n  ".join(predictions(fits, args.predict, replicas)))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    plot_fits(results, fits, args.out)
    print(f"\nwrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()

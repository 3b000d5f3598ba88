"""Fit scaling laws to finished runs or sweeps (Charles et al. 2025, DiLoCo scaling laws).

    python scripts/fit_scaling_laws.py outputs/multiruns/<experiment>/<time> --predict 7e9
    python scripts/fit_scaling_laws.py --table paper --predict 4e9

Reads each run's final val/loss, its model size N (parameters of its model config),
DiLoCo replicas M (`technique.diloco.replicas`; runs without that section are data
parallel), inner LR (`optimizer.lr`) and batch in tokens (`batch.global_batch_size` x
`data.seq_len`). Keeps the best run per (M, N), then fits L(N) = A N^alpha per group
(`--offset`: also + C), the best inner LR and batch as a N^b, and the joint
L = A N^alpha M^beta over the DiLoCo runs. Prints every coefficient with its standard
error, predicts at `--predict N`, and writes a PNG. Runs need `logger=csv` (or
`logger=[wandb,csv]`).

`--table paper` fits the paper's Table 4 instead of runs: each fit beside the paper's own,
and the paper's 4B and 10B runs (not fitted) beside what the fits predict for them.
"""

import argparse
import sys
from pathlib import Path

from analysis.runs import find_runs
from analysis.scaling_laws import (
    PAPER_EXTRAPOLATION,
    PAPER_FITS,
    PowerLaw,
    Result,
    best_per_setting,
    edge_notes,
    fit_all,
    paper_results,
    plot_fits,
    predictions,
    relative_differences,
    results_of,
)


def gather(dirs: list[Path]) -> list[Result]:
    """Results of the runs in `dirs`; notes on stderr for skipped runs."""
    try:
        runs = find_runs(dirs)
    except FileNotFoundError as error:
        raise SystemExit(str(error)) from error
    results, notes = results_of(runs)
    for note in notes:
        print(f"skipped {note}", file=sys.stderr)
    if not results:
        raise SystemExit("nothing to fit: no run in those folders has a val/loss.")
    return results


def print_results(results: list[Result]) -> None:
    print("| group | N | final val loss | inner LR | batch tokens |\n|---|---|---|---|---|")
    for r in best_per_setting(results):
        print(
            f"| {r.group} | {r.n_params:,.0f} | {r.loss:.4f} | {f'{r.lr:.4g}' if r.lr is not None else '-'} |"
            f" {f'{r.batch_tokens:,.0f}' if r.batch_tokens else '-'} |"
        )


def print_fits(fits: dict[str, PowerLaw]) -> None:
    print("\nfits (coefficient(± standard error); ±nan: as many points as coefficients):")
    for name, law in fits.items():
        print(f"  {name}: {law.describe(name.split('(')[0])}")


def print_paper_comparison(fits: dict[str, PowerLaw]) -> None:
    """Each fit of the paper's table beside the paper's fit of it: small differences say that the
    table and the fitting both reproduce the paper's laws."""
    print("\nfits beside the paper's (relative differences: this fit / paper's - 1):")
    print("| fit | this fit (± standard error) | paper's fit | A vs paper | alpha vs paper | beta vs paper |")
    print("|---|---|---|---|---|---|")
    for name, law in fits.items():
        target = name.split("(")[0]
        published = PAPER_FITS.get(name)
        if published is None:
            print(f"| {name} | {law.describe(target)} | - | - | - | - |")
            continue
        powers = " ".join(f"{variable}^{b}" for variable, b in zip(law.variables, published[1:], strict=True))
        differences = [f"{d:+.2%}" for d in relative_differences(law, published)]
        print(
            f"| {name} | {law.describe(target)} | {target} = {published[0]} {powers} |"
            f" {' | '.join(differences + ['-'] * (3 - len(differences)))} |"
        )


def _versus(predicted: float, measured: float) -> str:
    return f"{predicted:.3f} ({predicted / measured - 1:+.1%})"


def print_extrapolation(fits: dict[str, PowerLaw], measured: list[Result]) -> None:
    """Runs beyond the fitted sizes beside what the laws predict for them: how far they extrapolate."""
    print("\nruns held out of the fits beside the fits' predictions (prediction / measured - 1):")
    print("| N | group | measured loss | L(N) of its group | L(N, M) |\n|---|---|---|---|---|")
    for r in measured:
        own, joint = fits.get(f"L(N) {r.group}"), fits.get("L(N, M)")
        own_text = _versus(float(own.predict(r.n_params)), r.loss) if own else "-"
        joint_text = _versus(float(joint.predict(r.n_params, r.replicas)), r.loss) if joint and r.replicas else "-"
        print(f"| {r.n_params:,.0f} | {r.group} | {r.loss:.3f} | {own_text} | {joint_text} |")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dirs", nargs="*", type=Path, help="run folders or sweep folders")
    parser.add_argument("--table", choices=["paper"], help="fit the DiLoCo paper's Table 4 instead of runs")
    parser.add_argument("--predict", type=float, help="a model size N (parameters) to predict at")
    parser.add_argument("--offset", action="store_true", help="also fit L(N) = A N^alpha + C (3+ sizes)")
    parser.add_argument("--out", type=Path, default=Path("outputs/scaling_laws.png"), help="the PNG to write")
    args = parser.parse_args(argv)
    if bool(args.dirs) == bool(args.table):
        # One fit through both would join two ladders trained on different data and setups.
        parser.error("give run or sweep folders, or --table paper (not both).")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    results = paper_results() if args.table else gather(args.dirs)
    held_out = paper_results(PAPER_EXTRAPOLATION) if args.table else []
    print_results(results)
    fits = fit_all(results, offset=args.offset)
    if not fits:
        raise SystemExit("no fit possible: every fit needs at least two model sizes.")
    if args.table:
        print_paper_comparison(fits)
    else:
        print_fits(fits)
    for note in edge_notes(results):
        print(f"  note: {note}")
    if args.predict:
        replicas = sorted({r.replicas for r in results if r.replicas is not None})
        print("\npredictions:\n  " + "\n  ".join(predictions(fits, args.predict, replicas)))
    if held_out:
        print_extrapolation(fits, held_out)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    plot_fits(results, fits, args.out, held_out)
    print(f"\nwrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()

"""A scaling ladder's fits and its held-out prediction, from the framework's own runs.

    python scripts/ladder.py predict outputs/studies/scaling_ladder            # before the largest size is read
    python scripts/ladder.py report outputs/studies/scaling_ladder --out docs/ladder_fixed_diloco/ # fits, prediction against measured, trends

A study with ``study.held_out`` (``conf/sweep/scaling_ladder.yaml``) writes its prediction
itself, before the held-out size trains; ``predict`` is for ladders without one (or another
choice of sizes). ``predict`` fits each method's L(N) on every size but the one it predicts (by default the
largest the folder's runs name; ``--predict NAME`` names a model preset, ``--sizes`` the
sizes to fit on) and writes the predictions, with their bootstrap intervals, to
``DIR/ladder_prediction.yaml`` (never over one already there). It reads the configs of all runs but the results of the
fitted sizes only: what the predicted size's runs logged is never opened.

``report`` reads every run and the recorded prediction, and prints the prediction table
(method, size, the settings a held-out size ran with, predicted with its interval, measured
over seeds, relative error), the fits
on all sizes (L(N) per method, the joint L(N, M) over DiLoCo, the inner LR each size's search
picked against N; in a tuned ladder each searched setting's law over the searched sizes'
winners, ``study/setting_laws.py``), a tuned ladder's search at each size (each arm's
winner, its loss and its anchors' beside it), the study's claims (in a ladder, per size and as
trends; where a size's search is not tuned, the trends again with it counted, marked
exploratory), and the compute (training time per size and phase); it writes
``ladder_loss.png`` (loss against N with the fits and the held-out prediction),
``ladder_gap.png`` (each DiLoCo method's difference from data parallelism against N) and, in a
tuned ladder, ``ladder_<setting>.png`` per searched setting (the winners against N, the law,
the value the held-out size ran with).
Definitions: ``analysis/ladder.py``.
"""

import argparse
import sys
from pathlib import Path

import matplotlib
import numpy as np
import yaml

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from analysis.ladder import (
    HELD_OUT,
    PREDICTION,
    Prediction,
    by_method,
    fit_loss,
    joint_fit,
    lr_fit,
    model_name,
    run_models,
    rungs,
    write_prediction,
)
from analysis.runs import find_runs
from analysis.scaling_laws import parameter_count
from common.errors import ConfigError
from common.overrides import override_value
from launch.cli import exit_code
from study.archive import machine_of
from study.preset import StudySpec
from study.report import build_report, every_size_trends, study_spec, verdict_table
from study.setting_laws import (
    MAJORITY,
    MIN_SIZES,
    POWER_LAW,
    SettingLaw,
    searched_winners,
    setting_laws,
)
from study.tuning_report import tuning_table

REPO = Path(__file__).resolve().parents[1]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    ahead = commands.add_parser("predict", help="fit the smaller sizes, predict the held-out one")
    ahead.add_argument("dirs", nargs="+", type=Path, help="the ladder's sweep folders")
    ahead.add_argument("--predict", help="the model preset to predict (default: the largest the runs name)")
    ahead.add_argument("--sizes", nargs="+", help="model presets to fit on (default: every other size)")
    after = commands.add_parser("report", help="fits on every size, the prediction against the measured loss")
    after.add_argument("dirs", nargs="+", type=Path, help="the ladder's sweep folders")
    after.add_argument("--out", type=Path, help="folder for the PNGs (default: FIRST_DIR/report)")
    return parser.parse_args(argv)


def preset(name: str) -> dict:
    path = REPO / "conf" / "model" / f"{name}.yaml"
    if not path.is_file():
        raise ConfigError(f"--predict {name}: there is no model preset conf/model/{name}.yaml.")
    return yaml.safe_load(path.read_text())


def do_predict(args: argparse.Namespace) -> None:
    sizes = {str(m.get("name")): m for m in run_models(args.dirs).values()}
    target = args.predict or max(sizes, key=lambda name: parameter_count(sizes[name]))
    n_params = parameter_count(sizes.get(target) or preset(target))
    if (args.dirs[0] / PREDICTION).exists():
        raise ConfigError(
            f"{args.dirs[0] / PREDICTION} exists: a prediction is recorded once, before its size is read; move it away to predict again."
        )
    predictions = write_prediction(args.dirs, target, n_params, args.sizes)
    for p in predictions:
        print(
            f"{p.method} at {target} (N = {n_params:,}): {p.predicted:.4f}, fit [{p.low:.4f}, {p.high:.4f}], prediction"
            f" interval [{p.interval_low:.4f}, {p.interval_high:.4f}], from {p.form} on {', '.join(p.fitted_on)}"
        )
    print(f"wrote {args.dirs[0] / PREDICTION}", file=sys.stderr)


def prediction_table(predictions: list[Prediction], measured: dict[tuple[str, str], list[float]]) -> str:
    lines = [
        "| method | size | N | runs with | form | predicted (fit's 95% interval) | prediction interval |"
        " measured (mean ± std over seeds) | relative error |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for p in predictions:
        values = measured.get((p.method, p.model))
        interval = "not recorded" if p.interval_low is None else f"[{p.interval_low:.4f}, {p.interval_high:.4f}]"
        row = (
            f"| {p.method} | {p.model} | {p.n_params:,} | {' '.join(p.settings) or 'its own search'} | {p.form}"
            f" | {p.predicted:.4f} [{p.low:.4f}, {p.high:.4f}] | {interval}"
        )
        if not values:
            lines.append(f"{row} | not run | - |")
            continue
        mean, std = float(np.mean(values)), float(np.std(values, ddof=1)) if len(values) > 1 else 0.0
        lines.append(f"{row} | {mean:.4f} ± {std:.4f} | {(p.predicted - mean) / mean:+.2%} |")
    return "\n".join(lines)


def compute_table(runs) -> str:
    """Finished runs and their training time (``time/train_seconds``, summed) per size, phase
    and machine: the ladder's cost, part by part (a study carried across machines by its
    archive ran parts on other CPUs, at other speeds)."""
    cost: dict[tuple[int, str, str, str], list[float]] = {}  # (N, size, phase, machine) -> seconds per run
    for run in (run for run in runs if run.finished):
        key = (parameter_count(run.setting("model")), model_name(run), run.phase or "-", machine_of(run.path))
        cost.setdefault(key, []).append(run.final("time/train_seconds") or 0.0)
    lines = ["| size | phase | machine | runs | training time (one core, h) |", "|---|---|---|---|---|"]
    for (_, model, phase, machine), seconds in sorted(cost.items()):
        lines.append(f"| {model} | {phase} | {machine} | {len(seconds)} | {sum(seconds) / 3600:.2f} |")
    total = sum(sum(seconds) for seconds in cost.values())
    lines.append(f"| all | | | {sum(len(s) for s in cost.values())} | {total / 3600:.2f} |")
    return "\n".join(lines)


def do_report(args: argparse.Namespace) -> None:
    runs = find_runs(args.dirs)
    found = rungs(runs)
    recorded = args.dirs[0] / PREDICTION
    predictions = [Prediction(**entry) for entry in yaml.safe_load(recorded.read_text())] if recorded.is_file() else []
    measured = {(r.method, r.model): list(r.losses.values()) for r in found}
    table = (
        prediction_table(predictions, measured)
        if predictions
        else (
            f"None recorded yet in {recorded}: a study with study.held_out writes it before that size trains;"
            f" else `python scripts/ladder.py predict {args.dirs[0]}`."
        )
    )
    print(f"## Held-out prediction\n\n{table}\n\n## Judged losses at each size\n\n{size_table(found)}")
    print("\nMean ± std over the judging seeds (their number in brackets); a held-out size's at its fitted settings.")
    print("\n## Fits on every size\n")
    for method, members in by_method(found).items():
        if len(members) >= 3:
            print(f"- {method}: {fit_loss(members).describe('L')}")
        law = lr_fit(members)
        if law is not None:
            print(f"- {method}, best inner LR: {law.describe('lr')}")
    joint = joint_fit(found)
    if joint is not None:
        print(f"- DiLoCo, joint: {joint.describe('L')}")
    spec = study_spec(runs)
    laws = setting_laws_of(runs, spec, found) if spec is not None and spec.tuned else {}
    for method, method_laws in laws.items():
        for law in method_laws:
            print(f"- {method}, best {law.describe()}")
    report = build_report(runs)
    if report.tunings:
        print(f"\n## The search at each size\n\n{tuning_table(report.tunings)}")
    if report.verdicts:
        print(f"\n## Claims\n\n{verdict_table(report.verdicts)}")
    if exploratory := every_size_trends(report):
        print(
            "\n## Exploratory: the trends with every size's searched winner\n\n"
            "The claims above leave out each size whose search is not tuned; here those sizes'"
            f" winners count too. Not a verdict: it shows how much the exclusions move each trend.\n\n"
            f"{verdict_table(exploratory)}"
        )
    print(f"\n## Compute\n\n{compute_table(runs)}")
    out = args.out or args.dirs[0] / "report"
    out.mkdir(parents=True, exist_ok=True)
    plot_loss(found, predictions, out / "ladder_loss.png")
    plot_gap(found, out / "ladder_gap.png", not_tuned(report.tunings))
    figures = [out / "ladder_loss.png", out / "ladder_gap.png"]
    figures += plot_settings(laws, [run for run in runs if run.phase == HELD_OUT], out)
    print(f"\nwrote {', '.join(map(str, figures))}", file=sys.stderr)


def setting_laws_of(runs: list, spec: StudySpec, found: list) -> dict[str, list[SettingLaw]]:
    """Each searched method's laws over its searched sizes' winners (3 or more sizes),
    evaluated at the largest size the ladder ran."""
    largest = max((r.n_params for r in found), default=0)
    laws = {}
    for method, winners in searched_winners(runs, spec).items():
        if len(winners) >= MIN_SIZES:
            laws[method] = setting_laws(spec.spaces[method], winners, largest)
    return laws


def save(figure, axis, path: Path, **labels: str) -> None:
    """Label a figure against model size (log N) and write and close it; a legend only where
    something is drawn (a study still searching has no judged run to plot)."""
    axis.set(xscale="log", xlabel="parameters N", **labels)
    if axis.get_legend_handles_labels()[0]:
        axis.legend(fontsize="small")
    figure.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(figure)


def plot_settings(laws: dict[str, list[SettingLaw]], held_out, out: Path) -> list[Path]:
    """One figure per searched setting: each method's winners against N (a marker per method,
    ringed where at the range's hard limit), its law (dashed; a list setting has none) and the
    value the held-out size ran with (x)."""
    keys = dict.fromkeys(law.key for method_laws in laws.values() for law in method_laws)
    paths = []
    for key in keys:
        figure, axis = plt.subplots(figsize=(7, 4.5))
        numeric = True
        for index, (method, method_laws) in enumerate(laws.items()):
            law = next((law for law in method_laws if law.key == key), None)
            if law is None:
                continue
            n = np.array([size for size, _ in law.winners], float)
            numeric = law.form != MAJORITY
            values = [float(v) if numeric else v for _, v in law.winners]
            # Methods often share a winner (a grid point): a shape and a smaller size each keeps both in sight.
            shape = {"marker": "osD^v"[index % 5], "markersize": max(9 - 2 * index, 4), "linestyle": "none"}
            (line,) = axis.plot(n, values, **shape, label=f"{method}: {law.form}")
            edge = [(size, value) for size, value in zip(n, values) if size in law.at_limit]
            if edge:  # at the range's hard limit: the search's edge, not a measured optimum
                axis.plot(*zip(*edge), "o", markersize=11, fillstyle="none", color=line.get_color())
            held = [
                (parameter_count(run.setting("model")), float(run.setting(key)))
                for run in held_out
                if run.arm == method and numeric and run.setting(key) is not None
            ]
            if numeric:
                grid = np.geomspace(n.min(), max([n.max(), *(size for size, _ in held)]), 50)
                fitted = law.a * grid**law.exponent if law.form == POWER_LAW else np.full_like(grid, float(law.value))
                axis.plot(grid, fitted, "--", color=line.get_color())
            for size, value in held:
                axis.plot([size], [value], "x", color=line.get_color(), markersize=10)
        name = key.split(".")[-1]
        path = out / f"ladder_{name}.png"
        title = f"best {name} against N: winners (ringed: at the range's limit),\nlaw (dashed), held-out size (x)"
        save(figure, axis, path, yscale="log" if numeric else "linear", ylabel=key, title=title)
        paths.append(path)
    return paths


def plot_loss(found, predictions: list[Prediction], path: Path) -> None:
    """Loss against N per method (mean, error bars: std over seeds), each method's fit on the
    fitted sizes drawn out to the held-out one, and the prediction with its interval."""
    figure, axis = plt.subplots(figsize=(7, 4.5))
    for method, members in by_method(found).items():
        held = {p.model: p for p in predictions if p.method == method}
        fitted = [r for r in members if r.model not in held]
        n = np.array([r.n_params for r in members], float)
        errors = [np.std(list(r.losses.values()), ddof=1) if len(r.losses) > 1 else 0 for r in members]
        (line,) = axis.plot([], [])
        axis.errorbar(
            n, [r.loss for r in members], yerr=errors, fmt="o", color=line.get_color(), label=method, capsize=3
        )
        if len(fitted) >= 3:
            grid = np.geomspace(n.min(), n.max(), 50)
            axis.plot(grid, fit_loss(fitted).predict(grid), "--", color=line.get_color())
        for p in held.values():
            axis.errorbar(
                [p.n_params],
                [p.predicted],
                yerr=[[p.predicted - p.low], [p.high - p.predicted]],
                fmt="x",
                color=line.get_color(),
                capsize=5,
                markersize=10,
            )
    title = "loss against model size: fits on the smaller sizes (dashed), held-out prediction (x)"
    save(figure, axis, path, ylabel="final val/loss (nats/token)", title=title)


def not_tuned(tunings: dict) -> set[tuple[str, str]]:
    """The (method, size) pairs whose search is not tuned: out of the claims, hollow in the gap figure."""
    found = {
        (arm, override_value(label.split(), "model")) for (arm, label), tuning in tunings.items() if not tuning.tuned
    }
    return {(arm, model) for arm, model in found if model is not None}


def paired_gaps(found) -> dict[tuple[str, str], dict[int, float]]:
    """Each DiLoCo method's loss minus data parallelism's at the same size, on each seed both
    ran (same seed: same initial weights and data order), by (method, size)."""
    methods = by_method(found)
    baseline = {r.model: r.losses for r in methods.get("dp", [])}
    return {
        (r.method, r.model): {s: loss - baseline[r.model][s] for s, loss in r.losses.items() if s in baseline[r.model]}
        for method, members in methods.items()
        if method != "dp"
        for r in members
        if r.model in baseline
    }


def size_table(found) -> str:
    """Each size's judged losses per method and each DiLoCo method's mean paired gap to data
    parallelism: the numbers behind the loss and gap figures."""
    methods = list(by_method(found))
    diloco = [m for m in methods if m != "dp"]
    gaps = paired_gaps(found)
    lines = [
        f"| size | N | {' | '.join(methods)} | {' | '.join(f'{m} - dp (paired)' for m in diloco)} |",
        "|---|---|" + "---|" * (len(methods) + len(diloco)),
    ]
    sizes = sorted({(r.n_params, r.model) for r in found})
    cells = {(r.method, r.model): r.losses for r in found}
    for n_params, model in sizes:
        row = [model, f"{n_params:,}"]
        for method in methods:
            values = list(cells.get((method, model), {}).values())
            spread = f" ± {np.std(values, ddof=1):.4f}" if len(values) > 1 else ""
            row.append(f"{np.mean(values):.4f}{spread} ({len(values)})" if values else "-")
        for method in diloco:
            gap = list(gaps.get((method, model), {}).values())
            row.append(f"{np.mean(gap):+.4f} ({len(gap)})" if gap else "-")
        lines.append(f"| {' | '.join(row)} |")
    return "\n".join(lines)


def plot_gap(found, path: Path, untuned: set[tuple[str, str]] = frozenset()) -> None:
    """Each DiLoCo method's loss minus data parallelism's at the same size and seed; a size where
    either search is not tuned is drawn hollow (it is measured, but out of the trend)."""
    figure, axis = plt.subplots(figsize=(7, 4.5))
    gaps = paired_gaps(found)
    for index, method in enumerate(dict.fromkeys(method for method, _ in gaps)):
        color = f"C{index}"
        for hollow in (False, True):
            points = [
                (r.n_params, gap)
                for r in found
                if r.method == method and hollow == bool({(method, r.model), ("dp", r.model)} & untuned)
                for gap in gaps.get((method, r.model), {}).values()
            ]
            if points:
                xs, ys = zip(*points)
                label = f"{method} (not tuned: out of the trend)" if hollow else method
                style = {"markerfacecolor": "none"} if hollow else {}
                axis.plot(xs, ys, "o", color=color, alpha=0.6, label=label, **style)
    axis.axhline(0, color="black", linewidth=0.8)
    title = "DiLoCo's excess loss over data parallelism, per size and seed"
    save(figure, axis, path, ylabel="loss - data parallelism's (nats/token)", title=title)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return exit_code(lambda: do_predict(args) if args.command == "predict" else do_report(args))


if __name__ == "__main__":
    sys.exit(main())

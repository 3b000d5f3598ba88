"""Plots and a table of final metrics for a set of runs, from their local logs.

One PNG per metric against tokens seen, one line per run, and a markdown table of each
run's final values. This is what a W&B dashboard would show, made from the CSV logs, so
it works offline and with no account.
"""

import textwrap
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from analysis.runs import Run  # noqa: E402


@dataclass(frozen=True)
class Plot:
    """One metric to plot against tokens seen."""

    key: str
    label: str
    file: str


PLOTS = (
    Plot("val/loss", "validation loss (nats/token)", "val_loss.png"),
    Plot("train/lr", "learning rate", "lr.png"),
    Plot("train/global_batch_size", "global batch (sequences)", "global_batch.png"),
    Plot("train/seq_len", "training sequence length (tokens)", "seq_len.png"),
    Plot("perf/mfu", "MFU", "mfu.png"),
)

# Table columns: header and metric; the value is the run's last logged one.
COLUMNS = (
    ("final val loss", "val/loss"),
    ("final train loss", "train/loss"),
    ("tokens", "train/tokens_seen"),
    ("global batch", "train/global_batch_size"),
    ("seq len", "train/seq_len"),
    ("MFU", "perf/mfu"),
    ("tokens/s", "perf/tokens_per_sec"),
)


def evaluation_keys(runs: list[Run]) -> list[str]:
    """The downstream evaluation metrics (``eval/<task>/<metric>``) any run logged."""
    return sorted({key for run in runs for row in run.rows for key in row if key.startswith("eval/")})


def plots_for(runs: list[Run]) -> list[Plot]:
    """The standard plots, and one per evaluation metric the runs logged."""
    return [*PLOTS, *(Plot(key, key, key.replace("/", "_") + ".png") for key in evaluation_keys(runs))]


def run_labels(runs: list[Run]) -> list[str]:
    """Short, distinct names: each run's overrides minus those every run shares.

    Sweep jobs share most of their overrides, so the full lists would hide the one
    setting that differs. Where that leaves runs without a distinct name (runs from
    different sweeps with the same settings), their folders name them.
    """
    if len(runs) < 2:
        return [run.name for run in runs]
    shared = set.intersection(*(set(run.overrides) for run in runs))
    labels = [" ".join(o for o in run.overrides if o not in shared) for run in runs]
    if all(labels) and len(set(labels)) == len(labels):
        return labels
    return [f"{label} [{run.path.parent.name}/{run.path.name}]".lstrip() for label, run in zip(labels, runs)]


def plot_metric(runs: list[Run], labels: list[str], plot: Plot, path: Path) -> bool:
    """Write the plot of one metric; False (nothing written) when no run logged it."""
    curves = [(label, run.series(plot.key)) for label, run in zip(labels, runs)]
    curves = [(label, series) for label, series in curves if series[0]]
    if not curves:
        return False
    figure, axis = plt.subplots(figsize=(8, 5))
    for label, (tokens, values) in curves:
        axis.plot(tokens, values, label=textwrap.fill(label, 100), marker="." if len(tokens) < 30 else None)
    axis.set(xlabel="tokens seen", ylabel=plot.label, title=plot.label)
    # Below the axes: sweep labels are long, and inside they would cover the curves.
    axis.legend(fontsize="small", loc="upper left", bbox_to_anchor=(0, -0.12))
    figure.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(figure)
    return True


def _cell(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if value.is_integer() or abs(value) >= 100 else f"{value:.4f}"


def final_table(runs: list[Run], labels: list[str]) -> str:
    """Markdown table: one row per run, its last value of each metric ('-' if never logged),
    evaluation metrics included."""
    columns = [*COLUMNS, *((key, key) for key in evaluation_keys(runs))]
    header = ["run", *(name for name, _ in columns)]
    lines = [f"| {' | '.join(header)} |", f"|{'---|' * len(header)}"]
    for label, run in zip(labels, runs):
        cells = [label.replace("|", "\\|"), *(_cell(run.final(key)) for _, key in columns)]
        lines.append(f"| {' | '.join(cells)} |")
    return "\n".join(lines)


def markdown_table(rows: list[dict[str, str]]) -> str:
    """A markdown table with the first row's keys as its header."""
    columns = list(rows[0])
    lines = [f"| {' | '.join(columns)} |", f"|{'---|' * len(columns)}"]
    return "\n".join(lines + [f"| {' | '.join(row[column] for column in columns)} |" for row in rows])


def plot_panels(
    runs: dict[str, Run], panels: list[tuple[str, str]], title: str, path: Path, steps: tuple[str, ...] = ()
) -> None:
    """Stacked panels (metric key, axis label) sharing the tokens axis, one line per run;
    keys in `steps` are drawn as steps (values that hold until the next change)."""
    figure, axes = plt.subplots(len(panels), 1, sharex=True, figsize=(8, 3.5 * len(panels)))
    for axis, (key, label) in zip(axes, panels):
        for name, run in runs.items():
            draw = axis.step if key in steps else axis.plot
            draw(*run.series(key), label=name, linewidth=1)
        axis.set(ylabel=label)
    axes[0].set(title=title)
    axes[-1].set(xlabel="tokens seen")
    axes[0].legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def write_report(runs: list[Run], out: Path) -> list[str]:
    """Write the plots and `report.md` (table and plots) to `out`; returns what was skipped."""
    out.mkdir(parents=True, exist_ok=True)
    labels = run_labels(runs)
    written, skipped = [], []
    for plot in plots_for(runs):
        if plot_metric(runs, labels, plot, out / plot.file):
            written.append(plot)
        else:
            skipped.append(f"{plot.key}: no run logged it, so {plot.file} was not written")
    images = "\n\n".join(f"![{plot.label}]({plot.file})" for plot in written)
    folders = "\n".join(f"- {label}: `{run.path}`" for label, run in zip(labels, runs))
    (out / "report.md").write_text(f"# Runs\n\n{final_table(runs, labels)}\n\n{folders}\n\n{images}\n")
    return skipped

"""The report on a set of runs: seeds grouped, their spread, plots with bands, verdicts on claims.

Runs that differ only in their seed form a group (a study's arm, or in any other sweep the
runs whose overrides are equal once ``seed=`` is left out). For each group the report gives
the mean ± standard deviation over seeds of the final validation loss, optimizer steps,
tokens and training wall time; its plots show each group's mean curve with a min-max band
over seeds, against tokens (every standard metric) and against optimizer steps and wall
time (validation loss); a study's claims get a verdict each (``study/preset.py``). This
is what a W&B dashboard grouped by ``job_type`` shows, made from the CSV logs, so it works
offline and with no account.

    from study.report import study_report
    report = study_report(["outputs/multiruns/study_batch_schedules/<time>"])
    print(report.markdown())              # tables and verdicts; report.groups, report.verdicts
"""

import textwrap
from dataclasses import dataclass, field, replace
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from analysis.ladder import HELD_OUT
from analysis.markdown_table import markdown_table
from analysis.runs import DERIVED, STEP, TOKENS, WALL_TIME, Run, find_runs
from analysis.scaling_laws import parameter_count
from common.overrides import override_value
from study.claim_tests import Spread
from study.looks import judge_in_looks
from study.preset import Claim, StudySpec
from study.trend import judge_trend
from study.tuner import Tuning
from study.tuning_report import crossed_with, distinct_crossings, tuning_figures, tuning_table, tunings
from study.verdicts import NOT_TUNED, Verdict


@dataclass(frozen=True)
class Plot:
    """One metric to plot against an x-axis (a logged key)."""

    key: str
    label: str
    file: str
    x: str = TOKENS


X_LABELS = {TOKENS: "tokens seen", STEP: "optimizer steps", WALL_TIME: "training wall time (s)"}

PLOTS = (
    Plot("val/loss", "validation loss (nats/token)", "val_loss.png"),
    Plot("val/loss", "validation loss (nats/token)", "val_loss_vs_steps.png", x=STEP),
    Plot("val/loss", "validation loss (nats/token)", "val_loss_vs_time.png", x=WALL_TIME),
    Plot("train/lr", "learning rate", "lr.png"),
    Plot("train/global_batch_size", "global batch (sequences)", "global_batch.png"),
    Plot("train/seq_len", "training sequence length (tokens)", "seq_len.png"),
    Plot("perf/mfu", "MFU", "mfu.png"),
)

# Per-run table columns: header and metric; the value is the run's last logged one.
COLUMNS = (
    ("final val loss", "val/loss"),
    ("final train loss", "train/loss"),
    ("tokens", "train/tokens_seen"),
    ("global batch", "train/global_batch_size"),
    ("seq len", "train/seq_len"),
    ("MFU", "perf/mfu"),
    ("tokens/s", "perf/tokens_per_sec"),
)

# Group table columns: header and final value (logged key or `Run.final`'s derived name).
GROUP_COLUMNS = (
    ("val/loss", "val/loss"),
    ("optimizer steps", "steps"),
    ("tokens", "tokens"),
    ("wall time (s)", "wall_time"),
)


@dataclass(frozen=True)
class Group:
    """Runs that differ only in their seed."""

    name: str
    runs: tuple[Run, ...]

    @property
    def arm(self) -> str | None:
        return self.runs[0].arm

    @property
    def phase(self) -> str | None:
        return self.runs[0].phase

    @property
    def seeds(self) -> list[int | None]:
        return [run.seed for run in self.runs]

    def spread(self, expression: str) -> Spread | None:
        """The final value of ``expression`` (``Run.value``) over the group's runs that logged
        it, with their seeds (for paired comparisons)."""
        found = [(value, run.seed) for run in self.runs if (value := run.value(expression)) is not None]
        return Spread(tuple(v for v, _ in found), tuple(s for _, s in found)) if found else None


def group_runs(runs: list[Run]) -> list[Group]:
    """Runs grouped by their overrides less the seed, groups in the order their first run comes.

    A group is named by its study arm, followed by the overrides that tell it apart from
    the other groups and are not the arm's own (e.g. a learning rate the sweep crosses the
    arms with); outside a study, by those overrides alone.
    """
    grouped: dict[tuple[str, ...], list[Run]] = {}
    for run in runs:
        grouped.setdefault(run.group, []).append(run)
    own = [[o for o in key if not o.startswith(("study.arm=", "++study.phase="))] for key in grouped]
    arms = [members[0].arm for members in grouped.values()]
    if any(arms):
        spec = study_spec(runs)
        arm_overrides = spec.arms if spec else {}
        own = [[o for o in overrides if o not in arm_overrides.get(arm, [])] for overrides, arm in zip(own, arms)]
    extras = distinct_labels(own, arms_tell_apart=any(arms))
    tuning = ["(tuning)" if members[0].phase == "tune" else "" for members in grouped.values()]
    names = [" ".join(part for part in parts if part) or "defaults" for parts in zip(arms, extras, tuning)]
    if len(set(names)) < len(names):
        names = [" ".join(part for part in (arm, *o, t) if part) for arm, o, t in zip(arms, own, tuning)]
    return [Group(name, tuple(members)) for name, members in zip(names, grouped.values())]


def distinct_labels(overrides: list[list[str]], arms_tell_apart: bool = False) -> list[str]:
    """Short names: each list's overrides minus those every list shares (sweep jobs share most).
    Where study arms already tell groups apart, a label may be empty (an arm at its defaults)."""
    if len(overrides) < 2:
        return ["" if arms_tell_apart else " ".join(o) for o in overrides]
    shared = set.intersection(*(set(o) for o in overrides))
    labels = [" ".join(x for x in o if x not in shared) for o in overrides]
    if arms_tell_apart:
        return labels
    return labels if all(labels) and len(set(labels)) == len(labels) else [" ".join(o) for o in overrides]


def run_labels(runs: list[Run]) -> list[str]:
    """Distinct run names (overrides not shared by all); the folders name runs that tie."""
    labels = distinct_labels([run.overrides for run in runs])
    if all(labels) and len(set(labels)) == len(labels):
        return labels
    return [f"{label} [{run.path.parent.name}/{run.path.name}]".lstrip() for label, run in zip(labels, runs)]


# ---------------------------------------------------------------------------- curves
def _curve(run: Run, plot: Plot) -> tuple[np.ndarray, np.ndarray]:
    """The run's values of ``plot.key`` against ``plot.x`` (wall time interpolated at the rows' steps)."""
    rows = [row for row in run.rows if plot.key in row and STEP in row]
    if plot.x == WALL_TIME:
        xs = run.at_step(WALL_TIME, [row[STEP] for row in rows])
        rows = rows[: len(xs)]
    else:
        rows = [row for row in rows if plot.x in row]
        xs = [row[plot.x] for row in rows]
    return np.asarray(xs, dtype=float), np.asarray([row[plot.key] for row in rows], dtype=float)


def band(curves: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Mean, min and max over curves on a common x grid: their x values where all of them
    have data, each curve linearly interpolated onto it."""
    low, high = max(xs[0] for xs, _ in curves), min(xs[-1] for xs, _ in curves)
    grid = np.unique(np.concatenate([xs[(xs >= low) & (xs <= high)] for xs, _ in curves]))
    values = np.stack([np.interp(grid, xs, ys) for xs, ys in curves])
    return grid, values.mean(axis=0), values.min(axis=0), values.max(axis=0)


def plot_groups(groups: list[Group], plot: Plot, path: Path) -> bool:
    """Each group's mean curve with its min-max band over seeds; False when no run logged the metric."""
    figure, axis = plt.subplots(figsize=(8, 5))
    drawn = False
    for group in groups:
        curves = [curve for curve in (_curve(run, plot) for run in group.runs) if len(curve[0])]
        if not curves:
            continue
        grid, mean, low, high = band(curves)
        label = textwrap.fill(f"{group.name} (n={len(curves)})", 100)
        (line,) = axis.plot(grid, mean, label=label, marker="." if len(grid) < 30 else None)
        if len(curves) > 1:
            axis.fill_between(grid, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
        drawn = True
    if drawn:
        axis.set(xlabel=X_LABELS[plot.x], ylabel=plot.label, title=f"{plot.label} (mean, band: min-max over seeds)")
        # Below the axes: sweep labels are long, and inside they would cover the curves.
        axis.legend(fontsize="small", loc="upper left", bbox_to_anchor=(0, -0.12))
        figure.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(figure)
    return drawn


FRONT_FILE = "front.png"


def pareto_front(points: dict[str, tuple[float, float]]) -> list[str]:
    """The names of the points no other point beats (no more x and lower y, or less x and no
    more y), in order of x: the best y each x budget buys."""

    def beaten(x: float, y: float) -> bool:
        return any((ox <= x and oy < y) or (ox < x and oy <= y) for ox, oy in points.values())

    return sorted((name for name, (x, y) in points.items() if not beaten(x, y)), key=lambda name: points[name][0])


def plot_front(report: "StudyReport", path: Path) -> bool:
    """For a study with front claims: every group's final y against x (mean, error bars: std
    over seeds), and the Pareto front of the front claims' arms as a line. False when the
    study has no front claim or no group logged both metrics."""
    claims = [claim for claim in (report.spec.claims if report.spec else []) if claim.front]
    if not claims:
        return False
    x, y = claims[0].x, claims[0].y
    front_arms = {arm for claim in claims for arm in claim.front}
    spreads = {group.name: (group.spread(x), group.spread(y), group.arm in front_arms) for group in report.groups}
    spreads = {name: found for name, found in spreads.items() if found[0] is not None and found[1] is not None}
    if not spreads:
        return False
    figure, axis = plt.subplots(figsize=(8, 5))
    for name, (sx, sy, on_front) in spreads.items():
        axis.errorbar(
            sx.mean,
            sy.mean,
            xerr=sx.std,
            yerr=sy.std,
            fmt="s" if on_front else "o",
            capsize=3,
            label=textwrap.fill(f"{name} (n={sy.n})", 60),
        )
    front = pareto_front({name: (sx.mean, sy.mean) for name, (sx, sy, on_front) in spreads.items() if on_front})
    axis.plot(
        [spreads[n][0].mean for n in front],
        [spreads[n][1].mean for n in front],
        "k--",
        label=textwrap.fill(f"Pareto front: {', '.join(front)}", 60),
    )
    x_label = X_LABELS.get(DERIVED.get(x, x), x)
    axis.set(xscale="log", xlabel=x_label, ylabel=y, title=f"final {y} against {x_label} (mean ± std over seeds)")
    axis.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.02, 1))
    figure.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(figure)
    return True


CROSSED_FILE = "crossed.png"


def crossed_axis(groups: list[Group], spec: StudySpec | None) -> tuple[str, dict[str, float]] | None:
    """The one numeric setting a study crossed its arms with (``seqlen_lr``'s learning rate):
    its key and each group's value, or None when the groups differ otherwise."""
    if spec is None or not groups or not all(group.arm for group in groups):
        return None
    values, keys = {}, set()
    for group in groups:
        own = [o for o in crossed_with(group.runs[0], spec) if o not in _shared(groups, spec)]
        if len(own) != 1:
            return None
        key, _, text = own[0].partition("=")
        try:
            values[group.name] = float(text)
        except ValueError:
            return None
        keys.add(key)
    return (keys.pop(), values) if len(keys) == 1 and len(set(values.values())) > 1 else None


def _shared(groups: list[Group], spec: StudySpec) -> set[str]:
    return set.intersection(*(set(crossed_with(group.runs[0], spec)) for group in groups))


def plot_crossed(report: "StudyReport", path: Path) -> bool:
    """A study's headline when its arms were crossed with one number: each arm's final
    val/loss (mean, error bars: std over seeds) against that number, and beside it the first
    extra column the study asks for (the sequence-length study's spikes). False otherwise."""
    groups = report.judged_groups
    axis_values = crossed_axis(groups, report.spec)
    if axis_values is None:
        return False
    key, values = axis_values
    panels = ["val/loss", *report.spec.columns[:1]]
    figure, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.5), squeeze=False)
    for axis, metric in zip(axes[0], panels):
        for arm in dict.fromkeys(group.arm for group in groups):
            points = sorted((values[g.name], g.spread(metric)) for g in groups if g.arm == arm and g.spread(metric))
            if points:
                axis.errorbar(
                    [x for x, _ in points],
                    [s.mean for _, s in points],
                    yerr=[s.std for _, s in points],
                    marker="o",
                    capsize=3,
                    label=arm,
                )
        axis.set(xscale="log", xlabel=key, ylabel=metric, title=f"final {metric}")
        axis.legend(fontsize="small")
    figure.suptitle(f"against {key}: mean, error bars std over seeds")
    figure.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(figure)
    return True


def evaluation_plots(runs: list[Run]) -> list[Plot]:
    """One plot per downstream evaluation metric (``eval/<task>/<metric>``) any run logged."""
    keys = sorted({key for run in runs for row in run.rows for key in row if key.startswith("eval/")})
    return [Plot(key, key, key.replace("/", "_") + ".png") for key in keys]


# ---------------------------------------------------------------------------- tables
def _cell(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if value.is_integer() or abs(value) >= 100 else f"{value:.4f}"


def final_table(runs: list[Run], labels: list[str]) -> str:
    """One row per run: its last value of each metric ('-' if never logged), evaluation included."""
    columns = [*COLUMNS, *((plot.key, plot.key) for plot in evaluation_plots(runs))]
    rows = [
        {"run": label, **{name: _cell(run.final(key)) for name, key in columns}} for label, run in zip(labels, runs)
    ]
    return markdown_table(rows)


def group_table(groups: list[Group], extra: tuple[str, ...] = ()) -> str:
    """One row per group: seeds, and mean ± std over seeds of each final value (and of the
    ``extra`` expressions a study asks for, e.g. ``max(stability/loss_spike_ratio)``)."""
    rows = []
    for group in groups:
        row = {"group": group.name, "seeds": f"{len(group.runs)} ({', '.join(str(s) for s in group.seeds)})"}
        for name, key in (*GROUP_COLUMNS, *((e, e) for e in extra)):
            spread = group.spread(key)
            row[name] = str(spread) if spread is not None else "-"
        rows.append(row)
    return markdown_table(rows)


def verdict_table(verdicts: list[Verdict]) -> str:
    rows = [{"claim": v.claim.claim, "measured": "; ".join(v.measured), "verdict": v.verdict} for v in verdicts]
    return markdown_table(rows)


# ---------------------------------------------------------------------------- the report
@dataclass
class StudyReport:
    """Runs, their groups and, for a study with claims, the verdicts."""

    runs: list[Run]
    groups: list[Group]
    spec: StudySpec | None
    verdicts: list[Verdict] = field(default_factory=list)
    #: A tuned study's searches by (arm, what the study was crossed with), as its runs show them.
    tunings: dict[tuple[str, str], Tuning] = field(default_factory=dict)
    #: Sweep jobs left out because they have not finished (interrupted, or still training).
    unfinished: list[Run] = field(default_factory=list)

    @property
    def judged_groups(self) -> list[Group]:
        """The groups that judge claims: all but a tuned study's tuning runs."""
        return [group for group in self.groups if group.phase != "tune"]

    def markdown(self) -> str:
        extra = tuple(self.spec.columns) if self.spec else ()
        parts = []
        if self.tunings:
            seeds = ", ".join(map(str, self.spec.tuning_seeds))
            parts.append(
                f"## Tuning (seeds {seeds}; each arm's winner, judged below on other seeds)\n\n{tuning_table(self.tunings)}"
            )
        title = "Judging runs" if self.tunings else "Groups"
        judged = group_table(self.judged_groups, extra) if self.judged_groups else "No judging run has finished yet."
        parts.append(f"## {title} (mean ± std over seeds)\n\n{judged}")
        if self.verdicts:
            parts.append(f"## Claims\n\n{verdict_table(self.verdicts)}")
        if self.unfinished:
            jobs = ", ".join(run.path.name for run in self.unfinished)
            parts.append(
                f"Left out: {len(self.unfinished)} sweep job(s) that have not finished (interrupted or"
                f" still training): {jobs}."
            )
        return "\n\n".join(parts)


def study_spec(runs: list[Run]) -> StudySpec | None:
    """The study block the runs were made with, if they are a study's: the last job's, which
    is the newest when arms or claims were appended to a preset between two resumptions."""
    for run in reversed(runs):
        node = run.setting("study")
        if isinstance(node, dict) and node.get("arms"):
            return StudySpec.from_config(node)
    return None


def build_report(runs: list[Run]) -> StudyReport:
    groups = group_runs(runs)
    spec = study_spec(runs)
    if spec is None:
        return StudyReport(runs, groups, spec)
    found = tunings(spec, runs) if spec.tuned else {}
    judged = at_winners(spec, judging_groups(groups), found)
    crossings = ladder_crossings(spec, judged)
    if crossings:
        return StudyReport(runs, groups, spec, ladder_verdicts(spec, crossings, found), found)
    untuned = frozenset(arm for (arm, _), tuning in found.items() if not tuning.tuned)
    looks = judge_in_looks(spec, [arm_spreads(spec, judged)], untuned).verdicts[0]
    verdicts = [judge_trend(claim, [], untuned) if claim.trend else looks[i] for i, claim in enumerate(spec.claims)]
    return StudyReport(runs, groups, spec, verdicts, found)


def judging_groups(groups: list[Group]) -> list[Group]:
    """The groups the claims judge: neither tuning runs nor a held-out size's."""
    return [group for group in groups if group.phase not in ("tune", HELD_OUT)]


def at_winners(spec: StudySpec, groups: list[Group], found: dict[tuple[str, str], Tuning]) -> list[Group]:
    """The judging groups at each searched arm's winner: a winner that changed (the pick's rule
    or a budget changed and the study was resumed) leaves its predecessor's judging runs in the
    folder, which no longer judge the arm (the plan's looks leave them out the same way)."""
    kept = []
    for group in groups:
        space = spec.spaces.get(group.arm)
        crossing = set(crossed_with(group.runs[0], spec)) if space is not None else set()
        winners = [t.winner for (arm, label), t in found.items() if arm == group.arm and set(label.split()) <= crossing]
        if space is None or not space.dimensions or not winners or space.point_of(group.runs[0].overrides) in winners:
            kept.append(group)
    return kept


def ladder_crossings(spec: StudySpec, judged: list[Group]) -> dict[tuple[str, ...], list[Group]]:
    """A ladder's judged groups by what each size's jobs were crossed with (empty when the
    study is not crossed with more than one model size)."""
    crossings: dict[tuple[str, ...], list[Group]] = {}
    for group in judged:
        if group.arm:
            crossings.setdefault(crossed_with(group.runs[0], spec), []).append(group)
    return crossings if len({override_value(list(c), "model") for c in crossings}) > 1 else {}


def every_size_trends(report: StudyReport) -> list[Verdict]:
    """A ladder's trend claims judged with every size's searched winner, the sizes whose
    search is not tuned included: exploratory, beside the claims' verdicts (which leave those
    sizes out), to show how much the exclusions move a trend. Empty unless a ladder has a
    trend claim and a size that is not tuned."""
    spec = report.spec
    if spec is None or not any(c.trend for c in spec.claims) or all(t.tuned for t in report.tunings.values()):
        return []
    crossings = ladder_crossings(spec, at_winners(spec, judging_groups(report.groups), report.tunings))
    if not crossings:
        return []
    verdicts = ladder_verdicts(spec, crossings, report.tunings, leave_out_untuned=False)
    return [
        replace(v, claim=replace(v.claim, claim=f"{v.claim.claim} (every size, exploratory)"))
        for v in verdicts
        if v.claim.trend
    ]


def arm_spreads(spec: StudySpec, groups: list[Group]) -> dict[str, dict[str, Spread]]:
    """Each arm's spreads of the metrics the study's claims read."""
    spreads: dict[str, dict[str, Spread]] = {}
    for claim in spec.claims:
        for arm, metrics in claim_spreads(claim, groups).items():
            spreads.setdefault(arm, {}).update(metrics)
    return spreads


def ladder_verdicts(
    spec: StudySpec,
    crossings: dict[tuple[str, ...], list[Group]],
    found: dict[tuple[str, str], Tuning],
    leave_out_untuned: bool = True,
) -> list[Verdict]:
    """A study crossed with model sizes (a ladder): each plain claim judged at each size (its
    text names it), each trend claim across them, in the looks the study's plan made
    (``study/looks.py``). An arm whose search at a size is not tuned is not judged there
    (``not tuned``) and leaves the trend, as the plan's looks leave it out (in a ladder with a
    held-out size its winner's judging runs exist: the loss fits read them).
    ``leave_out_untuned=False`` judges every arm at every size (``every_size_trends``)."""
    labels = distinct_crossings(list(crossings))
    bases, sizes, untuned_at = [], [], []
    for crossing, members in crossings.items():
        untuned = {
            arm
            for (arm, label), t in found.items()
            if leave_out_untuned and set(label.split()) <= set(crossing) and not t.tuned
        }
        bases.append({arm: m for arm, m in arm_spreads(spec, members).items() if arm not in untuned})
        sizes.append(parameter_count(members[0].runs[0].setting("model")))
        untuned_at.append(untuned)
    judgement = judge_in_looks(spec, bases, sizes=sizes if any(c.trend for c in spec.claims) else None)
    verdicts = []
    for i, claim in enumerate(spec.claims):
        if claim.trend:
            verdicts.append(judgement.trends[i])
            continue
        for label, untuned, per_base in zip(labels.values(), untuned_at, judgement.verdicts):
            named = replace(claim, claim=f"{claim.claim} [{label}]")
            shown = Verdict(named, per_base[i].measured, per_base[i].verdict)
            if {*claim.arms} & untuned:
                shown = Verdict(named, [f"{', '.join(sorted({*claim.arms} & untuned))} not tuned here"], NOT_TUNED)
            verdicts.append(shown)
    return verdicts


def claim_spreads(claim: Claim, groups: list[Group]) -> dict[str, dict[str, Spread]]:
    """The spreads a claim compares, by arm (an arm without a finished run is left out: not
    run). An arm the sweep split into several groups (crossed with other values) has no
    single spread: it maps to nothing, so the claim is inconclusive rather than wrong."""
    spreads = {}
    for arm in claim.arms:
        matching = [group for group in groups if group.arm == arm]
        if len(matching) == 1:
            found = {metric: matching[0].spread(metric) for metric in claim.metrics}
            spreads[arm] = {metric: spread for metric, spread in found.items() if spread is not None}
        elif matching:
            spreads[arm] = {}
    return spreads


def study_report(paths: list[str | Path]) -> StudyReport:
    """The report on every run under ``paths`` (run or sweep folders), for notebooks and scripts.

    Where any run is a finished sweep job, only finished jobs count: an interrupted or running
    job's last logged loss would enter its group's mean, and a claim, as if it were final.
    Single runs (no sweep) leave no marker, so a set without any is taken whole."""
    runs = find_runs(list(paths))
    sweep = any(run.finished for run in runs)
    report = build_report([run for run in runs if run.finished or not sweep])
    report.unfinished = [run for run in runs if sweep and not run.finished]
    return report


def write_report(report: StudyReport, out: Path) -> list[str]:
    """Write the plots and ``report.md`` to ``out``; returns what was skipped and why."""
    out.mkdir(parents=True, exist_ok=True)
    written, skipped = [], []
    # Curves are drawn for judged groups only: a study still searching has none yet, and
    # saying that its runs "logged nothing" would send the reader looking for a logging bug.
    missing = "no judging run has finished yet" if report.tunings and not report.judged_groups else "no run logged it"
    for plot in (*PLOTS, *evaluation_plots(report.runs)):
        if plot_groups(report.judged_groups, plot, out / plot.file):
            written.append(plot)
        else:
            skipped.append(f"{plot.key} against {X_LABELS[plot.x]}: {missing}, so {plot.file} was not written")
    labels = run_labels(report.runs)
    images = "\n\n".join(f"![{plot.label} against {X_LABELS[plot.x]}]({plot.file})" for plot in written)
    if plot_front(report, out / FRONT_FILE):
        images = f"![final loss against optimizer steps, with the front]({FRONT_FILE})\n\n{images}"
    if plot_crossed(report, out / CROSSED_FILE):
        images = f"![final loss against the crossed setting]({CROSSED_FILE})\n\n{images}"
    for path in reversed(tuning_figures(report.tunings, out)):
        images = f"![{path.stem}]({path.name})\n\n{images}"
    folders = "\n".join(f"- {label}: `{run.path}`" for label, run in zip(labels, report.runs))
    runs = f"## Runs\n\n{final_table(report.runs, labels)}\n\n{folders}"
    (out / "report.md").write_text(f"# Report\n\n{report.markdown()}\n\n{runs}\n\n{images}\n")
    return skipped

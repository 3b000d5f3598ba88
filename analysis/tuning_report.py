"""What a tuned study's search found, read back from its runs: winners, statuses, figures.

Each arm's tuning runs (``study.phase=tune``, finished) are placed on its search space by
their overrides; a point counts once every tuning seed finished, at the mean of ``select``
over them. The search's own rules (``analysis/tuner.py``) then name the winner, the status
of each dimension and the anchors that beat it, so the report and the sweeper can never
disagree on them.
"""

import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from analysis.runs import Run  # noqa: E402
from analysis.search_space import Choice, Range, describe  # noqa: E402
from analysis.study import StudySpec  # noqa: E402
from analysis.tuner import Tuning  # noqa: E402


def tunings(spec: StudySpec, runs: list[Run], select: str = "val/loss") -> dict[tuple[str, str], Tuning]:
    """Each search as its finished tuning runs show it, by (arm, the values the study was
    crossed with, e.g. ``model=ladder_0_1m``; empty when it was not)."""
    by_search: dict[tuple[str, tuple[str, ...]], dict[tuple[int, ...], dict[int, float]]] = {}
    for run in runs:
        if run.arm not in spec.spaces or run.phase != "tune" or not run.finished or run.seed is None:
            continue
        space = spec.spaces[run.arm]
        point, value = space.point_of(run.overrides), run.final(select)
        if point is not None and value is not None:
            search = by_search.setdefault((run.arm, crossed_with(run, spec)), {})
            search.setdefault(point, {})[run.seed] = value
    labels = distinct_crossings([crossing for _, crossing in by_search])
    found = {}
    for (arm, crossing), by_point in by_search.items():
        results = {p: sum(v[s] for s in spec.tuning_seeds) / len(spec.tuning_seeds)
                   for p, v in by_point.items() if set(spec.tuning_seeds) <= set(v)}  # fmt: skip
        found[(arm, labels[crossing])] = Tuning(spec.searches[arm], results)
    return found


def crossed_with(run: Run, spec: StudySpec) -> tuple[str, ...]:
    """A run's overrides that are neither its arm's, its point's nor the study's own."""
    searched = set(spec.spaces[run.arm].keys) if run.arm in spec.spaces else set()
    fixed = set(spec.arms.get(run.arm, []))
    return tuple(o for o in run.overrides if o not in fixed and not o.startswith(("study.arm=", "++study.phase=", "seed="))
                 and o.split("=", 1)[0].lstrip("+~") not in searched)  # fmt: skip


def distinct_crossings(crossings: list[tuple[str, ...]]) -> dict[tuple[str, ...], str]:
    """Short labels: each crossing less what they all share (empty when there is one)."""
    shared = set.intersection(*(set(c) for c in crossings)) if crossings else set()
    return {crossing: " ".join(o for o in crossing if o not in shared) for crossing in crossings}


def tuning_table(found: dict[tuple[str, str], Tuning]) -> str:
    """Per search: the searcher and points run, the winner's settings and loss, each
    dimension's status, the anchors' losses and the verdict of the regret check."""
    lines = ["| arm | searcher | points run | winner | tuning loss | dimensions | anchors | tuned |", "|---|---|---|---|---|---|---|---|"]
    for (name, crossing), tuning in found.items():
        arm, search = f"{name} {crossing}".strip(), tuning.search
        budget = f" (budget {search.budget})" if search.budget is not None else ""
        if tuning.winner is None:
            lines.append(f"| {arm} | {search.searcher}{budget} | {len(tuning.results)} | - | - | not run | - | no |")
            continue
        settings = ", ".join(f"{k}={v}" for k, v in tuning.space.labels(tuning.winner).items()) or "(nothing searched)"
        statuses = ", ".join(f"{k.split('.')[-1]}: {s}" for k, s in tuning.statuses.items()) or "-"
        loss = tuning.results.get(tuning.winner)
        anchors = "; ".join(f"{_short(tuning, a)}: {tuning.results[a]:.4f}" if a in tuning.results else f"{_short(tuning, a)}: not run"
                            for a in search.anchors) or "-"  # fmt: skip
        lines.append(f"| {arm} | {search.searcher}{budget} | {len(tuning.results)} | {settings} | {'-' if loss is None else f'{loss:.4f}'}"
                     f" | {statuses} | {anchors} | {_tuned(tuning)} |")  # fmt: skip
    spaces = {name: tuning.space for (name, _), tuning in found.items() if tuning.space.dimensions}
    lines.append("\nFirst grids: " + "; ".join(f"{name}: {', '.join(map(describe, space.dimensions))}" for name, space in spaces.items()))
    return "\n".join(lines)


def _short(tuning: Tuning, point: tuple[int, ...]) -> str:
    return ", ".join(f"{k.split('.')[-1]}={v}" for k, v in tuning.space.labels(point).items())


def _tuned(tuning: Tuning) -> str:
    """yes, or why not: points left, a dimension not bracketed, an anchor that beat the winner."""
    if tuning.tuned:
        return "yes"
    if tuning.pending:
        return f"no: {len(tuning.pending)} point(s) to run"
    if tuning.beaten_by:
        best = min(loss for _, loss in tuning.beaten_by)
        return f"no: an anchor beat the winner by {tuning.results[tuning.winner] - best:.4f}"
    return "no: not bracketed"


def tuning_figures(found: dict[tuple[str, str], Tuning], out: Path, select: str = "val/loss") -> list[Path]:
    """One PNG per searched setting: each arm's loss along that setting with its other settings
    at the winner's (the line the bracketing rule looks at), the winner starred."""
    keys = list(dict.fromkeys(d.key for t in found.values() for d in t.space.dimensions))
    written = []
    for key in keys:
        figure, axis = plt.subplots(figsize=(7, 4.5))
        drawn_any = False
        for (name, crossing), tuning in found.items():
            arm = f"{name} {crossing}".strip()
            axes = [i for i, d in enumerate(tuning.space.dimensions) if d.key == key]
            if not axes or tuning.winner not in tuning.results:
                continue
            index, dimension = axes[0], tuning.space.dimensions[axes[0]]
            points = sorted(_on_line(tuning, index), key=lambda p: p[index])
            categorical, drawn_any = isinstance(dimension, Choice), True
            xs = [p[index] if categorical else dimension.value(p[index]) for p in points]
            (drawn,) = axis.plot(xs, [tuning.results[p] for p in points], marker="o", label=f"{arm} ({tuning.statuses[key]})")
            best = tuning.winner[index] if categorical else dimension.value(tuning.winner[index])
            axis.plot([best], [tuning.results[tuning.winner]], marker="*", markersize=16, color=drawn.get_color())
            if categorical:
                axis.set_xticks(list(dimension.first_grid), [textwrap.fill(dimension.label(i), 18) for i in dimension.first_grid], fontsize="small")
            elif isinstance(dimension, Range) and dimension.scale == "log":
                axis.set_xscale("log")
        if not drawn_any:
            plt.close(figure)
            continue
        axis.set(xlabel=key, ylabel=f"final {select} (mean over tuning seeds)",
                 title=textwrap.fill(f"{key}: each arm at its winner's other settings (star: winner)", 70))  # fmt: skip
        axis.legend(fontsize="small")
        path = out / f"tuning_{key.replace('.', '_')}.png"
        figure.savefig(path, dpi=120, bbox_inches="tight")
        plt.close(figure)
        written.append(path)
    return written


def _on_line(tuning: Tuning, index: int) -> list[tuple[int, ...]]:
    """Every point run that differs from the winner only along ``index`` (the winner too)."""
    winner = tuning.winner
    return [p for p in tuning.results if all(a == b for i, (a, b) in enumerate(zip(p, winner)) if i != index)]

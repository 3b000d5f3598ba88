"""What a tuned study's search found, read back from its runs: winners, statuses, figures.

Each arm's tuning runs (``study.phase=tune``, finished) are placed on its search space by
their overrides; a point counts once every tuning seed finished, at the mean of ``select``
over them, and its runs on the finalist seeds are kept per seed. A joint search reads only the
points its replay asked (``Tuning.searched``): a run an earlier preset left in the same space
stays out of its table, finalists and brackets. The search's own rules (``study/tuner.py``) then name the winner, the status
of each dimension and the anchors that beat it, so the report and the sweeper can never
disagree on them.
"""

import math
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from analysis.runs import Run
from analysis.scaling_laws import parameter_count
from common.overrides import override_key
from study.claim_tests import ONE_SIDED_ALPHA
from study.coordinate_search import TUNED as TUNED_STATUSES
from study.joint_search import SAMPLERS
from study.preset import StudySpec
from study.search_record import JOURNAL, SearchRecord, fingerprint, open_storage, search_name, written_by_another
from study.search_space import Choice, Range, describe
from study.selection import NOT_TUNED, UNDECIDED, AnchorLead
from study.tuner import Tuning, anchored_on, tuning_from_seeds


def tunings(spec: StudySpec, runs: list[Run], select: str = "val/loss") -> dict[tuple[str, str], Tuning]:
    """Each search as its finished tuning runs show it, by (arm, the values the study was
    crossed with, e.g. ``model=ladder_0_1m``; empty when it was not). A ladder's search that
    anchors on the next smaller size gets that size's winner, as the plan gave it."""
    by_search: dict[tuple[str, tuple[str, ...]], dict[tuple[int, ...], dict[int, float]]] = {}
    sizes: dict[tuple[str, ...], int] = {}
    by_size = any(search.previous_size_anchor for search in spec.searches.values())
    for run in runs:
        if run.arm not in spec.spaces or run.phase != "tune" or not run.finished or run.seed is None:
            continue
        space = spec.spaces[run.arm]
        point, value = space.point_of(run.overrides), run.final(select)
        if point is not None and value is not None:
            crossing = crossed_with(run, spec)
            search = by_search.setdefault((run.arm, crossing), {})
            search.setdefault(point, {})[run.seed] = value
            if by_size and crossing not in sizes:  # every arm's: a size may have only some arms' runs yet
                sizes[crossing] = parameter_count(run.setting("model"))
    labels = distinct_crossings([crossing for _, crossing in by_search])
    records = _records(spec, runs, [(arm, crossing) for arm, crossing in by_search])
    found: dict[tuple[str, tuple[str, ...]], Tuning] = {}
    for arm, crossing in sorted(by_search, key=lambda search: sizes.get(search[1], 0)):
        smaller = [c for a, c in found if a == arm and sizes.get(c, 0) < sizes.get(crossing, 0)]
        previous = found[(arm, max(smaller, key=sizes.get))] if smaller else None
        search = anchored_on(spec.searches[arm], previous if previous is not None and previous.over else None)
        found[(arm, crossing)] = tuning_from_seeds(
            search, spec.tuning_seeds, by_search[(arm, crossing)], records.get((arm, crossing))
        )
    return {(arm, labels[crossing]): found[(arm, crossing)] for arm, crossing in by_search}


def _records(spec: StudySpec, runs: list[Run], searches: list[tuple[str, tuple[str, ...]]]) -> dict:
    """Each joint search's record, read-only, where the runs' sweep folder keeps one (the
    report then reads the rounds as they were asked; a study record elsewhere, ``study.storage``,
    is read from there)."""
    folders = sorted({run.path.parent for run in runs if (run.path.parent / JOURNAL).is_file()})
    if not folders and spec.storage is None:
        return {}
    storage = open_storage(spec.storage, folders[0] if folders else Path("."))
    found = {}
    for arm, crossing in searches:
        search = spec.searches[arm]
        name, print_ = search_name(arm, list(crossing)), fingerprint(search)
        if search.searcher in SAMPLERS and written_by_another(storage, name, print_) is None:
            try:
                found[(arm, crossing)] = SearchRecord(storage, name, print_, Path(), read_only=True)
            except KeyError:  # no such search in the record
                continue
    return found


def crossed_with(run: Run, spec: StudySpec) -> tuple[str, ...]:
    """A run's overrides that are neither its arm's, its point's nor the study's own."""
    searched = set(spec.spaces[run.arm].keys) if run.arm in spec.spaces else set()
    fixed = set(spec.arms.get(run.arm, []))
    return tuple(
        o
        for o in run.overrides
        if o not in fixed
        and not o.startswith(("study.arm=", "++study.phase=", "seed="))
        and override_key(o) not in searched
    )


def distinct_crossings(crossings: list[tuple[str, ...]]) -> dict[tuple[str, ...], str]:
    """Short labels: each crossing less what they all share (empty when there is one)."""
    shared = set.intersection(*(set(c) for c in crossings)) if crossings else set()
    return {crossing: " ".join(o for o in crossing if o not in shared) for crossing in crossings}


def tuning_table(found: dict[tuple[str, str], Tuning]) -> str:
    """Per search: the searcher and points run, the winner's settings and loss (its mean over
    the seeds that picked it), each dimension's status, each anchor's lead over the search's own
    best (the regret test) and the verdict."""
    lines = [
        "| arm | searcher | points run | winner | winner's loss | dimensions | anchors (loss; own best minus anchor) | tuned |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (name, crossing), tuning in found.items():
        arm, search = f"{name} {crossing}".strip(), tuning.search
        budget = f" (budget {search.budget}{_finalists(tuning)})" if search.budget is not None else ""
        if tuning.winner is None:
            lines.append(f"| {arm} | {search.searcher}{budget} | {len(tuning.searched)} | - | - | not run | - | no |")
            continue
        settings = ", ".join(f"{k}={v}" for k, v in tuning.space.labels(tuning.winner).items()) or "(nothing searched)"
        statuses = ", ".join(f"{k.split('.')[-1]}: {s}" for k, s in tuning.statuses.items()) or "-"
        seeds = len(tuning.votes(tuning.winner))
        loss = (
            f"{tuning.mean(tuning.winner):.4f}" + (f" ({seeds} seeds)" if tuning.selection_seeds else " (tuning seeds)")
            if tuning.winner in tuning.results
            else "-"
        )
        if tuning.winner not in tuning.own:
            loss += ", an anchor"
        leads = {lead.anchor: lead for lead in tuning.anchor_leads}
        anchors = "; ".join(_anchor(tuning, a, leads.get(a)) for a in search.anchors) or "-"
        lines.append(
            f"| {arm} | {search.searcher}{budget} | {len(tuning.searched)} | {settings} | {loss} | {statuses} | {anchors} | {_tuned(tuning)} |"
        )
    spaces = {name: tuning.space for (name, _), tuning in found.items() if tuning.space.dimensions}
    lines.append(
        "\nFirst grids: "
        + "; ".join(f"{name}: {', '.join(map(describe, space.dimensions))}" for name, space in spaces.items())
    )
    return "\n".join(lines)


def _finalists(tuning: Tuning) -> str:
    """ ", 3 finalists on seeds 21-24 (of up to 26)": the finalist seeds the pick used, and how many it may take."""
    search = tuning.search
    if not search.finalists:
        return ""
    used = tuning.selection_seeds or search.finalist_seeds[: search.first_finalist_seeds]
    text = f", {search.finalists} finalists on seeds {', '.join(map(str, used))}"
    if len(search.finalist_seeds) > len(used):
        text += f" (of up to {len(search.finalist_seeds)})"
    return text


def _anchor(tuning: Tuning, anchor: tuple[int, ...], lead: AnchorLead | None) -> str:
    if anchor not in tuning.searched:
        return f"{_short(tuning, anchor)}: not run"
    return f"{_short(tuning, anchor)}: {tuning.mean(anchor):.4f}; {lead.lead.text(ONE_SIDED_ALPHA) if lead else 'the own best'}"


def _short(tuning: Tuning, point: tuple[int, ...]) -> str:
    return ", ".join(f"{k.split('.')[-1]}={v}" for k, v in tuning.space.labels(point).items())


def _tuned(tuning: Tuning) -> str:
    """yes, or why not: runs left, a dimension not bracketed, an anchor ahead of the search."""
    if tuning.tuned:
        return "yes"
    if tuning.pending or tuning.pending_reruns:
        return f"no: {len(tuning.pending) + len(tuning.pending_reruns)} run(s) to go"
    if any(s not in TUNED_STATUSES for s in tuning.statuses.values()):
        return "no: not bracketed"
    margin = tuning.search.regret_margin
    if ahead := [lead for lead in tuning.anchor_leads if lead.verdict == NOT_TUNED]:
        return f"no: an anchor leads the search by more than {margin:g}, {ahead[0].lead.text(ONE_SIDED_ALPHA)}"
    lead = next(lead for lead in tuning.anchor_leads if lead.verdict == UNDECIDED)
    needed = f"; {lead.seeds_needed} seeds would resolve it" if lead.seeds_needed else "; one seed, no spread to test"
    return f"undecided: an anchor leads the search by {lead.lead.value:.4f}, over {margin:g} but unresolved{needed}"


#: The figures show losses up to this far above the winner's (diverged runs would flatten the rest).
SHOWN_ABOVE_WINNER = 0.3


def tuning_figures(found: dict[tuple[str, str], Tuning], out: Path, select: str = "val/loss") -> list[Path]:
    """One PNG per searched setting: every point each arm's search ran (dots) against its value of that
    setting, the best run at each value (the line: the loss with every other setting at its
    best, which is what a joint search's bracketing means), the winner starred."""
    keys = list(dict.fromkeys(d.key for t in found.values() for d in t.space.dimensions))
    written = []
    for key in keys:
        figure, axis = plt.subplots(figsize=(7, 4.5))
        spans = [
            draw_setting(axis, f"{name} {crossing}".strip(), tuning, key) for (name, crossing), tuning in found.items()
        ]
        spans = [span for span in spans if span is not None]
        if not spans:
            plt.close(figure)
            continue
        axis.set_ylim(min(low for low, _ in spans), max(high for _, high in spans))
        axis.set(
            xlabel=key,
            ylabel=f"final {select} (mean over tuning seeds)",
            title=textwrap.fill(
                f"{key}: every point run (dots), the best at each value (line), the winner (star);"
                f" losses over {SHOWN_ABOVE_WINNER} above the winner's off the axis",
                70,
            ),
        )
        axis.legend(fontsize="small")
        path = out / f"tuning_{key.replace('.', '_')}.png"
        figure.savefig(path, dpi=120, bbox_inches="tight")
        plt.close(figure)
        written.append(path)
    return written


def draw_setting(axis: plt.Axes, arm: str, tuning: Tuning, key: str) -> tuple[float, float] | None:
    """Draw one arm's points along ``key``; returns the range of losses worth showing (None
    when the arm does not search ``key``, has no winner yet or no finite loss)."""
    axes = [i for i, d in enumerate(tuning.space.dimensions) if d.key == key]
    if not axes or tuning.winner not in tuning.results:
        return None
    index, dimension = axes[0], tuning.space.dimensions[axes[0]]
    categorical = isinstance(dimension, Choice)

    def x(grid_index: int) -> float:
        return grid_index if categorical else dimension.value(grid_index)

    finite = {p: loss for p, loss in tuning.searched.items() if math.isfinite(loss)}
    if not finite:  # every run diverged: nothing to draw
        return None
    best_at: dict[int, float] = {}
    for point, loss in finite.items():
        best_at[point[index]] = min(loss, best_at.get(point[index], math.inf))
    values = sorted(best_at)
    (line,) = axis.plot([x(v) for v in values], [best_at[v] for v in values], label=f"{arm} ({tuning.statuses[key]})")
    axis.plot(
        [x(p[index]) for p in finite], list(finite.values()), "o", color=line.get_color(), alpha=0.35, markersize=4
    )
    winner_loss = tuning.results[tuning.winner]
    axis.plot([x(tuning.winner[index])], [winner_loss], marker="*", markersize=16, color=line.get_color())
    if categorical:
        axis.set_xticks(
            list(dimension.first_grid),
            [textwrap.fill(dimension.label(i).replace(",", ", "), 18) for i in dimension.first_grid],
            fontsize="small",
        )
    elif isinstance(dimension, Range) and dimension.scale == "log":
        axis.set_xscale("log")
    return winner_loss - 0.01, min(max(finite.values()), winner_loss + SHOWN_ABOVE_WINNER) + 0.01

"""Which searcher finds the grid optimum: the joint search against the coordinate rule and
random search, on synthetic surfaces with the shapes tuned studies meet.

    python scripts/benchmark_searchers.py --seeds 10 --out outputs/searcher_benchmark_table.md

Each searcher runs against each surface (``benchmarks/searcher_surfaces.py``: a separable
bowl, DiLoCo's outer-step ridge, an LR x batch valley, each with 0.01 nats of seeded noise)
once per searcher seed. The joint searchers and random search get ``EXTRA`` points past the
budget the preset declares, so the table can say how many runs they needed even where it is
more; the coordinate rule runs until it is done (bracketed). Columns:

- ``reached``: searches in which a point within 0.005 nats of the grid optimum (noise-free)
  had run by the end of the declared budget;
- ``runs to reach``: median and worst number of runs (points) until then, over the seeds
  that reached it at all (within the budget and ``EXTRA`` more), at the end of a round;
- ``regret, lowest observation``: the noise-free loss of the point with the lowest observed
  loss at the declared budget minus the grid optimum's, median and worst (the rule before
  finalists: one noisy run each);
- ``picked regret``: the same for the winner a study picks at the declared budget, after its
  finalists and anchors ran on the finalist seeds (``study/selection.py``) where the preset
  declares them: what a study then judges; with how many searches it is within the regret
  margin of the optimum;
- ``runs for the pick``: every run the search and its pick cost (median, worst);
- ``tuned said wrongly``: searches the study calls ``tuned`` whose pick is more than the regret
  margin above the optimum; beside it the verdicts (tuned / not tuned / undecided).

``--anchor-optimum`` adds each surface's grid optimum to the anchors: a known point at the
optimum, which the pick must not lose to another candidate.
"""

import argparse
import statistics
from dataclasses import replace
from pathlib import Path

from benchmarks.searcher_surfaces import (
    NOISE,
    PRESET_NAME,
    TOLERANCE,
    Surface,
    finished_at,
    run_search,
    surfaces,
)
from study.selection import NOT_TUNED, TUNED, UNDECIDED
from study.tuner import Search

SEARCHERS = ("gp", "tpe", "random", "coordinate")
#: Points past the declared budget a search may run, to count the runs it needed beyond it.
EXTRA = 16


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=10, help="searcher seeds per surface (each with its own noise)")
    parser.add_argument(
        "--searchers", default=",".join(SEARCHERS), help="comma-separated, from " + ", ".join(SEARCHERS)
    )
    parser.add_argument("--surfaces", help="comma-separated surface names to run (default: all)")
    parser.add_argument("--anchor-optimum", action="store_true", help="add each surface's grid optimum to the anchors")
    parser.add_argument(
        "--preset", default=PRESET_NAME, help="the study preset whose DiLoCo search the DiLoCo surfaces use"
    )
    parser.add_argument(
        "--arm", default="m2", help="that preset's arm (one without DiLoCo settings: along its inner LR)"
    )
    parser.add_argument("--budget", type=int, help="points per search instead of the preset's budget")
    parser.add_argument("--out", type=Path, help="also write the table (markdown) here")
    return parser.parse_args(argv)


def with_optimum_anchor(surface: Surface) -> Surface:
    return replace(surface, search=replace(surface.search, anchors=(*surface.search.anchors, surface.optimum_point())))


def measure(
    searcher: str, seeds: int, names: list[str] | None = None, args: argparse.Namespace | None = None
) -> dict[str, dict]:
    """Per surface: the declared budget and, per seed, the runs to reach, the regrets, the runs
    the pick cost and the study's verdict on the search."""
    args = args or parse_args([])
    rows: dict[str, dict] = {}
    for seed in range(seeds):
        for surface in surfaces(searcher, seed, args.preset, args.arm):
            if names and surface.name not in names:
                continue
            surface = with_optimum_anchor(surface) if args.anchor_optimum else surface
            if args.budget is not None and searcher != "coordinate":
                surface = replace(surface, search=replace(surface.search, budget=args.budget))
            budget = surface.search.budget
            extended = replace(
                surface, search=replace(surface.search, budget=None if searcher == "coordinate" else budget + EXTRA)
            )
            optimum, trace = extended.optimum(), run_search(extended, noise_seed=1000 + seed)
            spent = budget if searcher != "coordinate" else trace.rounds[-1][0]
            picked = finished_at(surface, trace, spent, noise_seed=1000 + seed)
            row = rows.setdefault(
                surface.name,
                {
                    "budget": budget,
                    "search": surface.search,
                    "runs": [],
                    "observed": [],
                    "regret": [],
                    "cost": [],
                    "verdicts": [],
                },
            )
            row["runs"].append(trace.runs_to_reach(optimum + TOLERANCE))
            row["observed"].append(trace.winner_at(spent) - optimum)
            row["regret"].append(surface.true_loss(picked.winner) - optimum)
            row["cost"].append(len(picked.results) + sum(len(seeds) for seeds in picked.reruns.values()))
            row["verdicts"].append(picked.verdict)
            print(
                f"{searcher} seed {seed} {surface.name}: reached after {row['runs'][-1]} runs, picked regret"
                f" {row['regret'][-1]:.4f} after {row['cost'][-1]} runs, {picked.verdict}"
                f" (lowest observation {row['observed'][-1]:.4f})",
                flush=True,
            )
    return rows


def _spent(searcher: str, search: Search) -> str:
    """The budget as the table gives it: the points, and the finalists with their seeds."""
    spent = "until bracketed" if searcher == "coordinate" else str(search.budget)
    if search.finalists:
        first = search.first_finalist_seeds
        sized = (
            f"{first}-{len(search.finalist_seeds)} seeds" if first < len(search.finalist_seeds) else f"{first} seeds"
        )
        spent += f" + {search.finalists} finalists and {len(search.anchors)} anchors on {sized}"
    return spent


def table(found: dict[str, dict[str, dict]]) -> str:
    lines = [
        "| surface | searcher | budget | reached within budget | runs to reach (median, worst)"
        " | regret, lowest observation (median, worst) | picked regret (median, worst; within margin)"
        " | runs for the pick (median, worst) | tuned said wrongly (verdicts: tuned, not tuned, undecided) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name in next(iter(found.values())):
        for searcher, rows in found.items():
            row = rows[name]
            budget, search = row["budget"], row["search"]
            runs = [r for r in row["runs"] if r is not None]
            within = sum(r is not None and (searcher == "coordinate" or r <= budget) for r in row["runs"])
            reach = f"{statistics.median(runs):g}, {max(runs)}" if runs else "never"
            if len(runs) < len(row["runs"]):
                reach += f" ({len(row['runs']) - len(runs)} never)"
            margin = search.regret_margin
            close = sum(r <= margin + 1e-12 for r in row["regret"])
            wrong = sum(v == TUNED and r > margin + 1e-12 for v, r in zip(row["verdicts"], row["regret"]))
            counts = ", ".join(str(row["verdicts"].count(v)) for v in (TUNED, NOT_TUNED, UNDECIDED))
            lines.append(
                f"| {name} | {searcher} | {_spent(searcher, search)} | {within}/{len(row['runs'])} | {reach}"
                f" | {statistics.median(row['observed']):.4f}, {max(row['observed']):.4f}"
                f" | {statistics.median(row['regret']):.4f}, {max(row['regret']):.4f}; {close}/{len(row['regret'])}"
                f" | {statistics.median(row['cost']):g}, {max(row['cost'])} | {wrong} ({counts}) |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    names = args.surfaces.split(",") if args.surfaces else None
    found = {searcher: measure(searcher, args.seeds, names, args) for searcher in args.searchers.split(",")}
    text = f"Noise {NOISE} nats per run, tolerance {TOLERANCE} nats, {args.seeds} searcher seeds.\n\n{table(found)}\n"
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)


if __name__ == "__main__":
    main()

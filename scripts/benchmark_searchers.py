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
- ``winner regret``: the noise-free loss of the winner at the declared budget minus the grid
  optimum's, median and worst: what a study would judge.
"""

import argparse
import statistics
from dataclasses import replace
from pathlib import Path

from benchmarks.searcher_surfaces import NOISE, TOLERANCE, run_search, surfaces

SEARCHERS = ("gp", "tpe", "random", "coordinate")
#: Points past the declared budget a search may run, to count the runs it needed beyond it.
EXTRA = 16


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=10, help="searcher seeds per surface (each with its own noise)")
    parser.add_argument("--searchers", default=",".join(SEARCHERS), help="comma-separated, from " + ", ".join(SEARCHERS))
    parser.add_argument("--surfaces", help="comma-separated surface names to run (default: all)")
    parser.add_argument("--out", type=Path, help="also write the table (markdown) here")
    return parser.parse_args(argv)


def measure(searcher: str, seeds: int, names: list[str] | None = None) -> dict[str, dict]:
    """Per surface: the declared budget and, per seed, the runs to reach and the winner's regret."""
    rows: dict[str, dict] = {}
    for seed in range(seeds):
        for surface in surfaces(searcher, seed):
            if names and surface.name not in names:
                continue
            budget = surface.search.budget
            extended = replace(surface, search=replace(surface.search, budget=None if searcher == "coordinate" else budget + EXTRA))
            optimum, trace = extended.optimum(), run_search(extended, noise_seed=1000 + seed)
            row = rows.setdefault(surface.name, {"budget": budget, "runs": [], "regret": []})
            row["runs"].append(trace.runs_to_reach(optimum + TOLERANCE))
            row["regret"].append(trace.winner_at(budget if searcher != "coordinate" else trace.rounds[-1][0]) - optimum)
            print(f"{searcher} seed {seed} {surface.name}: reached after {row['runs'][-1]} runs, regret {row['regret'][-1]:.4f}", flush=True)
    return rows


def table(found: dict[str, dict[str, dict]]) -> str:
    lines = ["| surface | searcher | budget | reached within budget | runs to reach (median, worst) | winner regret at budget (median, worst) |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for name in next(iter(found.values())):
        for searcher, rows in found.items():
            row = rows[name]
            budget = row["budget"]
            runs = [r for r in row["runs"] if r is not None]
            within = sum(r is not None and (searcher == "coordinate" or r <= budget) for r in row["runs"])
            reach = f"{statistics.median(runs):g}, {max(runs)}" if runs else "never"
            if len(runs) < len(row["runs"]):
                reach += f" ({len(row['runs']) - len(runs)} never)"
            spent = "until bracketed" if searcher == "coordinate" else str(budget)
            regret = f"{statistics.median(row['regret']):.4f}, {max(row['regret']):.4f}"
            lines.append(f"| {name} | {searcher} | {spent} | {within}/{len(row['runs'])} | {reach} | {regret} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    names = args.surfaces.split(",") if args.surfaces else None
    found = {searcher: measure(searcher, args.seeds, names) for searcher in args.searchers.split(",")}
    text = f"Noise {NOISE} nats per run, tolerance {TOLERANCE} nats, {args.seeds} searcher seeds.\n\n{table(found)}\n"
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)


if __name__ == "__main__":
    main()

"""A soak of fault-tolerant DiLoCo: M replica groups on loopback, killed (SIGKILL) again and again,
then the combined failures one by one.

    python scripts/benchmark_diloco_chaos.py --out outputs/benchmarks/diloco_chaos
    python scripts/benchmark_diloco_chaos.py --kills 0 --cases second_process   # one case alone

The tiny test model (2 layers, d_model 32) trains M = 3 groups of 2 sequences x 32 tokens per
global step, H = 4, for ``--steps`` global steps. A driver (``benchmarks/torchft_groups.py``)
kills a random group whenever every group is training and starts it again at once, alternately
from its last checkpoint and without one, ``--kills`` times; the groups are paced while the kills
go on. First an uninterrupted one-job run of the same data records the rows each step reads.

The table gives the kills survived, the rounds discarded (summed over every run of every
group), the global steps each group never trained (down, or skipped when healed) and the
tokens they held, the steps whose rows broke the slice check (must be 0), and the largest
difference between the groups' final weights (must be 0: the final sync makes them one model).

Then each combined failure (``benchmarks/torchft_scenarios.py``: two groups down with one fresh
restart, a kill in a sync, a second process of a live group, a lighthouse restart, a straggler
through the last rounds), on ``--case-steps`` global steps: every process's exit code, what
breaks the ending invariant (a group that exits 0 off the others' weights, or one that ends
otherwise without a last line saying why), the steps with wrong rows, and the largest weight
difference between the groups that exited 0 (goal: 0.0).
"""

import argparse
import subprocess
import sys
from pathlib import Path

from benchmarks.torchft_groups import ENV, FAULT_SYNC_EVERY, REPO, fault_run, row_log, rows, run_chaos
from benchmarks.torchft_scenarios import SCENARIOS, straggler_at_the_end


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("outputs/benchmarks/diloco_chaos"), help="run folders go here")
    parser.add_argument("--steps", type=int, default=1600, help="global steps of the run")
    parser.add_argument("--kills", type=int, default=20, help="kills to survive")
    parser.add_argument("--pace", type=float, default=0.15, help="seconds per step while the kills go on")
    parser.add_argument("--seed", type=int, default=0, help="which group is killed when")
    parser.add_argument("--cases", default=",".join(SCENARIOS), help="combined failures to run, comma-separated")
    parser.add_argument("--case-steps", type=int, default=96, help="global steps of each combined failure's run")
    return parser.parse_args(argv)


#: Groups per combined failure (a second process and a lighthouse restart need only two).
CASE_GROUPS = {"second_process": 2, "lighthouse_restart": 2}


def reference_rows(folder: Path, cache: Path, run: list[str]) -> dict[int, list[str]]:
    """The rows each global step reads in one uninterrupted job of the same data (M = 1)."""
    command = [
        sys.executable,
        str(REPO / "train.py"),
        f"hydra.run.dir={folder}",
        f"paths.cache_dir={cache}",
        *run,
        "technique.diloco.replicas=1",
        *row_log(folder),
    ]
    if subprocess.run(command, cwd=REPO, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode:
        raise SystemExit(f"the reference run failed: python {' '.join(command[1:])}")
    return rows(folder)


def random_kills(args: argparse.Namespace, cache: Path) -> bool:
    """The chaos run: ``--kills`` kills of a random group; its table row; whether it ended right."""
    reference = reference_rows(args.out / "reference", cache, fault_run(3, args.steps))
    result = run_chaos(
        args.out / "chaos",
        cache,
        fault_run(3, args.steps),
        reference,
        groups=3,
        kills=args.kills,
        sync_every=FAULT_SYNC_EVERY,
        pace_s=args.pace,
        seed=args.seed,
        timeout_s=3600,
    )
    tokens = args.steps * 6 * 32
    untrained = ", ".join(f"{result.untrained_steps[g]}" for g in sorted(result.untrained_steps))
    print(
        "| groups | global steps | kills (from a checkpoint) | exit codes | rounds discarded | steps untrained per group"
        " | tokens lost | steps with wrong rows | final weights differ by | wall (s) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    print(
        f"| 3 | {result.steps} | {result.kills} ({result.restarts_from_checkpoint}) | {result.exit_codes} | {result.discarded_rounds}"
        f" | {untrained} | {result.tokens_lost:,} of {tokens:,} ({result.tokens_lost / tokens:.1%}) | {len(result.wrong_rows)}"
        f" | {result.weight_difference:.1e} | {result.seconds:.0f} |"
    )
    return result.exit_codes == [0, 0, 0] and not result.wrong_rows and result.weight_difference == 0


def combined_failures(args: argparse.Namespace, cache: Path) -> bool:
    """Each combined failure's table row; whether every one ended right."""
    print(
        "\n| case | groups | exit codes | ending invariant | steps with wrong rows | exit-0 weights differ by | wall (s) |"
    )
    print("|---|---|---|---|---|---|---|")
    right, references = True, {}
    for case in args.cases.split(","):
        replicas = CASE_GROUPS.get(case, 3)
        run = fault_run(replicas, args.case_steps)
        if replicas not in references:  # one uninterrupted run per M serves every case of that M
            references[replicas] = reference_rows(args.out / f"reference_{replicas}", cache, run)
        reference = references[replicas]
        scenario = SCENARIOS[case]
        extra = {"steps": args.case_steps} if scenario is straggler_at_the_end else {}
        ended = scenario(args.out / case, cache, run, replicas=replicas, **extra)
        wrong = ended.wrong_rows(reference)
        codes = ", ".join(f"{name}: {code}" for name, code in ended.codes.items())
        print(
            f"| {ended.case} | {replicas} | {codes} | {'; '.join(ended.problems) or 'holds'} | {len(wrong)}"
            f" | {ended.weight_difference:.1e} | {ended.seconds:.0f} |",
            flush=True,
        )
        right &= not ended.problems and not wrong and ended.weight_difference == 0
    return right


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cache = args.out / "cache"
    args.out.mkdir(parents=True, exist_ok=True)
    unknown = sorted(set(args.cases.split(",")) - set(SCENARIOS) - {""})
    if unknown:
        print(f"error: --cases {unknown} unknown; choose from {', '.join(SCENARIOS)}.", file=sys.stderr)
        return 2
    right = random_kills(args, cache) if args.kills else True
    if args.cases:
        right &= combined_failures(args, cache)
    return 0 if right else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""A soak of fault-tolerant DiLoCo: M replica groups on loopback, killed (SIGKILL) again and again.

    python scripts/benchmark_diloco_chaos.py --out outputs/benchmarks/diloco_chaos

The tiny test model (2 layers, d_model 32) trains M = 3 groups of 2 sequences x 32 tokens per
global step, H = 4, for ``--steps`` global steps. A driver (``benchmarks/torchft_groups.py``)
kills a random group whenever every group is training and starts it again at once, alternately
from its last checkpoint and without one, ``--kills`` times; the groups are paced while the kills
go on. First an uninterrupted one-job run of the same data records the rows each step reads.

The table gives the kills survived, the rounds discarded (summed over every run of every
group), the global steps each group never trained (down, or skipped when healed) and the
tokens they held, the steps whose rows broke the slice check (must be 0), and the largest
difference between the groups' final weights (must be 0: the final sync makes them one model).
"""

import argparse
import subprocess
import sys
from pathlib import Path

from benchmarks.torchft_groups import ENV, REPO, row_log, rows, run_chaos

SYNC_EVERY = 4
TINY = [
    "model.n_layers=2",
    "model.d_model=32",
    "model.n_heads=4",
    "model.n_kv_heads=2",
    "model.mlp_hidden=64",
    "data.seq_len=32",
    "data.source.max_documents=600",
    "data.val_max_rows=16",
    "optimizer=adamw",
    "optimizer.lr=4e-3",
    "lr_schedule.warmup_steps=2",
    "trainer.log_every_n_steps=1",
    "trainer.num_sanity_val_steps=0",
]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("outputs/benchmarks/diloco_chaos"), help="run folders go here")
    parser.add_argument("--steps", type=int, default=1600, help="global steps of the run")
    parser.add_argument("--kills", type=int, default=20, help="kills to survive")
    parser.add_argument("--pace", type=float, default=0.15, help="seconds per step while the kills go on")
    parser.add_argument("--seed", type=int, default=0, help="which group is killed when")
    return parser.parse_args(argv)


def overrides(steps: int) -> list[str]:
    return [
        *TINY,
        "+technique=diloco",
        "technique.diloco.replicas=3",
        "batch.micro_batch_size=2",
        "batch.global_batch_size=6",
        f"technique.diloco.sync_every={SYNC_EVERY}",
        "logger=csv",
        "callbacks.validation_schedule.every_n_steps=100000",
        f"callbacks.model_checkpoint.every_n_train_steps={SYNC_EVERY}",
        "technique.diloco.torchft.timeout_s=10",
        "technique.diloco.torchft.quorum_timeout_s=120",
        f"token_budget={steps * 6 * 32}",
    ]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cache, reference = args.out / "cache", args.out / "reference"
    args.out.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable,
        str(REPO / "train.py"),
        f"hydra.run.dir={reference}",
        f"paths.cache_dir={cache}",
        *overrides(args.steps),
        "technique.diloco.replicas=1",
        *row_log(reference),
    ]
    if subprocess.run(command, cwd=REPO, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode:
        raise SystemExit(f"the reference run failed: python {' '.join(command[1:])}")
    result = run_chaos(
        args.out / "chaos",
        cache,
        overrides(args.steps),
        rows(reference),
        groups=3,
        kills=args.kills,
        sync_every=SYNC_EVERY,
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
    return 0 if result.exit_codes == [0, 0, 0] and not result.wrong_rows and result.weight_difference == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())

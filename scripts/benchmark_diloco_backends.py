"""What fault tolerance costs: DiLoCo's sync on torchft against today's backend, and a rejoin.

    python scripts/benchmark_diloco_backends.py --out outputs/benchmarks/diloco_backends

Three runs of M = 2 replicas on this machine (loopback, gloo), the same model, batch and H:

1. ``torch``: one job of 2 processes (``strategy=fsdp2``), replicas on a (replica, shard) mesh;
2. ``torchft``: 2 jobs of one process each, joined by a lighthouse started here;
3. ``torchft`` again, with group 1 killed (SIGKILL) mid-run and started again: it rejoins
   from the live group.

The table gives, per run, the median ``diloco/sync_seconds`` (the exchange and the outer
step, as group 0 / rank 0 measured it), ``diloco/bytes_per_sync`` and, for the rejoin,
``diloco/rejoin_seconds`` (the quorum that healed the restarted group: waiting for the live
group to finish its round, then the state transfer) and the wall time from the restart to
that moment, and each run's final ``val/loss`` (after the final sync every group holds the same
weights). Timings on a shared CPU machine are noisy: compare the ratio to the ``torch`` row
measured in the same call.
"""

import argparse
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.torchft_groups import ENV, REPO, Lighthouse
from benchmarks.torchft_groups import metric as column


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--out", type=Path, default=Path("outputs/benchmarks/diloco_backends"), help="run folders go here"
    )
    parser.add_argument("--steps", type=int, default=120, help="global steps per run")
    parser.add_argument("--sync-every", type=int, default=10, help="H")
    parser.add_argument("--model", default="nano", help="a conf/model/ name")
    return parser.parse_args(argv)


def common(args: argparse.Namespace, folder: Path) -> list[str]:
    return [
        sys.executable,
        str(REPO / "train.py"),
        f"hydra.run.dir={folder}",
        f"model={args.model}",
        "+technique=diloco",
        "technique.diloco.replicas=2",
        f"technique.diloco.sync_every={args.sync_every}",
        "batch.global_batch_size=16",
        f"trainer.max_steps={args.steps}",
        "logger=csv",
        "callbacks.validation_schedule.every_n_steps=100000",
        f"callbacks.model_checkpoint.every_n_train_steps={args.sync_every * 2}",
    ]


def torchft_group(args: argparse.Namespace, folder: Path, lighthouse: str, group: int) -> subprocess.Popen:
    command = [
        *common(args, folder),
        "technique.diloco.backend=torchft",
        f"technique.diloco.torchft.lighthouse={lighthouse}",
        f"technique.diloco.torchft.group={group}",
    ]
    folder.parent.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(command, cwd=REPO, env=ENV, stdout=open(f"{folder}.log", "w"), stderr=subprocess.STDOUT)


def wait(processes: list[subprocess.Popen]) -> None:
    for process in processes:
        if process.wait() != 0:
            raise SystemExit(f"a run failed: see {process.args[2].split('=', 1)[1]}.log")


def run_torch(args: argparse.Namespace) -> Path:
    folder = args.out / "torch"
    command = [
        *common(args, folder),
        "strategy=fsdp2",
        "strategy.save_distributed_checkpoint=false",
        "trainer.accelerator=cpu",
        "trainer.devices=2",
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    wait([subprocess.Popen(command, cwd=REPO, env=ENV, stdout=open(f"{folder}.log", "w"), stderr=subprocess.STDOUT)])
    return folder


def run_torchft(args: argparse.Namespace, lighthouse: str, name: str, kill_at: int | None) -> tuple[Path, float | None]:
    """Two groups; with ``kill_at``, group 1 is killed once it checkpointed that step and started again."""
    folders = [args.out / name / f"group{g}" for g in (0, 1)]
    groups = [torchft_group(args, folder, lighthouse, g) for g, folder in enumerate(folders)]
    restart_wall = None
    if kill_at is not None:
        checkpoint = folders[1] / "checkpoints" / f"step{kill_at:06d}.ckpt"
        while not checkpoint.exists():
            if groups[1].poll() is not None:
                raise SystemExit(f"group 1 ended before step {kill_at}: see {folders[1]}.log")
            time.sleep(0.1)
        groups[1].send_signal(signal.SIGKILL)
        groups[1].wait()
        restarted = args.out / name / "group1_restarted"
        started = time.monotonic()
        groups[1] = torchft_group(args, restarted, lighthouse, 1)
        log = Path(f"{restarted}.log")
        while "rejoined the DiLoCo replica groups" not in (log.read_text() if log.exists() else ""):
            if groups[1].poll() is not None:
                raise SystemExit(f"the restarted group ended without rejoining: see {log}")
            time.sleep(0.1)
        restart_wall = time.monotonic() - started
        folders[1] = restarted
    wait(groups)
    return folders[1] if kill_at is not None else folders[0], restart_wall


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with Lighthouse(min_replicas=2, join_timeout_ms=2000, heartbeat_timeout_ms=2000) as lighthouse:
        torch_run = run_torch(args)
        ft_run, _ = run_torchft(args, lighthouse.address, "torchft", None)
        rejoined, restart_wall = run_torchft(args, lighthouse.address, "torchft_rejoin", kill_at=args.steps // 3)
    base = statistics.median(column(torch_run, "diloco/sync_seconds"))
    print(
        "| run | median sync (s) | vs torch | bytes per sync | rejoin quorum (s) | restart to rejoined (s) | final val/loss |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, folder in (("torch (1 job, 2 processes)", torch_run), ("torchft (2 jobs)", ft_run)):
        sync = statistics.median(column(folder, "diloco/sync_seconds"))
        print(
            f"| {name} | {sync:.4f} | {sync / base:.2f}x | {column(folder, 'diloco/bytes_per_sync')[0]:,.0f} | - | -"
            f" | {column(folder, 'val/loss')[-1]:.4f} |"
        )
    rejoin = column(rejoined, "diloco/rejoin_seconds")
    sync = statistics.median(column(rejoined, "diloco/sync_seconds"))
    print(
        f"| torchft, group 1 killed at step {args.steps // 3} and restarted | {sync:.4f} | {sync / base:.2f}x"
        f" | {column(rejoined, 'diloco/bytes_per_sync')[-1]:,.0f} | {rejoin[0]:.2f} | {restart_wall:.1f}"
        f" | {column(rejoined, 'val/loss')[-1]:.4f} |"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

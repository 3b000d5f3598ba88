"""Fault-tolerant DiLoCo replica groups on loopback, for tests and benchmarks: a torchft
lighthouse, one ``train.py`` process per group, and a chaos driver that kills and restarts them.

The chaos driver (``run_chaos``) starts M groups, then kills (SIGKILL) a random one whenever
every group is training, and starts it again at once, alternately from its own last
checkpoint and without one. The groups are paced (``benchmarks/pace.py``) while the kills go on,
then run free to the end. It reports what the faults cost and checks what must hold:

- every group ends (exit 0) on the same weights;
- every step a group trained read that group's slice of the step, by content hash
  (``benchmarks/row_log.py``): a subset of the rows an uninterrupted one-job run reads at that
  step, the same rows each time the group trained it, disjoint from the other groups';
- the steps no run of a group trained (it was down, or its clock jumped when healed),
  counted as tokens lost.
"""

import csv
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import torch

from benchmarks.tiny_run import TINY_RUN

REPO = Path(__file__).resolve().parents[1]
#: torchft's lighthouse binary, installed beside this Python (a venv's bin/ need not be on PATH).
LIGHTHOUSE = shutil.which("torchft_lighthouse", path=str(Path(sys.executable).parent)) or "torchft_lighthouse"
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline", "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
REJOINED = "rejoined the DiLoCo replica groups"
DISCARDED = "round discarded at global step"


#: Global steps between the fault runs' DiLoCo rounds, each round's end a checkpoint.
FAULT_SYNC_EVERY = 4


def fault_run(replicas: int, steps: int) -> list[str]:
    """The run the fault tests and the chaos benchmark give their groups: the tiny run, DiLoCo
    over ``replicas`` groups of 2 sequences per global step, a checkpoint every round, CSV logs,
    torchft timeouts short enough that a killed peer is noticed, ``steps`` global steps of tokens."""
    return [
        *TINY_RUN,
        "+technique=diloco",
        f"technique.diloco.replicas={replicas}",
        "batch.micro_batch_size=2",
        f"batch.global_batch_size={2 * replicas}",
        f"technique.diloco.sync_every={FAULT_SYNC_EVERY}",
        "logger=csv",
        "callbacks.validation_schedule.every_n_steps=100000",
        f"callbacks.model_checkpoint.every_n_train_steps={FAULT_SYNC_EVERY}",
        "technique.diloco.torchft.timeout_s=10",
        "technique.diloco.torchft.quorum_timeout_s=120",
        f"token_budget={steps * 2 * replicas * 32}",  # global steps x sequences x tokens
    ]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Lighthouse:
    """``torchft_lighthouse`` on a loopback port, stopped on exit. ``join_timeout_ms`` is the
    deadline past which a quorum forms without a group that has not asked yet."""

    def __init__(self, min_replicas: int, join_timeout_ms: int = 1000, heartbeat_timeout_ms: int = 1000) -> None:
        self.address = f"http://127.0.0.1:{free_port()}"
        self.command = [
            LIGHTHOUSE,
            "--min_replicas",
            str(min_replicas),
            "--bind",
            self.address.removeprefix("http://"),
            "--join_timeout_ms",
            str(join_timeout_ms),
            "--heartbeat_timeout_ms",
            str(heartbeat_timeout_ms),
        ]
        self.start()

    def start(self) -> None:
        """Start it on its address (again, after ``stop``) and wait until it accepts connections."""
        self.process = subprocess.Popen(self.command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", int(self.address.rsplit(":", 1)[1])), timeout=1).close()
                return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("the lighthouse did not start")

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()

    def __enter__(self) -> "Lighthouse":
        return self

    def __exit__(self, *_) -> None:
        self.stop()


def start_group(
    lighthouse: Lighthouse, index: int, folder: Path, cache: Path, overrides: list[str]
) -> subprocess.Popen:
    """One replica group: its own train.py process and run folder, its output in ``FOLDER.log``."""
    command = [
        sys.executable,
        str(REPO / "train.py"),
        f"hydra.run.dir={folder}",
        f"paths.cache_dir={cache}",
        *overrides,
        "technique.diloco.backend=torchft",
        f"technique.diloco.torchft.lighthouse={lighthouse.address}",
        f"technique.diloco.torchft.group={index}",
    ]
    folder.parent.mkdir(parents=True, exist_ok=True)
    log = open(folder.parent / f"{folder.name}.log", "w")
    return subprocess.Popen(command, cwd=REPO, env=ENV, stdout=log, stderr=subprocess.STDOUT, text=True)


def log_of(folder: Path) -> str:
    path = folder.parent / f"{folder.name}.log"
    return path.read_text() if path.exists() else ""


def last_own_line(log: str) -> str:
    """A group log's last line written by the framework: torchft's Rust client logs from its own
    thread (``... [INFO] [torchft::manager] ...``) and may land after the framework's last line."""
    return [line for line in log.strip().splitlines() if "[torchft::" not in line][-1]


def metric(folder: Path, key: str) -> list[float]:
    """A metric's values from a run's CSV log (``logger=csv``)."""
    with open(folder / "csv" / "metrics.csv") as file:
        return [float(row[key]) for row in csv.DictReader(file) if row.get(key)]


def rows(folder: Path) -> dict[int, list[str]]:
    """The rows one run of a group trained, by step (``benchmarks/row_log.py``, one process)."""
    steps: dict[int, list[str]] = {}
    path = folder / "rows" / "rank0.txt"
    for line in path.read_text().splitlines() if path.exists() else []:
        step, *hashes = line.split()
        steps.setdefault(int(step), []).extend(hashes)
    return steps


#: The test callbacks' settings differ between groups (each logs rows to its own folder, one may be paced).
PER_GROUP_CALLBACKS = "technique.diloco.torchft.per_group_keys=[callbacks.row_log,callbacks.pace]"


def row_log(folder: Path) -> list[str]:
    return [
        "+callbacks.row_log._target_=benchmarks.row_log.RowLog",
        f"+callbacks.row_log.path={folder / 'rows'}",
        PER_GROUP_CALLBACKS,
    ]


def ending_problems(codes: dict[str, int], folders: dict[str, Path]) -> list[str]:
    """What breaks the invariant of how groups end: every group that exits 0 holds the run's final
    weights, equal (atol 0) to every other's that exits 0; every other group ends with one
    ``error: `` line, its last. Empty where it holds."""
    problems, finished = [], {name: folders[name] for name, code in codes.items() if code == 0}
    weights = {name: final_weights(folder / "checkpoints" / "last.ckpt") for name, folder in finished.items()}
    first = next(iter(weights), None)
    for name, found in weights.items():
        difference = max((found[key] - weights[first][key]).abs().max().item() for key in found)
        if difference != 0.0:
            problems.append(f"{name} exited 0 with weights {difference:.2e} from {first}'s")
    for name, code in codes.items():
        if code != 0 and not last_own_line(log_of(folders[name])).startswith("error: "):
            problems.append(f"{name} exited {code} without a last line that says why")
    return problems


def valid_checkpoint(folder: Path) -> Path | None:
    """The run's last checkpoint, unless it was killed while writing it."""
    path = folder / "checkpoints" / "last.ckpt"
    return path if path.exists() and zipfile.is_zipfile(path) else None


@dataclass
class Group:
    """A replica group's runs: each start (the first, then each restart) has its own folder."""

    index: int
    folders: list[Path] = field(default_factory=list)
    process: subprocess.Popen | None = None

    @property
    def folder(self) -> Path:
        return self.folders[-1]

    def training(self, sync_every: int) -> bool:
        """Running and past its first round (a restarted group: rejoined its peers)."""
        if self.process.poll() is not None:
            return False
        return REJOINED in log_of(self.folder) if len(self.folders) > 1 else len(rows(self.folder)) > sync_every


def latest_checkpoint(group: Group) -> Path | None:
    """The newest complete checkpoint of any run of the group (a run killed soon after its
    start may not have written one yet)."""
    return next((path for path in map(valid_checkpoint, reversed(group.folders)) if path), None)


@dataclass
class ChaosResult:
    kills: int
    restarts_from_checkpoint: int
    exit_codes: list[int]
    discarded_rounds: int  # summed over every run of every group
    untrained_steps: dict[int, int]  # per group: global steps no run of it trained
    tokens_lost: int
    wrong_rows: list[str]  # (group, step) whose rows break the slice checks
    weight_difference: float  # largest, between any group's final weights and group 0's
    steps: int
    seconds: float


def run_chaos(
    folder: Path,
    cache: Path,
    overrides: list[str],
    reference: dict[int, list[str]],
    groups: int = 3,
    kills: int = 6,
    sync_every: int = 4,
    pace_s: float = 0.15,
    seed: int = 0,
    timeout_s: float = 600,
) -> ChaosResult:
    """Run M groups under kills (see the module's docstring). ``overrides``: the run's settings,
    the same for every group (a DiLoCo experiment with ``replicas`` = M); ``reference``: the
    rows an uninterrupted one-job run of the same data reads, by step."""
    rng, started = random.Random(seed), time.monotonic()
    marker = folder / "pace"
    folder.mkdir(parents=True, exist_ok=True)
    marker.touch()
    pace = [
        "+callbacks.pace._target_=benchmarks.pace.Pace",
        f"+callbacks.pace.seconds={pace_s}",
        f"+callbacks.pace.while_exists={marker}",
    ]
    members = [Group(g) for g in range(groups)]
    done_kills = from_checkpoint = 0
    with Lighthouse(min_replicas=groups // 2 + 1) as lighthouse:

        def start(group: Group, extra: list[str]) -> None:
            group.folders.append(folder / f"group{group.index}_run{len(group.folders)}")
            group.process = start_group(
                lighthouse, group.index, group.folder, cache, [*overrides, *pace, *row_log(group.folder), *extra]
            )

        for group in members:
            start(group, [])
        while done_kills < kills and time.monotonic() - started < timeout_s:
            time.sleep(0.5)
            if any(group.process.poll() is not None for group in members):
                break  # a group ended (or failed): no more kills
            if not all(group.training(sync_every) for group in members):
                continue
            victim = rng.choice(members)
            victim.process.send_signal(signal.SIGKILL)
            victim.process.wait()
            done_kills += 1
            checkpoint = latest_checkpoint(victim) if done_kills % 2 == 0 else None
            from_checkpoint += checkpoint is not None
            start(victim, [f"ckpt_path={checkpoint}"] if checkpoint else [])
        while not all(group.training(sync_every) or group.process.poll() is not None for group in members):
            time.sleep(0.5)  # the last restarted group rejoins before the pace ends
        marker.unlink()
        exit_codes = []
        for group in members:
            try:
                exit_codes.append(group.process.wait(timeout=max(timeout_s - (time.monotonic() - started), 1)))
            except subprocess.TimeoutExpired:
                group.process.kill()
                exit_codes.append(group.process.wait())
    return _result(members, reference, done_kills, from_checkpoint, exit_codes, time.monotonic() - started)


def _result(
    members: list[Group],
    reference: dict[int, list[str]],
    kills: int,
    from_checkpoint: int,
    exit_codes: list[int],
    seconds: float,
) -> ChaosResult:
    steps = max(reference)
    per_step = len(reference[1]) // len(members)
    trained, wrong = trained_rows({group.index: group.folders for group in members}, reference)
    untrained = {g: sum(step not in trained[g] for step in range(1, steps + 1)) for g in trained}
    tokens_per_row = _tokens_per_row(members[0].folder)
    finals = [valid_checkpoint(group.folder) for group in members]
    difference = float("inf")
    if all(finals):
        weights = [final_weights(path) for path in finals]
        difference = max((w[k] - weights[0][k]).abs().max().item() for w in weights[1:] for k in weights[0])
    discarded = sum(log_of(run).count(DISCARDED) for group in members for run in group.folders)
    return ChaosResult(
        kills,
        from_checkpoint,
        exit_codes,
        discarded,
        untrained,
        sum(untrained.values()) * per_step * tokens_per_row,
        wrong,
        difference,
        steps,
        seconds,
    )


def trained_rows(
    runs: dict[int, list[Path]], reference: dict[int, list[str]]
) -> tuple[dict[int, dict[int, set[str]]], list[str]]:
    """The rows each group index trained at each step over its runs (``runs``: its run folders),
    and what breaks the slice checks: a step whose rows are not a group's share of that step's
    reference rows, a group that read other rows at a step on another run, two groups that read
    the same rows."""
    per_step = len(reference[1]) // len(runs)
    trained: dict[int, dict[int, set[str]]] = {group: {} for group in runs}
    wrong: list[str] = []
    for group, folders in runs.items():
        for run in folders:
            for step, hashes in rows(run).items():
                if len(hashes) != per_step or not set(hashes) <= set(reference.get(step, [])):
                    wrong.append(f"group {group} step {step} in {run.name}")
                trained[group].setdefault(step, set()).update(hashes)
    for step in range(1, max(reference) + 1):
        seen = [trained[g].get(step, set()) for g in trained]
        if any(len(hashes) > per_step for hashes in seen) or len(set().union(*seen)) != sum(map(len, seen)):
            wrong.append(f"step {step}: a group read other rows on another run, or two groups read the same rows")
    return trained, wrong


def _tokens_per_row(folder: Path) -> int:
    """Tokens per sequence, from the run's resolved config."""
    from launch.from_config import config_file

    return int(config_file(folder / ".hydra" / "config.yaml")["data"]["seq_len"])


def final_weights(path: Path) -> dict[str, torch.Tensor]:
    state = torch.load(path, map_location="cpu", weights_only=False)["state_dict"]
    return {key: value for key, value in state.items() if key.startswith("model.")}

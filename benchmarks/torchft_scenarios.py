"""Combined failures of fault-tolerant DiLoCo replica groups on loopback, each a scenario that
runs to its end and is judged one way (``Ended``): every group that exits 0 must hold the
weights of every other that exits 0 (atol 0), every other must end with one ``error:`` line,
and every step a group trained must have read its own slice of that step.

- ``two_down_one_fresh``: M = 3, two groups killed at once, one back from its checkpoint and
  one with none (which must recognise the run in progress from its first quorum);
- ``kill_at_sync``: a group killed as it asks for a sync's quorum, then restarted from its checkpoint;
- ``second_process``: a second process of a live group index (a requeued job whose first copy
  still runs), which must be refused alone;
- ``lighthouse_restart``: the lighthouse killed mid-run and back on its port 5 s later;
- ``straggler_at_the_end``: one group ten times slower through the run's last rounds.

The groups train the run a caller gives (``run``: M groups' overrides less the pace and the
row log, which the scenarios add); ``tests/test_diloco_torchft_combined.py`` asserts three of
them, ``scripts/benchmark_diloco_chaos.py`` prints them all.
"""

import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.torchft_groups import (
    Lighthouse,
    ending_problems,
    final_weights,
    row_log,
    start_group,
    trained_rows,
    valid_checkpoint,
)

#: Seconds to wait for a group's checkpoint (the sign that it is mid-run).
CHECKPOINT_WAIT_S = 200
#: What torchft's manager logs as a group asks for a quorum.
QUORUM_ASKED = "Start quorum for group_rank"
#: Seconds every group may take to end once the scenario has done its part.
END_S = 400


@dataclass
class Ended:
    """How a scenario's processes ended: each one's exit code and run folder (by name: the group
    index, with a suffix for a restart or a second process), and its group index."""

    case: str
    codes: dict[str, int]
    folders: dict[str, Path]  # of the processes judged (a process killed on purpose is judged by its restart)
    groups: dict[str, int]  # every process's group index, a killed one's too
    runs: dict[str, Path]  # every process's run folder, a killed one's too
    seconds: float
    problems: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.problems = ending_problems(self.codes, self.folders)

    @property
    def weight_difference(self) -> float:
        """The largest difference between the final weights of two groups that exited 0."""
        finished = [self.folders[name] for name, code in self.codes.items() if code == 0]
        weights = [final_weights(folder / "checkpoints" / "last.ckpt") for folder in finished]
        return max(((w[key] - weights[0][key]).abs().max().item() for w in weights[1:] for key in w), default=0.0)

    def wrong_rows(self, reference: dict[int, list[str]]) -> list[str]:
        """Steps whose rows break the slice checks; a second process of a group index reads that
        group's slice, so its rows count as that group's."""
        runs: dict[int, list[Path]] = {}
        for name, folder in self.runs.items():
            runs.setdefault(self.groups[name], []).append(folder)
        return trained_rows(runs, reference)[1]


class Groups:
    """A scenario's lighthouse and processes: start, kill, wait, judge."""

    def __init__(self, folder: Path, cache: Path, run: list[str], pace_s: float, lighthouse: Lighthouse) -> None:
        self.folder, self.cache, self.run, self.lighthouse = folder, cache, run, lighthouse
        self.pace = ["+callbacks.pace._target_=benchmarks.pace.Pace", f"+callbacks.pace.seconds={pace_s}"]
        self.processes: dict[str, subprocess.Popen] = {}
        self.folders: dict[str, Path] = {}
        self.groups: dict[str, int] = {}
        self.killed: set[str] = set()
        self.started = time.monotonic()

    def start(self, name: str, group: int, *extra: str) -> None:
        folder = self.folder / f"group{name}"
        self.folders[name], self.groups[name] = folder, group
        overrides = [*self.run, *self.pace, *row_log(folder), *extra]
        self.processes[name] = start_group(self.lighthouse, group, folder, self.cache, overrides)

    def kill(self, name: str) -> None:
        self.processes[name].send_signal(signal.SIGKILL)
        self.processes[name].wait()
        self.killed.add(name)

    def end(self, case: str) -> Ended:
        codes = {name: process.wait(timeout=END_S) for name, process in self.processes.items()}
        judged = {name: code for name, code in codes.items() if name not in self.killed}
        folders = {name: self.folders[name] for name in judged}
        return Ended(case, judged, folders, self.groups, self.folders, time.monotonic() - self.started)


def wait_for(path: Path, timeout: float = CHECKPOINT_WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    if not path.exists():
        raise RuntimeError(f"{path} was not written within {timeout} s")


@contextmanager
def started(
    folder: Path,
    cache: Path,
    run: list[str],
    replicas: int,
    pace_s: float,
    mid_run: tuple[str, int] | None = None,
    first: int | None = None,
    join_timeout_ms: int = 3000,
) -> Iterator[Groups]:
    """A lighthouse that forms quorums of a majority of ``replicas``, with the ``first`` groups
    (all by default) started on it; with ``mid_run`` (a group's name, a step), once that group's
    checkpoint of that step is written, the sign that the run is under way.

    The join timeout is longer than a round (H = 4 steps at the scenarios' pace: 1-1.2 s), so a
    group late by less than a round is waited for. At 1 s, two groups restarted together leapfrog
    each other: the one waiting at the lighthouse forms its quorum with the on-time group once
    its timeout has passed, the other arrives just after, is healed at the next sync while
    waiting out its own timeout, and so on; whichever is behind at the last round ends alone
    (seen in a CI run of 2026-12-06)."""
    with Lighthouse(min_replicas=replicas // 2 + 1, join_timeout_ms=join_timeout_ms) as lighthouse:
        groups = Groups(folder, cache, run, pace_s, lighthouse)
        for g in range(replicas if first is None else first):
            groups.start(str(g), g)
        if mid_run is not None:
            name, step = mid_run
            wait_for(groups.folders[name] / "checkpoints" / f"step{step:06d}.ckpt")
        yield groups


def two_down_one_fresh(folder: Path, cache: Path, run: list[str], replicas: int, at_step: int = 16) -> Ended:
    """Groups 1 and 2 killed at once after ``at_step``, started 3 s later: 1 from its checkpoint, 2 with none."""
    with started(folder, cache, run, replicas, 0.25, ("1", at_step)) as groups:
        groups.kill("1")
        groups.kill("2")
        time.sleep(3)
        groups.start("1_back", 1, f"ckpt_path={valid_checkpoint(groups.folders['1'])}")
        groups.start("2_fresh", 2)
        return groups.end("two groups down, one back from its checkpoint and one fresh")


def kill_at_sync(folder: Path, cache: Path, run: list[str], replicas: int, at_step: int = 16) -> Ended:
    """Group 1 killed as soon as its log shows it asking for a sync's quorum after ``at_step``
    (torchft's ``Start quorum``: the others are then gathering for the same round), then
    started again from its checkpoint."""
    with started(folder, cache, run, replicas, 0.25, ("1", at_step)) as groups:
        log = groups.folders["1"].parent / "group1.log"
        asked, deadline = log.read_text().count(QUORUM_ASKED), time.monotonic() + CHECKPOINT_WAIT_S
        while log.read_text().count(QUORUM_ASKED) == asked and time.monotonic() < deadline:
            time.sleep(0.01)
        groups.kill("1")
        groups.start("1_back", 1, f"ckpt_path={valid_checkpoint(groups.folders['1'])}")
        return groups.end("a group killed as it asks for a sync's quorum, back from its checkpoint")


def second_process(folder: Path, cache: Path, run: list[str], replicas: int, at_step: int = 16) -> Ended:
    """A second process as group 1 started after ``at_step``."""
    with started(folder, cache, run, replicas, 0.3, ("1", at_step)) as groups:
        groups.start("1_again", 1)
        return groups.end("a second process of a live group index")


def lighthouse_restart(folder: Path, cache: Path, run: list[str], replicas: int, at_step: int = 8) -> Ended:
    """The lighthouse killed after ``at_step`` and started on its port 5 s later."""
    with started(folder, cache, run, replicas, 0.3, ("0", at_step)) as groups:
        groups.lighthouse.stop()
        time.sleep(5)
        groups.lighthouse.start()
        return groups.end("the lighthouse killed and back on its port")


def lighthouse_lost(folder: Path, cache: Path, run: list[str], replicas: int, at_step: int = 8) -> Ended:
    """The lighthouse killed after ``at_step`` for good."""
    with started(folder, cache, run, replicas, 0.3, ("0", at_step)) as groups:
        groups.lighthouse.stop()
        return groups.end("the lighthouse lost")


def straggler_at_the_end(folder: Path, cache: Path, run: list[str], replicas: int, steps: int) -> Ended:
    """The last group ten times slower (1 s a step) from four rounds (H = 4) before the end; the
    lighthouse waits 1 s for a late group, so the fast groups' rounds go on without it."""
    with started(folder, cache, run, replicas, 0.1, first=replicas - 1, join_timeout_ms=1000) as groups:
        slow = ["+callbacks.pace.seconds=1.0", f"+callbacks.pace.from_step={max(steps - 16, 0)}"]
        groups.pace = ["+callbacks.pace._target_=benchmarks.pace.Pace"]
        groups.start(str(replicas - 1), replicas - 1, *slow)
        return groups.end("a straggler through the last rounds")


SCENARIOS: dict[str, Callable[..., Ended]] = {
    "two_down_one_fresh": two_down_one_fresh,
    "kill_at_sync": kill_at_sync,
    "second_process": second_process,
    "lighthouse_restart": lighthouse_restart,
    "straggler_at_the_end": straggler_at_the_end,
}

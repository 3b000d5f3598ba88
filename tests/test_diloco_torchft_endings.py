"""How fault-tolerant DiLoCo groups end: a mistaken restart stops only itself, a group left
behind by its peers never exits 0 off the run's weights, and the scripts that read
checkpoints refuse such a group's checkpoint."""

import re
import subprocess
import time
from pathlib import Path

import pytest
import torch

from benchmarks.torchft_groups import Lighthouse, last_own_line, log_of, metric, start_group
from common.errors import STALE_WEIGHTS_EXIT
from lightning_modules.training_state import WEIGHTS_NOTE
from tests.run_helpers import REPO, TINY, checkpoint_weights, run_script, run_to_completion

GROUPS = [
    *TINY,
    "+technique=diloco",
    "batch.micro_batch_size=2",
    "logger=csv",
    "callbacks.validation_schedule.every_n_steps=100000",
    "technique.diloco.torchft.timeout_s=10",
    "technique.diloco.torchft.quorum_timeout_s=60",
    "technique.diloco.torchft.per_group_keys=[callbacks.pace]",
    "+callbacks.pace._target_=benchmarks.pace.Pace",
]


def paced(seconds: float) -> str:
    return f"+callbacks.pace.seconds={seconds}"


def wait(process: subprocess.Popen, folder: Path, timeout: float = 240) -> str:
    process.wait(timeout=timeout)
    return log_of(folder)


def test_a_mistaken_restart_is_refused_alone_and_the_run_goes_on(tmp_path, tmp_path_factory) -> None:
    """Group 0 trains alone (min_groups=1); a group 1 started mid-run with another seed is
    refused in one line, and group 0 ends exactly as a run in which it never appeared."""
    cache = tmp_path_factory.getbasetemp() / "cache"
    # A new run's first quorum waits quorum_timeout_s for every group: 5 s, then group 0 goes on alone.
    run = [
        *GROUPS,
        "technique.diloco.replicas=2",
        "technique.diloco.torchft.min_groups=1",
        "batch.global_batch_size=4",
        "technique.diloco.sync_every=2",
        "trainer.max_steps=100",
        "seed=1",
        paced(0.2),
        "technique.diloco.torchft.quorum_timeout_s=5",
        "callbacks.model_checkpoint.every_n_train_steps=10",
    ]
    with Lighthouse(min_replicas=1) as alone, Lighthouse(min_replicas=1) as lighthouse:
        reference = start_group(alone, 0, tmp_path / "reference", cache, run)
        healthy = start_group(lighthouse, 0, tmp_path / "group0", cache, run)
        checkpoint = tmp_path / "group0" / "checkpoints" / "step000010.ckpt"
        deadline = time.monotonic() + 120
        while not checkpoint.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert checkpoint.exists(), log_of(tmp_path / "group0")[-3000:]
        mistaken = start_group(lighthouse, 1, tmp_path / "group1", cache, [*run, "seed=2"])
        logs = {
            name: wait(process, tmp_path / name)
            for name, process in (("group1", mistaken), ("group0", healthy), ("reference", reference))
        }
    assert mistaken.returncode == 2, logs["group1"][-3000:]
    assert last_own_line(logs["group1"]) == (
        "error: the DiLoCo replica groups run with different settings: data.seed is 2 in group 1 and 1 in group 0;"
        " start every group with the same overrides but technique.diloco.torchft.group."
    )
    assert healthy.returncode == 0 and reference.returncode == 0, logs["group0"][-3000:]
    assert (
        "replica group 1 was refused, its settings not the run's: data.seed is 2 in group 1 and 1 in group 0"
        in logs["group0"]
    )
    assert "round discarded" not in logs["group0"]
    final, expected = (
        checkpoint_weights(tmp_path / name / "checkpoints" / "last.ckpt") for name in ("group0", "reference")
    )
    for name, value in expected.items():
        torch.testing.assert_close(final[name], value, rtol=0, atol=0, msg=name)


@pytest.mark.parametrize("slowdown", [10, 20])
def test_a_straggler_ends_behind_in_one_line_or_on_the_final_weights(tmp_path, tmp_path_factory, slowdown: int) -> None:
    """Three groups, the lighthouse's --min_replicas (1) below min_groups (2), group 2 at
    10x or 20x the others' step time: the fast groups commit their rounds; the straggler
    never ends with exit 0 unless it holds their final weights. It counts only the tokens
    its model trained on."""
    cache = tmp_path_factory.getbasetemp() / "cache"
    steps = 24
    run = [
        *GROUPS,
        "technique.diloco.replicas=3",
        "batch.global_batch_size=6",
        "technique.diloco.sync_every=4",
        f"token_budget={steps * 6 * 32}",
        "technique.diloco.torchft.warn_after_rounds=1",
    ]
    folders = [tmp_path / f"group{g}" for g in range(3)]
    with Lighthouse(min_replicas=1) as lighthouse:
        processes = [
            start_group(lighthouse, g, folders[g], cache, [*run, paced(0.05 * (slowdown if g == 2 else 1))])
            for g in range(3)
        ]
        logs = [wait(process, folder) for process, folder in zip(processes, folders)]
    codes = [process.returncode for process in processes]
    assert codes[:2] == [0, 0], logs[:2]
    final = [checkpoint_weights(folder / "checkpoints" / "last.ckpt") for folder in folders]
    for name, value in final[0].items():
        torch.testing.assert_close(final[1][name], value, rtol=0, atol=1e-6, msg=name)
    print(f"{slowdown}x: exit codes {codes}; straggler's last line: {last_own_line(logs[2])}")
    if codes[2] == 0:  # healed into the final round
        for name, value in final[0].items():
            torch.testing.assert_close(final[2][name], value, rtol=0, atol=1e-6, msg=name)
    else:
        assert codes[2] == STALE_WEIGHTS_EXIT, logs[2][-3000:]
        assert last_own_line(logs[2]).startswith("error: replica group 2 ended ")
        assert "behind the run (its last rounds discarded: 1 group(s) joined it, fewer than min_groups=2)" in logs[2]
        # The stall warning quotes the peers' pace while they are alive; once both fast groups
        # have finished (no heartbeat at the lighthouse) it says no other group is alive.
        stalled = re.search(
            r"\[([\d :,-]+)\]\[callbacks.diloco.callback\]\[WARNING\] - replica group 2 has committed none of its"
            r" last 1 round\(s\) \(1 group\(s\) joined it, fewer than min_groups=2\): (it takes [\d.]+ s per global"
            r" step, its peers ([\d.]+ s|not known)|no other group is alive)",
            logs[2],
        )
        assert stalled, logs[2][-3000:]
        if stalled.group(2) == "no other group is alive":
            ends = [
                re.search(r"\[([\d :,-]+)\]\[launch.training\]\[INFO\] - finished at step", log) for log in logs[:2]
            ]
            assert all(end and end.group(1) < stalled.group(1) for end in ends), (stalled.group(0), ends)
        assert "ended behind the run at step" in logs[2] and "finished at step" not in logs[2]
        assert "a quorum formed with 1 replica group(s), fewer than min_groups=2" in logs[2]
        saved = torch.load(folders[2] / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
        assert saved[WEIGHTS_NOTE].startswith("replica group 2 ended ")
        assert metric(folders[2], "diloco/discarded_rounds")[-1] == logs[2].count("round discarded at global step")
    # Its own tokens: the steps it trained (its clock's steps less those it jumped over when healed) x 2 x 32.
    skipped = (metric(folders[2], "diloco/skipped_steps") or [0.0])[-1]
    assert metric(folders[2], "train/tokens_trained")[-1] == (metric(folders[2], "step")[-1] - skipped) * 2 * 32


def test_the_scripts_refuse_weights_that_are_not_the_run_s(tmp_path, tmp_path_factory) -> None:
    """A checkpoint whose weights_note is set: export and evaluation refuse it in one line
    (exit 2) unless told to use it anyway."""
    folder = tmp_path / "run"
    run_to_completion(
        [*TINY, "trainer.max_steps=2", "data.val_fraction=0.02"], folder, tmp_path_factory.getbasetemp() / "cache"
    )
    checkpoint = torch.load(folder / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    checkpoint[WEIGHTS_NOTE] = "replica group 2 ended 3 round(s) behind the run"
    stale = tmp_path / "stale.ckpt"
    torch.save(checkpoint, stale)
    commands = {
        "export_hf": [str(stale), str(tmp_path / "hf")],
        "evaluate": [str(stale), "--tasks", "corpus_cloze", "--limit", "2", "--out", str(tmp_path / "eval.json")],
    }
    for script, arguments in commands.items():
        refused = run_script(REPO / "scripts" / f"{script}.py", arguments)
        assert refused.returncode == 2, refused.stderr[-2000:]
        assert refused.stderr.strip().splitlines()[-1] == (
            f"error: {stale} holds weights that are not its run's: replica group 2 ended 3 round(s) behind the run;"
            " pass --allow-stale-weights to use them anyway"
        )
        allowed = run_script(REPO / "scripts" / f"{script}.py", [*arguments, "--allow-stale-weights"])
        assert allowed.returncode == 0, allowed.stderr[-2000:]

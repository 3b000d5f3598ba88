"""Fault-tolerant DiLoCo under combined failures, on loopback (``benchmarks/torchft_scenarios.py``):
each test asserts how the groups end: every group that exits 0 holds the weights of every other
that exits 0 (atol 0), a group that could finish does, and every other ends with one line."""

from benchmarks.torchft_groups import fault_run, last_own_line, log_of
from benchmarks.torchft_scenarios import (
    Ended,
    lighthouse_lost,
    lighthouse_restart,
    second_process,
    two_down_one_fresh,
)

# M groups of 2 sequences of 32 tokens a global step, H = 4, a checkpoint every round.
STEPS = 64


def assert_ended_right(ended: Ended, codes: dict[str, int]) -> None:
    lines = {name: last_own_line(log_of(folder)) for name, folder in ended.folders.items()}
    assert ended.problems == [] and ended.codes == codes, (ended.codes, ended.problems, lines)


def test_two_groups_down_one_back_from_its_checkpoint_and_one_fresh_end_on_the_run_s_weights(
    tmp_path, tmp_path_factory
) -> None:
    """M = 3, a majority lighthouse; groups 1 and 2 killed after step 16 and started 3 s later, 1
    from its checkpoint and 2 with none. The fresh group recognises the run from its first quorum's
    steps and is healed (before: it took itself for a new run, waited for all three groups and
    paired with one live group after the other, so that they never met). All end on one model."""
    cache = tmp_path_factory.getbasetemp() / "cache"
    ended = two_down_one_fresh(tmp_path, cache, fault_run(3, STEPS), replicas=3)
    assert_ended_right(ended, {"0": 0, "1_back": 0, "2_fresh": 0})
    assert "rejoined the DiLoCo replica groups" in log_of(ended.folders["2_fresh"])


def test_a_second_process_of_a_live_group_is_refused_alone_and_the_run_goes_on(tmp_path, tmp_path_factory) -> None:
    """A requeued job whose first copy still runs: a second group 1 started mid-run is refused in one
    line (exit 2); the live groups end on the same weights (before: every process died at the next
    sync decoding two groups' settings summed into one slot)."""
    cache = tmp_path_factory.getbasetemp() / "cache"
    ended = second_process(tmp_path, cache, fault_run(2, STEPS), replicas=2)
    assert_ended_right(ended, {"0": 0, "1": 0, "1_again": 2})
    assert last_own_line(log_of(ended.folders["1_again"])).startswith(
        "error: replica group 1 is already running in another process"
    )


def test_a_restarted_lighthouse_is_found_again(tmp_path, tmp_path_factory) -> None:
    """The lighthouse killed (SIGKILL) mid-run and started again on its port 5 s later: the groups,
    whose quorum requests it forgot, ask again and train on to the end (before: they never asked
    again and stopped blaming too few groups)."""
    cache = tmp_path_factory.getbasetemp() / "cache"
    ended = lighthouse_restart(tmp_path / "restart", cache, fault_run(2, STEPS), replicas=2)
    assert_ended_right(ended, {"0": 0, "1": 0})
    assert "asking the lighthouse again" in log_of(ended.folders["0"])


def test_a_lighthouse_lost_for_good_is_named(tmp_path, tmp_path_factory) -> None:
    """The lighthouse killed for good: the groups say it was lost (not that groups are missing)."""
    cache = tmp_path_factory.getbasetemp() / "cache"
    short = [*fault_run(2, STEPS), "technique.diloco.torchft.quorum_timeout_s=25"]
    lost = lighthouse_lost(tmp_path / "lost", cache, short, replicas=2)
    assert_ended_right(lost, {"0": 2, "1": 2})
    for folder in lost.folders.values():
        assert "was lost (nothing answers there)" in last_own_line(log_of(folder))

"""A clock moved mid-run (a DiLoCo replica group healed by a peer ahead of it) moves the data
stream with it: the steps after the move train the rows an uninterrupted run trains at those
steps (content hashes of the rows, not the sampler's own bookkeeping)."""

from benchmarks.row_log import rows_by_step
from tests.run_helpers import TINY, run_to_completion

STEPS = [*TINY, "token_budget=2048", "lr_schedule.warmup_steps=1"]  # 8 steps of 8 x 32 tokens


def test_the_rows_after_a_clock_move_are_those_of_the_steps_it_moved_to(tmp_path, tmp_path_factory) -> None:
    cache = tmp_path_factory.getbasetemp() / "cache"
    runs = {}
    for name, extra in (
        ("even", []),
        (
            "jumped",
            ["+callbacks.jump._target_=tests.jump_clock.JumpClock", "+callbacks.jump.at=3", "+callbacks.jump.to=5"],
        ),
    ):
        log = [
            "+callbacks.row_log._target_=benchmarks.row_log.RowLog",
            f"+callbacks.row_log.path={tmp_path / name / 'rows'}",
        ]
        run_to_completion([*STEPS, *log, *extra], tmp_path / name, cache)
        runs[name] = rows_by_step(tmp_path / name / "rows")
    even, jumped = runs["even"], runs["jumped"]
    assert sorted(even) == list(range(1, 9)) and sorted(jumped) == [1, 2, 3, 6, 7, 8]
    assert all(jumped[step] == even[step] for step in jumped)
    assert jumped[6] != even[4]  # without the move the stream would have gone on at step 4's rows

"""The layouts ablation: its space, its bubble arithmetic, its claims' verdicts from a table,
and its refusals (``benchmarks/layout_space.py``, ``benchmarks/layout_claims.py``,
``scripts/layouts_ablation.py``)."""

import subprocess

import pytest

from benchmarks.layout_claims import (
    larger_micro_batches_lengthen_the_bubble,
    larger_micro_batches_need_checkpointing_or_model_parallelism,
    micro_batch_one_is_most_efficient,
    sequence_parallelism_changes_what_fits,
)
from benchmarks.layout_space import Layout, Planned, enumerate_layouts, splits
from tests.run_helpers import REPO, run_script

TINY_CPU = ["model=tiny", "trainer.accelerator=cpu", "data.seq_len=64", "data.source.max_documents=200"]


def test_the_space_is_every_split_of_the_devices_with_its_options():
    assert sorted(splits(4)) == sorted([(4, 1, 1), (2, 2, 1), (2, 1, 2), (1, 4, 1), (1, 2, 2), (1, 1, 4)])
    layouts = enumerate_layouts(4, [1, 4], 16)
    # per split: 2 micro-batches x 2 checkpointing, x2 sequence parallelism where T > 1, x2 schedules where P > 1
    per_split = {(4, 1, 1): 4, (2, 2, 1): 8, (2, 1, 2): 8, (1, 4, 1): 8, (1, 2, 2): 16, (1, 1, 4): 8}
    assert len(layouts) == sum(per_split.values())


@pytest.mark.parametrize(
    ("pipeline", "schedule", "data", "micro", "expected"),
    [(1, "-", 4, 1, 0.0), (4, "1f1b", 1, 4, 3 / 7), (2, "1f1b", 2, 1, 1 / 9), (2, "interleaved_1f1b", 2, 4, 0.5 / 2.5)],
)
def test_the_bubble_is_p_minus_1_over_m_plus_p_minus_1_shorter_when_interleaved(
    pipeline, schedule, data, micro, expected
):
    # global batch 16: m = 16 / (data x micro) micro-batches per step on each pipeline
    layout = Layout(data, 1, pipeline, micro, "none", False, schedule)
    assert layout.bubble(16) == pytest.approx(expected)


def entry(micro=1, rates=(), refused=None, data=4, tensor=1, pipeline=1, checkpointing="none", sp=False, plan=1.0):
    """A layout; ``rates``: its rate in each interleaved repeat (each repeat one timed step here)."""
    schedule = "1f1b" if pipeline > 1 else "-"
    layout = Layout(data, tensor, pipeline, micro, checkpointing, sp, schedule)
    planned = Planned(layout, [], plan_gib=plan, refused=refused)
    if rates:
        planned.measured = {"rates": list(rates), "repeats": list(rates)}
    return planned


@pytest.mark.parametrize(
    ("one", "larger", "verdict"),
    [
        ((10, 11, 12), (7, 8, 9), "holds"),
        ((7, 8, 9), (10, 11, 12), "fails"),
        ((10, 8, 12), (9, 11, 10), "inconclusive"),
        # The machine's load tripled between repeats, on both layouts alike: the ranges overlap,
        # the paired ratios (1.11, 1.10, 1.12) do not move.
        ((10, 20, 30), (9, 18.2, 26.8), "holds"),
    ],
)
def test_micro_batch_one_is_faster_when_the_paired_ratio_s_one_sided_test_says_so(one, larger, verdict):
    from scipy import stats

    table = [entry(1, one), entry(4, larger), entry(4, (1, 2, 3))]
    ratios = [a / b for a, b in zip(one, larger)]
    greater = stats.ttest_1samp(ratios, 1.0, alternative="greater").pvalue
    less = stats.ttest_1samp(ratios, 1.0, alternative="less").pvalue
    expected = "holds" if greater < 0.025 else "fails" if less < 0.025 else "inconclusive"
    assert expected == verdict
    found = micro_batch_one_is_most_efficient(table)
    assert found.verdict == verdict and "one-sided t-test at 2.5%" in found.test, found


def test_a_speed_claim_on_one_repeat_or_noise_above_the_margin_says_so():
    one_repeat = micro_batch_one_is_most_efficient([entry(1, (10,)), entry(4, (9,))])
    assert one_repeat.verdict == "inconclusive" and "one repeat" in one_repeat.evidence
    noisy = micro_batch_one_is_most_efficient([entry(1, (10, 8, 12)), entry(4, (9, 11, 10))])
    assert noisy.verdict == "inconclusive" and "more than the 5% margin" in noisy.evidence, noisy.evidence


def test_larger_micro_batches_need_help_when_plain_data_parallelism_does_not_fit():
    plain = entry(4, refused="does not fit: plan 2 GiB > 1 GiB", plan=2.0)
    checkpointed = entry(4, checkpointing="full")
    assert (
        larger_micro_batches_need_checkpointing_or_model_parallelism([entry(1), plain, checkpointed]).verdict == "holds"
    )
    fits = entry(4)
    assert (
        larger_micro_batches_need_checkpointing_or_model_parallelism([entry(1), fits, checkpointed]).verdict == "fails"
    )


def test_sequence_parallelism_changes_what_fits_when_a_pair_fits_only_with_it():
    without = entry(4, data=2, tensor=2, refused="does not fit: plan 1.1 GiB > 1 GiB")
    with_sp = entry(4, data=2, tensor=2, sp=True)
    assert sequence_parallelism_changes_what_fits([without, with_sp]).verdict == "holds"
    assert sequence_parallelism_changes_what_fits([entry(4, data=2, tensor=2), with_sp]).verdict == "fails"


def test_the_bubble_claim_compares_a_pipeline_s_rate_with_data_parallelism_s_at_each_micro_batch():
    # P = 2 reaches 0.9 of data parallelism at micro-batch 1 and 0.5 at micro-batch 4
    table = [
        entry(1, (100, 100), data=4),
        entry(4, (200, 200), data=4),
        entry(1, (90, 90), data=2, pipeline=2),
        entry(4, (100, 100), data=2, pipeline=2),
    ]
    assert larger_micro_batches_lengthen_the_bubble(table).verdict == "holds"
    table[3] = entry(4, (196, 196), data=2, pipeline=2)  # 0.98 of data parallelism: no longer a bubble
    assert larger_micro_batches_lengthen_the_bubble(table).verdict == "fails"


def ablation(*args: str) -> subprocess.CompletedProcess:
    return run_script(REPO / "scripts" / "layouts_ablation.py", list(args))


def test_a_space_no_layout_of_fits_is_refused_in_one_line_with_the_smallest_need():
    result = ablation(
        "--devices", "2", "--device-memory-gib", "0.0001", "--micro-batches", "1", "--hardware", "CPU", "--", *TINY_CPU
    )
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and lines[-1].startswith(
        "error: no layout fits 0.0001 GiB per device; the smallest plan needs"
    )


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--checkpointing", "none,fulll", "error: --checkpointing has unknown modes ['fulll']; choose from"),
        ("--micro-batches", "1,two", "error: --micro-batches=1,two must be positive integers"),
    ],
)
def test_a_mistyped_option_is_refused_in_one_line_before_any_plan(flag, value, message):
    result = ablation("--devices", "2", "--device-memory-gib", "1", "--hardware", "CPU", flag, value, "--", *TINY_CPU)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.strip().splitlines()[-1].startswith(message), result.stderr


def test_the_plan_leaves_out_layouts_the_run_refuses_and_those_that_do_not_fit(tmp_path):
    result = ablation(
        "--devices", "2", "--device-memory-gib", "0.015", "--micro-batches", "1,8", "--hardware", "CPU", "--plan-only",
        "--", *TINY_CPU, "model.n_layers=1",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    out = result.stdout
    assert (
        "refused: strategy.pipeline_parallel_size=2 x layout.stages_per_rank=1 = 2 stages, more than model.n_layers=1"
        in out
    )
    assert "does not fit: plan" in out and "> 0.015 GiB" in out


def test_the_survivors_train_and_the_table_and_claims_are_written(tmp_path):
    result = ablation(
        "--devices", "1", "--device-memory-gib", "1", "--micro-batches", "1", "--checkpointing", "full",
        "--steps", "1", "--warmup", "1", "--repeats", "1",
        "--hardware", "CPU, 1 process", "--out", str(tmp_path), "--", *TINY_CPU, "model.n_layers=2",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    table = (tmp_path / "layouts_ablation.md").read_text()
    rows = [line for line in table.splitlines() if line.startswith("| 1 | 1 |")]
    assert len(rows) == 1 and rows[0].endswith("| ok |") and "| full |" in rows[0]
    assert "## Layouts ablation: CPU, 1 process" in table
    assert (
        "| micro-batch 1 is the most efficient | speed, the fastest layout at each micro-batch: superiority on the"
        " paired ratio of rates over interleaved repeats, one-sided t-test at 2.5% | **not run** |" in table
    )


def test_the_repeats_are_interleaved_so_a_change_of_load_falls_on_every_layout_alike(monkeypatch, tmp_path):
    """Repeat 1 of every layout, then repeat 2: the order the speed claims' pairing assumes."""
    import scripts.layouts_ablation as script

    order = []

    def fake_run(entry, args):
        order.append(entry.layout)
        entry.measured = {"rates": [1.0], "repeats": [1.0], "mfu": None, "peak_gib": 0.5, "status": "ok"}

    monkeypatch.setattr(script, "run", fake_run)
    script.main(
        ["--devices", "2", "--device-memory-gib", "1", "--micro-batches", "1", "--checkpointing", "none",
         "--repeats", "2", "--hardware", "CPU", "--out", str(tmp_path), "--", *TINY_CPU]
    )  # fmt: skip
    layouts = list(dict.fromkeys(order))
    assert len(layouts) >= 2 and order == layouts * 2

"""The layouts paper's recommendations (Hagemann et al. 2023) as claims with verdicts, from
one ablation's table (``benchmarks/layout_space.py``, ``scripts/layouts_ablation.py``).

Two kinds of test, each named in its verdict line:

- **fit** claims are judged on the memory plan at the device memory given (the plan the run
  logs, checked against measured bytes in the tests): they hold or fail on the plan, and say
  so; a table measured on GPUs puts the measured peaks beside it.
- **speed** claims are superiority tests on paired ratios (``study/claim_tests.py``): every
  layout runs once per repeat, the repeats interleaved (repeat 1 of every layout, then repeat
  2, ...), so a change in the machine's load falls on every layout of a repeat alike; a
  repeat's rate is the median of its timed steps, and the ratio of two layouts' rates is
  taken repeat by repeat. A layout is faster when the lower end of the ratio's 95% interval
  (a one-sided t-test at 2.5% over the repeats) lies above 1, slower when the upper end lies
  below 1; otherwise the claim is inconclusive, and where the test could not even resolve a
  ``SPEED_MARGIN`` difference at this noise the verdict says so: the load's noise is larger
  than the effect the claim is about.
"""

import statistics
from collections.abc import Iterable
from dataclasses import dataclass

from benchmarks.layout_space import Planned
from study.claim_tests import Condition, Estimate, Spread, paired, resolvable, verdict

#: The smallest speed difference (a ratio) a speed claim is about: 5%.
SPEED_MARGIN = 1.05
FASTER = Condition("ratio_higher_than", 1.0)
SPEED_TEST = "superiority on the paired ratio of rates over interleaved repeats, one-sided t-test at 2.5%"


@dataclass(frozen=True)
class Verdict:
    claim: str
    test: str
    verdict: str
    evidence: str


def rate_range(entry: Planned) -> tuple[float, float, float]:
    """(slowest, median, fastest) per-step tokens/s of a measured layout, over every repeat."""
    rates = entry.measured["rates"]
    return min(rates), statistics.median(rates), max(rates)


def repeat_rates(entry: Planned) -> Spread:
    """A measured layout's rate per repeat (the median of each repeat's timed steps), by repeat."""
    rates = entry.measured.get("repeats") or [statistics.median(entry.measured["rates"])]
    return Spread(tuple(rates), tuple(range(len(rates))))


def speed_verdict(ratio: Estimate | None) -> tuple[str, str]:
    """holds / fails / inconclusive for "faster" on a paired ratio, and the ratio in words."""
    if ratio is None:
        return "inconclusive", "one repeat: no spread to test with (give --repeats 3 or more)"
    found = verdict(ratio, FASTER)
    text = f"ratio {ratio.text(0.025)} over {ratio.df + 1} repeats"
    reach = resolvable(ratio, FASTER)
    if found == "inconclusive" and (reach is None or reach > SPEED_MARGIN - 1):
        text += f"; the noise resolves only +-{reach:.1%}, more than the {SPEED_MARGIN - 1:.0%} margin" if reach else ""
    return found, text


def faster(left: Planned, right: Planned) -> tuple[str, str]:
    """Whether ``left`` is faster than ``right``: the superiority test on their paired ratio."""
    return speed_verdict(paired(repeat_rates(left), repeat_rates(right), "ratio"))


def measured(entries: Iterable[Planned]) -> list[Planned]:
    return [entry for entry in entries if entry.measured.get("rates")]


def describe(entry: Planned) -> str:
    layout = entry.layout
    low, median, high = rate_range(entry)
    schedule = f" {layout.schedule}" if layout.pipeline > 1 else ""
    sp = " SP" if layout.sequence_parallel else ""
    return (
        f"D{layout.data} T{layout.tensor}{sp} P{layout.pipeline}{schedule} micro-batch {layout.micro_batch}"
        f" ckpt {layout.checkpointing}: {median:,.0f} tokens/s [{low:,.0f}, {high:,.0f}]"
    )


def micro_batch_one_is_most_efficient(entries: list[Planned]) -> Verdict:
    """The fastest layout at micro-batch 1 against the fastest at any larger micro-batch."""
    claim, test = "micro-batch 1 is the most efficient", f"speed, the fastest layout at each micro-batch: {SPEED_TEST}"
    runs = measured(entries)
    ones = [entry for entry in runs if entry.layout.micro_batch == 1]
    larger = [entry for entry in runs if entry.layout.micro_batch > 1]
    if not ones or not larger:
        return Verdict(claim, test, "not run", "needs measured layouts at micro-batch 1 and above")
    best_one = max(ones, key=lambda entry: repeat_rates(entry).mean)
    best_larger = max(larger, key=lambda entry: repeat_rates(entry).mean)
    found, ratio = faster(best_one, best_larger)
    return Verdict(claim, test, found, f"{describe(best_one)} vs {describe(best_larger)}: {ratio}")


def larger_micro_batches_need_checkpointing_or_model_parallelism(entries: list[Planned]) -> Verdict:
    """At the largest micro-batch: plain data parallelism without checkpointing does not fit,
    and some layout with checkpointing or model parallelism does."""
    claim = "larger micro-batches need activation checkpointing or more model parallelism"
    test = "fit: the memory plan at the largest micro-batch"
    planned = [entry for entry in entries if not (entry.refused or "").startswith("refused")]
    largest = max(entry.layout.micro_batch for entry in planned)
    at_largest = [entry for entry in planned if entry.layout.micro_batch == largest]
    plain = [e for e in at_largest if e.layout.tensor == e.layout.pipeline == 1 and e.layout.checkpointing == "none"]
    helped = [e for e in at_largest if e not in plain and e.refused is None]
    if not plain:
        return Verdict(claim, test, "not run", f"no plain data-parallel layout at micro-batch {largest}")
    plain_fits = plain[0].refused is None
    verdict = "fails" if plain_fits else "holds" if helped else "inconclusive"  # nothing fits: no remedy shown
    evidence = (
        f"micro-batch {largest}: plain data parallelism plans {plain[0].plan_gib:.3g} GiB"
        f" ({'fits' if plain_fits else 'does not fit'}); {len(helped)} layouts with checkpointing or"
        " model parallelism fit"
    )
    return Verdict(claim, test, verdict, evidence)


def larger_micro_batches_lengthen_the_bubble(entries: list[Planned]) -> Verdict:
    """For each pipelined layout measured at two or more micro-batches (the rest equal): its
    rate relative to the data-parallel layout on the same devices at the same micro-batch
    (the pipeline's efficiency) is lower at the largest micro-batch than at the smallest."""
    claim = "larger micro-batches lengthen the pipeline bubble (fewer micro-batches per step)"
    test = f"speed, a pipeline's rate over data parallelism's at the smallest against the largest micro-batch: {SPEED_TEST}"
    runs = measured(entries)
    groups: dict[tuple, list[Planned]] = {}
    for entry in runs:
        layout = entry.layout
        if layout.pipeline > 1:
            key = (
                layout.data,
                layout.tensor,
                layout.pipeline,
                layout.checkpointing,
                layout.sequence_parallel,
                layout.schedule,
            )
            groups.setdefault(key, []).append(entry)
    found, evidence = [], []
    for key, members in groups.items():
        with_baseline = [(entry, baseline(entry, runs)) for entry in members]
        with_baseline = [(entry, base) for entry, base in with_baseline if base is not None]
        if len(with_baseline) < 2:
            continue
        with_baseline.sort(key=lambda pair: pair[0].layout.micro_batch)
        (small, small_base), (large, large_base) = with_baseline[0], with_baseline[-1]
        small_share, large_share = efficiency(small, small_base), efficiency(large, large_base)
        result, ratio = speed_verdict(paired(small_share, large_share, "ratio"))
        found.append(result)
        sp = " SP" if key[4] else ""
        evidence.append(
            f"D{key[0]} T{key[1]}{sp} P{key[2]} {key[5]} ckpt {key[3]}: micro-batch {small.layout.micro_batch}"
            f" {small_share.mean:.2f} of data parallelism, micro-batch {large.layout.micro_batch}"
            f" {large_share.mean:.2f}: {ratio}"
        )
    if not found:
        return Verdict(claim, test, "not run", "no pipelined layout measured at two micro-batches with its baseline")
    verdict = "holds" if all(v == "holds" for v in found) else "fails" if "fails" in found else "inconclusive"
    return Verdict(claim, test, verdict, "; ".join(evidence))


def baseline(entry: Planned, runs: list[Planned]) -> Planned | None:
    """The data-parallel layout on the same devices at the same micro-batch and checkpointing."""
    layout = entry.layout
    devices = layout.data * layout.tensor * layout.pipeline
    for other in runs:
        o = other.layout
        if (o.data, o.tensor, o.pipeline) == (devices, 1, 1) and (o.micro_batch, o.checkpointing) == (
            layout.micro_batch,
            layout.checkpointing,
        ):
            return other
    return None


def efficiency(entry: Planned, base: Planned) -> Spread:
    """A layout's rate over its data-parallel baseline's, repeat by repeat."""
    mine, theirs = repeat_rates(entry).by_seed(), repeat_rates(base).by_seed()
    shared = sorted(set(mine) & set(theirs))
    return Spread(tuple(mine[r] / theirs[r] for r in shared), tuple(shared))


def sequence_parallelism_changes_what_fits(entries: list[Planned]) -> Verdict:
    """Some tensor-parallel layout fits with sequence parallelism and not without it."""
    claim, test = "sequence parallelism changes which layouts fit", "fit: the memory plan with and without it"
    pairs = {}
    for entry in entries:
        layout = entry.layout
        if layout.tensor > 1 and not (entry.refused or "").startswith("refused"):
            key = (
                layout.data,
                layout.tensor,
                layout.pipeline,
                layout.micro_batch,
                layout.checkpointing,
                layout.schedule,
            )
            pairs.setdefault(key, {})[layout.sequence_parallel] = entry
    changed = [
        key for key, pair in pairs.items() if len(pair) == 2 and pair[True].refused is None and pair[False].refused
    ]
    if not pairs:
        return Verdict(claim, test, "not run", "no tensor-parallel layout in the space")
    evidence = f"{len(changed)} of {len(pairs)} tensor-parallel layouts fit only with sequence parallelism"
    return Verdict(claim, test, "holds" if changed else "fails", evidence)


def flash_attention_changes_what_fits() -> Verdict:
    return Verdict(
        "FlashAttention changes which layouts fit",
        "fit: not judged",
        "not run",
        "the memory plan assumes a fused attention kernel (no score matrix) in every layout;"
        " compare layout.attention_backend=math and flash on a GPU",
    )


def verdicts(entries: list[Planned]) -> list[Verdict]:
    return [
        micro_batch_one_is_most_efficient(entries),
        larger_micro_batches_need_checkpointing_or_model_parallelism(entries),
        larger_micro_batches_lengthen_the_bubble(entries),
        sequence_parallelism_changes_what_fits(entries),
        flash_attention_changes_what_fits(),
    ]

"""The layouts paper's recommendations (Hagemann et al. 2023) as claims with verdicts, from
one ablation's table (``benchmarks/layout_space.py``, ``scripts/layouts_ablation.py``).

Two kinds of test, each named in its verdict line:

- **fit** claims are judged on the memory plan at the device memory given (the plan the run
  logs, checked against measured bytes in the tests): they hold or fail on the plan, and say
  so; a table measured on GPUs puts the measured peaks beside it.
- **speed** claims compare per-step token rates over the timed steps: a layout beats
  another when its slowest timed step is faster than the other's fastest (the ranges do not
  overlap); the claim fails when the reverse holds, and is inconclusive when the ranges
  overlap. A comparison of ranges, not a statistical test: it says how far the timing noise
  of this machine lets the table decide.
"""

import statistics
from collections.abc import Iterable
from dataclasses import dataclass

from benchmarks.layout_space import Planned


@dataclass(frozen=True)
class Verdict:
    claim: str
    test: str
    verdict: str
    evidence: str


def rate_range(entry: Planned) -> tuple[float, float, float]:
    """(slowest, median, fastest) per-step tokens/s of a measured layout."""
    rates = entry.measured["rates"]
    return min(rates), statistics.median(rates), max(rates)


def faster(left: Planned, right: Planned) -> str:
    """'holds' if ``left`` is faster beyond the ranges, 'fails' if slower, else 'inconclusive'."""
    (left_low, _, left_high), (right_low, _, right_high) = rate_range(left), rate_range(right)
    if left_low > right_high:
        return "holds"
    if left_high < right_low:
        return "fails"
    return "inconclusive"


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
    claim, test = "micro-batch 1 is the most efficient", "speed: the fastest layout at each micro-batch"
    runs = measured(entries)
    ones = [entry for entry in runs if entry.layout.micro_batch == 1]
    larger = [entry for entry in runs if entry.layout.micro_batch > 1]
    if not ones or not larger:
        return Verdict(claim, test, "not run", "needs measured layouts at micro-batch 1 and above")
    best_one = max(ones, key=lambda entry: rate_range(entry)[1])
    best_larger = max(larger, key=lambda entry: rate_range(entry)[1])
    return Verdict(claim, test, faster(best_one, best_larger), f"{describe(best_one)} vs {describe(best_larger)}")


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
    test = "speed: a pipeline's rate over data parallelism's, smallest against largest micro-batch"
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
        small_low, small_high = efficiency_range(small, small_base)
        large_low, large_high = efficiency_range(large, large_base)
        found.append("holds" if small_low > large_high else "fails" if small_high < large_low else "inconclusive")
        sp = " SP" if key[4] else ""
        evidence.append(
            f"D{key[0]} T{key[1]}{sp} P{key[2]} {key[5]} ckpt {key[3]}: micro-batch {small.layout.micro_batch}"
            f" {small_low:.2f}-{small_high:.2f} of data parallelism, micro-batch {large.layout.micro_batch}"
            f" {large_low:.2f}-{large_high:.2f}"
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


def efficiency_range(entry: Planned, base: Planned) -> tuple[float, float]:
    low, _, high = rate_range(entry)
    base_low, _, base_high = rate_range(base)
    return low / base_high, high / base_low


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

"""The runs of one call, each at most once, within a time budget split among the sections."""

import argparse
import itertools
import sys
import time

from benchmarks.gpu.plan import Plan
from benchmarks.gpu.runs import RunResult, measure
from common.overrides import override_value


class Budget:
    """Wall time since the suite started, split among the sections: section k may start runs
    until the sum of the shares of sections 1..k has passed, so time one section leaves
    goes to the next, and an overrunning section cannot starve the ones after it."""

    def __init__(self, seconds: float, shares: dict[str, float]) -> None:
        self.start = time.perf_counter()
        total = sum(shares.values())
        self.deadlines = {
            name: seconds * part / total for name, part in zip(shares, itertools.accumulate(shares.values()))
        }
        self.section = next(iter(shares))
        self.observed: dict[tuple, float] = {}

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def fits(self, cost_key: tuple, expected: float) -> bool:
        """A run fits if the longest run like it so far (or ``expected``) ends before the deadline."""
        return self.elapsed() + max(expected, self.observed.get(cost_key, 0.0)) <= self.deadlines[self.section]

    def record(self, cost_key: tuple, seconds: float) -> None:
        self.observed[cost_key] = max(seconds, self.observed.get(cost_key, 0.0))


# What Inductor's max-autotune adds to a compile (benchmarking matmul and fusion configurations).
AUTOTUNE_SECONDS = 180.0


class Suite:
    """The runs of one call (each at most once: sections share baselines), the time budget and
    the progress log on stderr."""

    def __init__(self, plan: Plan, args: argparse.Namespace, shares: dict[str, float]) -> None:
        self.plan, self.args = plan, args
        self.budget = Budget(args.budget_seconds, {name: shares[name] for name in args.sections})
        self.runs: dict[tuple, RunResult] = {}

    def log(self, message: str) -> None:
        print(f"[{self.budget.elapsed():6.1f} s] {message}", file=sys.stderr, flush=True)

    def overrides(self, model: str, *extra: str, seq_len: int | None = None) -> list[str]:
        """Every run's overrides: the plan's base, the model, the packed length (the plan's
        unless given), shared cache."""
        cache = [f"paths.cache_dir={self.args.cache_dir}"] if self.args.cache_dir else []
        peak = [f"callbacks.throughput.peak_flops_per_device={self.args.peak_flops}"] if self.args.peak_flops else []
        length = seq_len or self.plan.seq_len
        return [*self.plan.base, *cache, *peak, f"model={model}", f"data.seq_len={length}", *extra]

    def work_layout(self, model: str, *extra: str, micro_batch: int = 0, compile_mode: str = "") -> list[str]:
        """The layout of the technique, overhead and float8-loss runs (``Plan.work_*``): no
        checkpointing, the plan's work micro-batch, compile and kernels unless given."""
        plan = self.plan
        return self.overrides(
            model,
            f"batch.micro_batch_size={micro_batch or plan.work_micro_batch}",
            f"layout.compile={compile_mode or plan.work_compile}",
            "layout.activation_checkpointing=none",
            *plan.work_kernels,
            *extra,
        )

    def run(
        self,
        label: str,
        overrides: list[str],
        steps: int,
        warmup: int,
        loop: str = "framework",
        every_step: bool = False,
        repeat: int = 0,
    ) -> RunResult:
        """Run once (or return the earlier result of the same run; ``repeat`` > 0 trains it
        again); skipped when it would pass the section's deadline."""
        key = (loop, steps, warmup, every_step, repeat, *overrides)
        if key in self.runs:
            return self.runs[key]
        result = RunResult(label, overrides, loop, steps, warmup)
        compile_mode = override_value(overrides, "layout.compile", "none")
        cost_key = (
            loop,
            steps + warmup,
            override_value(overrides, "model", "tiny"),
            compile_mode,
            override_value(overrides, "trainer.precision", self.plan.precision),
        )
        expected = self.plan.run_seconds + (self.plan.compile_seconds if compile_mode != "none" else 0.0)
        if override_value(overrides, "layout.compile_mode", "default") != "default":
            expected += AUTOTUNE_SECONDS
        if self.budget.fits(cost_key, expected):
            self.log(f"{self.budget.section}: {label} ...")
            measure(result, every_step)
            self.budget.record(cost_key, result.seconds)
        else:
            result.status = "skipped (time budget)"
        self.log(f"{self.budget.section}: {label}: {result.summary()} ({result.seconds:.1f} s)")
        self.runs[key] = result
        return result

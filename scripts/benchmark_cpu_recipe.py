"""The CPU speedrun's time on CPU types not at hand, from a reference loop measured beside it.

    python scripts/benchmark_cpu_recipe.py                                  # the default run and the AdamW recipe
    python scripts/benchmark_cpu_recipe.py --recipe default= --recipe muon_2.6M=token_budget=2600000

A recipe's time per token differs by CPU type in ways its instruction set alone does not
predict, so this command measures, in one go on an idle machine: a fixed plain-PyTorch matmul
loop (the reference; the median of three runs, each in a fresh process), then each recipe's
whole `python train.py` as the README runs it (start-up, tokenizing the corpus into an empty
cache, training, validation, checkpoints, the default W&B logger offline). A
recipe's rate is its seconds per token divided by the reference's seconds: "reference loops per
million tokens". Times on another CPU type are that rate times the other type's reference loop
(the measured ones are in ``CPU_TYPES``); where a type also has a measured rate for the recipe's
model, that rate is printed beside it, so the prediction's error can be read off.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# The reference: 200 products of 1024 x 1024 float32 matrices on 2 threads, in a fresh process.
REFERENCE = (
    "import torch,time; torch.set_num_threads(2); torch.manual_seed(0); a=torch.randn(1024,1024);"
    " [a@a for _ in range(5)]; t=time.time(); [a@a for _ in range(200)]; print(round(time.time()-t,3))"
)


@dataclass(frozen=True)
class CpuType:
    """A 2-core machine type measured from a fresh clone, alone."""

    name: str
    reference_s: float
    # Reference loops per 1M tokens of `python train.py`, measured there, by model and batch.
    measured_rates: dict[str, float]


# AVX2 EPYC: the Muon recipe of 2026-11-27 (the nano model at batch 16 x 256, validation every
# 100 steps) took about 590 s of `train.py` for 3.3M tokens; reference 6.59 s (7.01, 6.59, 6.55).
CPU_TYPES = (
    CpuType("AMD EPYC 2.0 GHz, AVX2 + FMA, no AVX-512", 6.59, {"nano, batch 16 x 256, Muon": 590 / 3.3 / 6.59}),
    CpuType("Intel Xeon 2.5 GHz, AVX-512 without bf16", 3.67, {}),
)


@dataclass(frozen=True)
class Recipe:
    name: str
    overrides: tuple[str, ...]


@dataclass(frozen=True)
class Measured:
    recipe: Recipe
    seconds: float
    tokens: int
    val_loss: float

    def rate(self, reference_s: float) -> float:
        """Reference loops per 1M tokens."""
        return self.seconds / (self.tokens / 1e6) / reference_s


FINISHED = re.compile(r"finished at step \d+ after ([\d,]+) tokens: val/loss ([\d.]+)")


def reference_seconds(repeats: int) -> list[float]:
    """The reference loop's seconds, each run in a fresh process."""
    runs = [
        subprocess.run([sys.executable, "-c", REFERENCE], capture_output=True, text=True, check=True)
        for _ in range(repeats)
    ]
    return [float(run.stdout.strip()) for run in runs]


def run_recipe(recipe: Recipe, out: Path) -> Measured:
    """One whole `python train.py`, timed from the command's start to its exit."""
    command = [
        sys.executable,
        str(REPO / "train.py"),
        f"paths.output_dir={out / recipe.name}",
        f"paths.cache_dir={out / 'cache'}",
        *recipe.overrides,
    ]
    start = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
    seconds = time.perf_counter() - start
    found = FINISHED.search(result.stdout + result.stderr)
    if result.returncode != 0 or found is None:
        raise SystemExit(
            f"error: recipe {recipe.name} did not finish (exit {result.returncode}):\n{result.stderr[-2000:]}"
        )
    return Measured(recipe, seconds, int(found.group(1).replace(",", "")), float(found.group(2)))


def parse_recipe(text: str) -> Recipe:
    name, _, overrides = text.partition("=")
    if not name:
        raise argparse.ArgumentTypeError(
            f"recipe {text!r} has no name: write NAME=override,override (or NAME= for none)"
        )
    return Recipe(name, tuple(item for item in overrides.split(",") if item))


def table(measured: list[Measured], reference_s: float) -> str:
    """Markdown: each recipe here, and its predicted `train.py` seconds on every known type."""
    header = ["recipe", "tokens", "val/loss", "train.py s here", "reference loops per 1M tokens"]
    header += [f"predicted s: {cpu.name} (reference {cpu.reference_s} s)" for cpu in CPU_TYPES]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for run in measured:
        rate = run.rate(reference_s)
        predicted = [f"{rate * cpu.reference_s * run.tokens / 1e6:.0f}" for cpu in CPU_TYPES]
        row = [
            run.recipe.name,
            f"{run.tokens:,}",
            f"{run.val_loss:.4f}",
            f"{run.seconds:.0f}",
            f"{rate:.2f}",
            *predicted,
        ]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def known_rates() -> str:
    lines = [
        f"- {cpu.name}: {model}: {rate:.2f} reference loops per 1M tokens"
        for cpu in CPU_TYPES
        for model, rate in cpu.measured_rates.items()
    ]
    return "Rates measured on the other types (compare with this machine's):\n" + "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--recipe",
        type=parse_recipe,
        action="append",
        default=None,
        help="NAME=override,override (repeatable; default: default= and adamw_recipe=+experiment=adamw_recipe)",
    )
    parser.add_argument(
        "--reference-repeats",
        type=int,
        default=3,
        help="runs of the reference loop, each in a fresh process; their median is the reference (default: 3)",
    )
    args = parser.parse_args(argv)
    if args.reference_repeats < 1:
        parser.error(f"--reference-repeats must be at least 1, got {args.reference_repeats}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    recipes = args.recipe or [Recipe("default", ()), Recipe("adamw_recipe", ("+experiment=adamw_recipe",))]
    references = reference_seconds(args.reference_repeats)
    reference_s = statistics.median(references)
    print(
        f"reference loop: {reference_s:.3f} s (median of {', '.join(f'{s:.3f}' for s in references)})", file=sys.stderr
    )
    with tempfile.TemporaryDirectory(prefix="benchmark_cpu_recipe_") as out:
        measured = []
        for recipe in recipes:
            measured.append(run_recipe(recipe, Path(out)))
            print(f"{recipe.name}: {measured[-1].seconds:.0f} s, val/loss {measured[-1].val_loss:.4f}", file=sys.stderr)
    print(f"\nreference loop here: {reference_s:.3f} s\n")
    print(table(measured, reference_s))
    print("\n" + known_rates())


if __name__ == "__main__":
    main()

"""Tensor-parallel layouts against one process: the same seed and global batch under D x T
layouts on CPU processes (gloo), their per-step losses and gradient norms side by side with
one process's, and their tokens/s as a ratio to it (measured in the same command).

    python scripts/benchmark_tensor_parallel.py                                  # tiny model, 12 steps
    python scripts/benchmark_tensor_parallel.py --layout 1x2 --layout 1x2:nosp -- model=nano

A layout is ``DxT`` (data-parallel x tensor-parallel ranks; ``:nosp`` turns sequence
parallelism off). Every run is a fresh ``train.py`` with one thread per process; tokens/s is
the Throughput callback's after the first two steps. On a 2-core machine layouts of more
than 2 processes share the cores, so their rates say little about a real cluster.
"""

import argparse
import csv
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TINY = [
    "model.n_layers=2",
    "model.d_model=64",
    "model.n_heads=4",
    "model.n_kv_heads=2",
    "model.mlp_hidden=128",
    "data.seq_len=64",
    "data.source.max_documents=600",
    "batch.global_batch_size=8",
    "optimizer=adamw",
]
DEFAULT_LAYOUTS = ["2x1", "1x2:nosp", "1x2", "2x2"]


@dataclass(frozen=True)
class Layout:
    data: int
    tensor: int
    sequence_parallel: bool = True

    @classmethod
    def parse(cls, text: str) -> "Layout":
        shape, _, option = text.partition(":")
        try:
            data, tensor = (int(part) for part in shape.split("x"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"layout {text!r}: write DxT, e.g. 1x2 or 2x2:nosp") from None
        if option not in ("", "nosp"):
            raise argparse.ArgumentTypeError(f"layout {text!r}: the only option is :nosp")
        return cls(data, tensor, option != "nosp")

    @property
    def name(self) -> str:
        return f"{self.data}x{self.tensor}" + ("" if self.sequence_parallel or self.tensor == 1 else " (no SP)")

    def overrides(self) -> list[str]:
        processes = self.data * self.tensor
        if processes == 1:
            return []
        return [
            "strategy=fsdp2",
            "trainer.accelerator=cpu",
            f"trainer.devices={processes}",
            f"strategy.tensor_parallel_size={self.tensor}",
            f"layout.sequence_parallel={str(self.sequence_parallel).lower()}",
            "strategy.save_distributed_checkpoint=false",
        ]


@dataclass
class Measured:
    losses: dict[int, float]
    grad_norms: dict[int, float]
    tokens_per_sec: float | None


def run(layout: Layout, args: argparse.Namespace, folder: Path) -> Measured:
    overrides = [
        f"hydra.run.dir={folder}",
        f"paths.cache_dir={folder.parent / 'cache'}",
        f"trainer.max_steps={args.steps}",
        "trainer.log_every_n_steps=1",
        "logger=csv",
        "trainer.num_sanity_val_steps=0",
        "callbacks.validation_schedule.every_n_steps=1000000",
        *TINY,
        *args.overrides,
        *layout.overrides(),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline"}
    result = subprocess.run(
        [sys.executable, str(REPO / "train.py"), *overrides], cwd=REPO, env=env, capture_output=True, text=True
    )
    if result.returncode != 0:
        raise SystemExit(f"error: layout {layout.name} failed (exit {result.returncode}):\n{result.stderr[-2000:]}")
    with open(folder / "csv" / "metrics.csv") as file:
        rows = list(csv.DictReader(file))
    losses = {int(r["step"]): float(r["train/loss"]) for r in rows if r.get("train/loss")}
    norms = {int(r["step"]): float(r["train/grad_norm"]) for r in rows if r.get("train/grad_norm")}
    rates = [float(r["perf/tokens_per_sec"]) for r in rows if r.get("perf/tokens_per_sec")]
    return Measured(losses, norms, sum(rates[2:]) / len(rates[2:]) if len(rates) > 2 else None)


def largest_relative(values: dict[int, float], reference: dict[int, float]) -> float:
    return max(abs(values[step] - reference[step]) / abs(reference[step]) for step in reference)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--layout",
        type=Layout.parse,
        action="append",
        help=f"DxT[:nosp] (repeatable; default {' '.join(DEFAULT_LAYOUTS)})",
    )
    parser.add_argument("--steps", type=int, default=12, help="optimizer steps per layout")
    parser.add_argument("overrides", nargs="*", help="train.py overrides shared by every layout (after --)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    layouts = [Layout(1, 1), *(args.layout or [Layout.parse(text) for text in DEFAULT_LAYOUTS])]
    with tempfile.TemporaryDirectory(prefix="benchmark_tp_") as workdir:
        measured = {}
        for index, layout in enumerate(layouts):
            print(f"running {layout.name} ...", file=sys.stderr, flush=True)
            measured[layout] = run(layout, args, Path(workdir) / str(index))
    one = measured[layouts[0]]
    print(
        "\n| layout | processes | largest rel. loss difference | largest rel. grad-norm difference | tokens/s | vs one process |"
    )
    print("|---|---|---|---|---|---|")
    for layout, result in measured.items():
        rate = f"{result.tokens_per_sec:,.0f}" if result.tokens_per_sec else "-"
        ratio = (
            f"{result.tokens_per_sec / one.tokens_per_sec:.2f}" if result.tokens_per_sec and one.tokens_per_sec else "-"
        )
        print(
            f"| {layout.name} | {layout.data * layout.tensor} | {largest_relative(result.losses, one.losses):.1e} |"
            f" {largest_relative(result.grad_norms, one.grad_norms):.1e} | {rate} | {ratio} |"
        )
    print("\n| step | " + " | ".join(f"loss {layout.name}" for layout in layouts) + " |")
    print("|---|" + "---|" * len(layouts))
    for step in sorted(one.losses):
        print(f"| {step} | " + " | ".join(f"{measured[layout].losses[step]:.6f}" for layout in layouts) + " |")


if __name__ == "__main__":
    main()

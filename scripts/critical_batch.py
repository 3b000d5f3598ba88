"""Measure the critical batch size along a run by branched training (Merrill et al. 2025).

    python scripts/critical_batch.py --dir outputs/studies/critical_batch
    python scripts/critical_batch.py --dir DIR --seeds 1 --steps 25 50 --batches 16 64 --window 65536 model.n_layers=2
    python scripts/critical_batch.py --compare outputs/studies/critical_batch_0_1m outputs/studies/critical_batch_0_65m --out docs/

Three stages, each resumable (the same command again skips what finished and resumes what
was interrupted):

1. the base runs, one per seed: ``python train.py -m +sweep=critical_batch`` into DIR/base
   (batch 16, constant learning rate, a checkpoint every 25 steps, the gradient noise scale
   logged at every step);
2. the branches: from each seed's checkpoint at each of ``--steps``, one run per batch in
   ``--batches`` with the learning rate scaled by sqrt(B / 16), for ``--window`` tokens.
   They are the arms of a study preset written to DIR/conf/sweep/critical_batch_branches.yaml
   and run with the study sweeper into DIR/branches;
3. the report: DIR/report/critical_batch.md (each branch point's losses and critical batch,
   and the summary over seeds) and critical_batch.png (the measured critical batch against
   tokens, with the gradient noise scale and the norm test's batch on the same axes).

Extra arguments are train.py overrides for both the base runs and the branches (a smaller
model, another data source). ``--compare`` measures nothing: it reads finished studies of
several model sizes (a ladder's, each with ``model=...``) and fits log B* against log tokens
and log N, saying whether the critical batch grows with tokens and with size, and draws
critical_batch_by_size.png (B* against tokens, one line per size) into ``--out``. The
definitions are in ``analysis/critical_batch.py``.
"""

import argparse
import subprocess
import sys
from pathlib import Path

import yaml

from analysis.critical_batch import (
    BaseRun,
    branch_arms,
    branch_points,
    growth,
    plot_by_size,
    plot_points,
    points_table,
    summary_table,
)
from analysis.runs import find_runs
from analysis.scaling_laws import parameter_count
from common.errors import ConfigError, UserError
from common.overrides import override_key
from launch.cli import exit_code

REPO = Path(__file__).resolve().parents[1]

BRANCH_PRESET = "critical_batch_branches"
#: What the script sets per run; an override of them would replace the branches' own.
SET_HERE = ("seed", "ckpt_path", "batch.global_batch_size", "optimizer.lr", "token_budget", "trainer.max_steps")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, default=Path("outputs/studies/critical_batch"), help="the study's folder")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3], help="one base run per seed")
    parser.add_argument(
        "--steps",
        type=int,
        nargs="+",
        default=[25, 50, 100, 200],
        help="branch points: base-run steps with a checkpoint (multiples of 25)",
    )
    parser.add_argument(
        "--batches",
        type=int,
        nargs="+",
        default=[4, 8, 16, 32, 64, 128, 256],
        help="branch batch sizes; the smallest is the reference",
    )
    parser.add_argument("--window", type=int, default=262_144, help="tokens each branch trains for")
    parser.add_argument(
        "--tolerance", type=float, default=0.01, help="loss tolerance (nats) against the smallest batch"
    )
    parser.add_argument(
        "--compare",
        type=Path,
        nargs="+",
        metavar="DIR",
        help="measure nothing: the critical batch of several finished studies (a ladder's sizes) against tokens and size",
    )
    parser.add_argument(
        "--out", type=Path, help="with --compare: folder for critical_batch_by_size.png (default: FIRST_DIR/report)"
    )
    parser.add_argument("overrides", nargs="*", help="train.py overrides for the base runs and the branches")
    args = parser.parse_args(argv)
    if args.window <= 0 or args.tolerance < 0 or min(args.batches) <= 0 or min(args.steps) <= 0:
        raise ConfigError("--window and the --batches and --steps must be > 0 and --tolerance >= 0.")
    for override in args.overrides:
        if override_key(override) in SET_HERE:
            raise ConfigError(
                f"{override}: the script sets {', '.join(SET_HERE)} itself; use --seeds, --steps,"
                " --batches and --window, or change the base run in conf/sweep/critical_batch.yaml."
            )
    return args


def train(arguments: list[str]) -> None:
    """Run train.py; a failed run ends this script with its exit code (its own error line was printed)."""
    completed = subprocess.run([sys.executable, str(REPO / "train.py"), *arguments], cwd=REPO)
    if completed.returncode:
        sys.exit(completed.returncode)


def base_runs(folder: Path, seeds: list[int]) -> dict[int, tuple[BaseRun, object]]:
    runs = {run.seed: run for run in find_runs([folder])}
    missing = sorted(set(seeds) - set(runs))
    if missing:
        raise UserError(
            f"{folder} has no finished base run for seeds {missing}; run this command again to finish them."
        )
    return {seed: (BaseRun.of(runs[seed]), runs[seed]) for seed in seeds}


def write_branch_preset(path: Path, arms: dict[str, list[str]]) -> None:
    """The branches as a study preset: every arm continues a base checkpoint at one batch size."""
    preset = {
        # The base runs' recipe, as in conf/sweep/critical_batch.yaml (their optimizer, model and data).
        "defaults": [
            {"/experiment": "adamw_recipe"},
            {"override /hydra/sweeper": "study"},
            {"override /logger": "csv"},
        ],
        "experiment_name": "study_critical_batch_branches",
        "batch": {"micro_batch_size": None},
        "lr_schedule": {"name": "constant", "warmup_steps": 20},
        "callbacks": {
            "validation_schedule": {"every_n_steps": 1_000_000, "every_n_tokens": None},  # at the end only
            "model_checkpoint": {"every_n_train_steps": 25, "save_top_k": 1},
        },
        "study": {"arm": None, "seeds": [0], "arms": arms},  # every arm sets its base run's seed
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    header = "# @package _global_\n# Written by scripts/critical_batch.py: the branches of the critical-batch study.\n"
    path.write_text(header + yaml.safe_dump(preset, sort_keys=False, width=200))


def writable_folder(path: Path, flag: str) -> Path:
    """``path`` created if missing: a path that cannot be a folder is the user's one-line mistake,
    found before any run starts."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UserError(
            f"{flag} {path}: cannot create this folder ({error.strerror}); give a folder you can write to."
        ) from None
    return path.resolve()


def measure(args: argparse.Namespace) -> None:
    folder = writable_folder(args.dir, "--dir")
    seeds = ",".join(map(str, args.seeds))
    train(
        [
            "-m",
            "+sweep=critical_batch",
            f"hydra.sweep.dir={folder / 'base'}",
            f"study.seeds=[{seeds}]",
            f"trainer.max_steps={max(args.steps)}",
            *args.overrides,
        ]
    )
    bases = base_runs(folder / "base", args.seeds)
    arms = branch_arms([base for base, _ in bases.values()], sorted(args.steps), sorted(args.batches), args.window)
    write_branch_preset(folder / "conf" / "sweep" / f"{BRANCH_PRESET}.yaml", arms)
    train(
        [
            "-m",
            f"--config-dir={folder / 'conf'}",
            f"+sweep={BRANCH_PRESET}",
            f"hydra.sweep.dir={folder / 'branches'}",
            *args.overrides,
        ]
    )
    report(folder, bases, args.tolerance)


def report(folder: Path, bases: dict, tolerance: float) -> None:
    points = branch_points(bases, find_runs([folder / "branches"]), tolerance)
    out = folder / "report"
    out.mkdir(exist_ok=True)
    eta = next(iter(bases.values()))[0].eta
    plot_points(points, eta, out / "critical_batch.png")
    text = (
        f"## Each seed and branch point (val/loss after the window; in brackets: minus the smallest batch's)\n\n"
        f"{points_table(points, tolerance)}\n\n## Over seeds\n\n{summary_table(points)}\n"
    )
    (out / "critical_batch.md").write_text(text)
    print(text, flush=True)
    print(f"wrote {out / 'critical_batch.md'} and {out / 'critical_batch.png'}", file=sys.stderr)


def compare(folders: list[Path], tolerance: float, out: Path | None = None) -> None:
    """Each finished study's points, by its model's size; the fitted exponents and the verdict."""
    by_size = {}
    for folder in folders:
        try:
            runs = find_runs([folder / "base"])
        except FileNotFoundError as error:
            raise UserError(f"--compare {folder}: {error} Run the measurement there first.") from None
        bases = base_runs(folder / "base", sorted(run.seed for run in runs))
        n_params = parameter_count(runs[0].setting("model"))
        by_size[n_params] = branch_points(bases, find_runs([folder / "branches"]), tolerance)
        print(f"## {folder} (N = {n_params:,})\n\n{summary_table(by_size[n_params])}\n")
    found = growth(by_size)
    print(
        f"log B* against log tokens: exponent {found.tokens[0]:.3f} [{found.tokens[1]:.3f}, {found.tokens[2]:.3f}];"
        f" against log N: {found.size[0]:.3f} [{found.size[1]:.3f}, {found.size[2]:.3f}]"
        f" ({found.points} points, {found.censored} at the grid's top, {found.at_floor} at its floor, where B* is at most the"
        f" smallest batch): the critical batch {found.verdict()}."
    )
    out = writable_folder(out, "--out") if out else writable_folder(folders[0] / "report", "--compare")
    plot_by_size(by_size, out / "critical_batch_by_size.png")
    print(f"wrote {out / 'critical_batch_by_size.png'}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    def work() -> None:
        args = parse_args(argv)
        compare(args.compare, args.tolerance, args.out) if args.compare else measure(args)

    return exit_code(work)


if __name__ == "__main__":
    sys.exit(main())

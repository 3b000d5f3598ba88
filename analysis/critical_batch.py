"""The critical batch size, measured by branched training (Merrill et al. 2025, arXiv 2505.23971).

A base run at a small batch B0 saves checkpoints. From the checkpoint at step n (t tokens),
short continuations ("branches") train at batch sizes B = B0 .. B_max with the learning
rate scaled by sqrt(B / B0) (the rule for Adam) for the same window of W tokens. The
critical batch at t is the largest B whose validation loss after the window, at t + W
tokens for every branch, is within a tolerance of the smallest batch's:

    B*(t) = max {B : L_B(t + W) <= L_B0(t + W) + tolerance}

(the paper takes the smoothed training loss and tolerance 0.01; a fixed held-out set is as
cheap here and has no sampling noise). If the largest batch passes, B* is only known to be
at least B_max.

Beside it: the gradient noise scale B_simple = tr(Sigma) / |g|^2 (McCandlish et al. 2018)
that the base run's norm test logs at every step, averaged over the steps since the
previous branch point, and the batch the norm test would ask for, B_simple / eta^2.

Torch-free: this module plans the branches and reads finished runs.
"""

import math
import statistics
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from analysis.markdown_table import markdown_table
from analysis.runs import STEP, Run
from analysis.student_t import t_quantile
from common.errors import ConfigError

NOISE_SCALE = "adaptive_bs/noise_scale"


@dataclass(frozen=True)
class BaseRun:
    """What a branch needs from the base run of one seed."""

    seed: int
    folder: Path
    global_batch: int
    seq_len: int
    lr: float
    eta: float

    @classmethod
    def of(cls, run: Run) -> "BaseRun":
        return cls(
            seed=int(run.seed),
            folder=run.path,
            global_batch=int(run.setting("batch.global_batch_size")),
            seq_len=int(run.setting("data.seq_len")),
            lr=float(run.setting("optimizer.lr")),
            eta=float(run.setting("technique.adaptive_batch.eta")),
        )

    def tokens_at(self, step: int) -> int:
        """Tokens seen after ``step`` steps of the constant base batch."""
        return step * self.global_batch * self.seq_len

    def checkpoint(self, step: int) -> Path:
        """The periodic checkpoint at ``step`` (``callbacks.model_checkpoint.filename``)."""
        path = self.folder / "checkpoints" / f"step{step:06d}.ckpt"
        if not path.is_file():
            raise ConfigError(
                f"{path} does not exist: branch points must be steps the base run checkpointed"
                " (callbacks.model_checkpoint.every_n_train_steps in conf/sweep/critical_batch.yaml)."
            )
        return path


def arm_name(seed: int, step: int, batch: int) -> str:
    return f"seed{seed}_step{step:05d}_b{batch:04d}"


def branch_arms(bases: list[BaseRun], steps: list[int], batches: list[int], window: int) -> dict[str, list[str]]:
    """One study arm per (seed, branch step, batch): the overrides that continue the base
    run's checkpoint at that batch, with the sqrt-scaled learning rate, for ``window`` tokens."""
    arms = {}
    for base in bases:
        for step in steps:
            checkpoint = base.checkpoint(step)
            for batch in batches:
                arms[arm_name(base.seed, step, batch)] = [
                    f"seed={base.seed}",
                    f"ckpt_path={checkpoint}",
                    f"batch.global_batch_size={batch}",
                    f"optimizer.lr={base.lr * math.sqrt(batch / base.global_batch):.6g}",
                    f"token_budget={base.tokens_at(step) + window}",
                ]
    return arms


def critical_batch(losses: dict[int, float], tolerance: float) -> int:
    """The largest batch whose loss is within ``tolerance`` of the smallest batch's."""
    reference = losses[min(losses)]
    return max(batch for batch, loss in losses.items() if loss <= reference + tolerance)


@dataclass(frozen=True)
class BranchPoint:
    """One seed's measurement at one branch point."""

    seed: int
    step: int
    tokens: int
    losses: dict[int, float]  # branch batch -> val/loss after the window
    critical: int  # the measured critical batch
    censored: bool  # the largest batch passed: the critical batch is at least that
    noise_scale: float | None  # mean B_simple over the base run's steps up to the branch point
    norm_test_batch: float | None  # B_simple / eta^2


def mean_noise_scale(run: Run, after_step: int, up_to_step: int) -> float | None:
    values = [
        row[NOISE_SCALE] for row in run.rows if NOISE_SCALE in row and after_step < row.get(STEP, -1) <= up_to_step
    ]
    return statistics.fmean(values) if values else None


def branch_points(bases: dict[int, tuple[BaseRun, Run]], branches: list[Run], tolerance: float) -> list[BranchPoint]:
    """Every (seed, step) whose branches have all finished, with its measured critical batch."""
    losses: dict[tuple[int, int], dict[int, float]] = {}
    for run in branches:
        arm, loss = run.arm, run.final("val/loss")
        if arm is None or loss is None:
            continue
        seed, step, batch = (int(part[len(prefix) :]) for part, prefix in zip(arm.split("_"), ("seed", "step", "b")))
        losses.setdefault((seed, step), {})[batch] = loss
    points, previous = [], {}
    for (seed, step), by_batch in sorted(losses.items()):
        base, run = bases[seed]
        critical = critical_batch(by_batch, tolerance)
        noise = mean_noise_scale(run, previous.get(seed, 0), step)
        previous[seed] = step
        points.append(
            BranchPoint(
                seed,
                step,
                base.tokens_at(step),
                dict(sorted(by_batch.items())),
                critical,
                critical == max(by_batch),
                noise,
                noise / base.eta**2 if noise is not None else None,
            )
        )
    return points


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def points_table(points: list[BranchPoint], tolerance: float) -> str:
    """One row per seed and branch point: each batch's loss, the critical batch, the noise scale."""
    batches = sorted({batch for point in points for batch in point.losses})
    rows = []
    for point in points:
        row = {"seed": str(point.seed), "step": str(point.step), "tokens": f"{point.tokens:,}"}
        reference = point.losses[min(point.losses)]
        for batch in batches:
            loss = point.losses.get(batch)
            row[f"B={batch}"] = "-" if loss is None else f"{loss:.4f} ({loss - reference:+.3f})"
        row[f"critical (tol {tolerance})"] = f">= {point.critical}" if point.censored else str(point.critical)
        row["B_simple"] = _fmt(point.noise_scale)
        row["norm test"] = _fmt(point.norm_test_batch)
        rows.append(row)
    return markdown_table(rows)


def summary_table(points: list[BranchPoint]) -> str:
    """Per branch point over seeds: the critical batch's geometric mean and range, B_simple, the norm test's batch."""
    rows = []
    for step in sorted({point.step for point in points}):
        group = [point for point in points if point.step == step]
        critical = [point.critical for point in group]
        noise = [point.noise_scale for point in group if point.noise_scale is not None]
        norm = [point.norm_test_batch for point in group if point.norm_test_batch is not None]
        rows.append(
            {
                "step": str(step),
                "tokens": f"{group[0].tokens:,}",
                "seeds": str(len(group)),
                "critical batch (geo. mean, min-max)": f"{statistics.geometric_mean(critical):.0f} ({min(critical)}-{max(critical)})"
                + (" (some at the grid's top)" if any(point.censored for point in group) else ""),
                "B_simple (mean)": _fmt(statistics.fmean(noise)) if noise else "-",
                "norm test's batch (mean)": _fmt(statistics.fmean(norm)) if norm else "-",
            }
        )
    return markdown_table(rows)


def plot_points(points: list[BranchPoint], eta: float, path: Path) -> None:
    """Measured critical batch (each seed, and the geometric mean), B_simple and the norm
    test's batch against the tokens of the branch point, on a log batch axis."""
    figure, axis = plt.subplots(figsize=(8, 5))
    steps = sorted({point.step for point in points})
    tokens = [next(p.tokens for p in points if p.step == step) for step in steps]
    by_step = [[p for p in points if p.step == step] for step in steps]
    axis.scatter(
        [p.tokens for p in points], [p.critical for p in points], color="C0", alpha=0.4, label="measured, each seed"
    )
    axis.plot(
        tokens,
        [statistics.geometric_mean([p.critical for p in g]) for g in by_step],
        "o-",
        color="C0",
        label="measured critical batch (geometric mean over seeds)",
    )
    for key, label, color in (
        ("noise_scale", "gradient noise scale B_simple", "C1"),
        ("norm_test_batch", f"norm test's batch, B_simple / eta^2 (eta {eta})", "C2"),
    ):
        values = [[getattr(p, key) for p in g if getattr(p, key) is not None] for g in by_step]
        kept = [(t, statistics.fmean(v)) for t, v in zip(tokens, values) if v]
        if kept:
            axis.plot(*zip(*kept), "s--", color=color, label=label)
    save_plot(
        figure,
        axis,
        points,
        path,
        ylabel="batch (sequences)",
        title="Critical batch, measured by branching, against the noise-scale estimates",
    )


def save_plot(figure, axis, points: list[BranchPoint], path: Path, **labels: str) -> None:
    """The branch grid's batches shaded (a critical batch at its edge is censored by it), the
    token axis labelled, the legend drawn; saved to ``path`` and closed."""
    batches = sorted({batch for point in points for batch in point.losses})
    if batches:
        axis.axhspan(batches[0], batches[-1], color="grey", alpha=0.08, label=f"branch grid {batches[0]}-{batches[-1]}")
    axis.set(xlabel="tokens at the branch point", yscale="log", **labels)
    axis.legend(fontsize="small")
    figure.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(figure)


def plot_by_size(points_by_size: dict[int, list[BranchPoint]], path: Path) -> None:
    """The measured critical batch against tokens, one colour per model size: each seed's
    points and their geometric mean per branch point, log-log (a power law is a line). Each
    size is shifted by a few percent along the token axis so that equal values stay visible."""
    figure, axis = plt.subplots(figsize=(7, 4.5))
    for index, (n_params, points) in enumerate(sorted(points_by_size.items())):
        color, shift = f"C{index}", 1 + 0.04 * (index - (len(points_by_size) - 1) / 2)
        steps = sorted({point.step for point in points})
        by_step = [[p for p in points if p.step == step] for step in steps]
        axis.scatter([p.tokens * shift for p in points], [p.critical for p in points], color=color, alpha=0.35)
        axis.plot(
            [g[0].tokens * shift for g in by_step],
            [statistics.geometric_mean([p.critical for p in g]) for g in by_step],
            "o-",
            color=color,
            label=f"N = {n_params / 1e6:.2f}M (geometric mean over seeds)",
        )
    every_point = [point for points in points_by_size.values() for point in points]
    save_plot(
        figure,
        axis,
        every_point,
        path,
        xscale="log",
        ylabel="critical batch (sequences)",
        title="Critical batch against tokens, per model size",
    )


@dataclass(frozen=True)
class Growth:
    """How the critical batch scales: log B* = c + b_tokens log t + b_size log N, by least
    squares over every (size, seed, branch point), with each exponent's 95% interval."""

    tokens: tuple[float, float, float]  # exponent, low, high
    size: tuple[float, float, float]
    points: int
    censored: int  # points whose largest batch passed: B* is only a lower bound there
    #: Points where no batch above the smallest passed: B* is at most the smallest, the
    #: reference the rule compares with, so the fit reads those as equal to it.
    at_floor: int = 0

    def verdict(self) -> str:
        """Grows with tokens (its interval above 0); with size or not (the size exponent's
        interval above 0, or containing it)."""
        with_tokens = "grows with tokens" if self.tokens[1] > 0 else "does not grow measurably with tokens"
        with_size = (
            "grows with model size"
            if self.size[1] > 0
            else ("shrinks with model size" if self.size[2] < 0 else "does not change measurably with model size")
        )
        return f"{with_tokens}; {with_size}"


def growth(points_by_size: dict[float, list[BranchPoint]]) -> Growth:
    """The critical batch's exponents in tokens and model size over a ladder's measurements
    (two or more sizes, and more points than three)."""
    rows = [
        (math.log(p.tokens), math.log(n), math.log(p.critical), p.censored)
        for n, points in points_by_size.items()
        for p in points
    ]
    if len(points_by_size) < 2 or len(rows) <= 3:
        raise ConfigError(
            "the critical batch's growth needs measurements at two or more model sizes (--compare DIR DIR ...)."
        )
    import numpy as np

    design = np.array([[1.0, t, n] for t, n, _, _ in rows])
    target = np.array([b for _, _, b, _ in rows])
    coefficients, *_ = np.linalg.lstsq(design, target, rcond=None)
    residual = target - design @ coefficients
    dof = len(rows) - 3
    covariance = residual @ residual / dof * np.linalg.pinv(design.T @ design)

    half = t_quantile(dof) * np.sqrt(np.diag(covariance))
    exponent = lambda i: (float(coefficients[i]), float(coefficients[i] - half[i]), float(coefficients[i] + half[i]))  # noqa: E731
    floor = sum(1 for points in points_by_size.values() for p in points if p.losses and p.critical == min(p.losses))
    return Growth(exponent(1), exponent(2), len(rows), sum(censored for *_, censored in rows), floor)

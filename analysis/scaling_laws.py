"""Scaling-law fits over finished runs, as in Charles et al. 2025 (DiLoCo scaling laws).

Forms, each fitted by least squares:

- `L(N) = A N^alpha`, and `L = A N^alpha M^beta` jointly over model size N and DiLoCo
  replicas M: linear in log space, so ordinary least squares on logs; standard errors
  from the covariance s^2 (X^T X)^-1 of that regression.
- `L(N) = A N^alpha + C`: not linear in any space. The offset C is first located on a
  grid (for each C the rest is a log-space fit), then A, alpha and C are refined together
  by Levenberg-Marquardt on the losses themselves; standard errors from the Jacobian.
- the best inner learning rate and batch as power laws of N: for each N the setting of
  the run with the lowest loss, then `value = a N^b` as above.

Data-parallel runs (no `technique.diloco` section in their config) and each replica count M are
fitted separately, as the paper does; only the joint form mixes values of M.
"""

from dataclasses import dataclass
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.ticker import FuncFormatter

from analysis.runs import Run

# Charles et al. 2025, "Communication-Efficient Language Model Training Scales Reliably and
# Robustly: Scaling Laws for DiLoCo" (arXiv 2503.09799), Table 4: C4 evaluation loss, in nats
# per token, of data-parallel training (key None) and of DiLoCo with M = 1, 2, 4, 8 replicas,
# by nominal model size N (the size in the paper's model names, not an exact parameter count).
# Setup: D = 20 N tokens, sequences of 2048, vocabulary 32,768, AdamW (beta2 0.99), cosine
# decay to 5%; DiLoCo syncs every H = 30 inner steps, outer Nesterov momentum 0.9.
PAPER_TABLE4 = {
    35e6: {None: 3.485, 1: 3.482, 2: 3.508, 4: 3.554, 8: 3.621},
    90e6: {None: 3.167, 1: 3.162, 2: 3.182, 4: 3.213, 8: 3.265},
    180e6: {None: 2.950, 1: 2.943, 2: 2.957, 4: 2.981, 8: 3.019},
    335e6: {None: 2.784, 1: 2.777, 2: 2.788, 4: 2.808, 8: 2.841},
    550e6: {None: 2.653, 1: 2.645, 2: 2.657, 4: 2.673, 8: 2.698},
    1.3e9: {None: 2.460, 1: 2.451, 2: 2.464, 4: 2.472, 8: 2.493},
    2.4e9: {None: 2.326, 1: 2.317, 2: 2.323, 4: 2.332, 8: 2.351},
}
# The paper's own fits of that table, as (A, alpha) of L = A N^alpha per group and (A, alpha,
# beta) of L = A N^alpha M^beta over the DiLoCo columns, keyed by the name `fit_all` gives each.
PAPER_FITS = {
    "L(N) DP": (18.129, -0.0953),
    "L(N) M=1": (18.363, -0.0961),
    "L(N) M=2": (18.768, -0.0969),
    "L(N) M=4": (19.762, -0.0992),
    "L(N) M=8": (21.051, -0.1018),
    "L(N, M)": (19.226, -0.0985, 0.0116),
}
# The paper's 4B and 10B runs, trained beyond Table 4 to test how its laws extrapolate; same
# units, setup and keys as PAPER_TABLE4 (M = 8 is not given at these sizes).
PAPER_EXTRAPOLATION = {
    4e9: {None: 2.224, 1: 2.219, 2: 2.220, 4: 2.230},
    10e9: {None: 2.090, 1: 2.086, 2: 2.086, 4: 2.096},
}
# Hyperparameters whose best value is fitted as a power law of N: printed name, Result field.
HYPERPARAMETERS = (("inner LR", "lr"), ("batch tokens", "batch_tokens"))


@dataclass(frozen=True)
class PowerLaw:
    """y = a * x_1^b_1 * x_2^b_2 ... + offset, with standard errors of its coefficients.

    A standard error is nan where the data only just determine the coefficients (as many
    points as coefficients), so there is nothing left to estimate the noise from.
    """

    variables: tuple[str, ...]
    a: float
    exponents: tuple[float, ...]
    a_se: float
    exponent_ses: tuple[float, ...]
    offset: float = 0.0
    offset_se: float | None = None  # None: the form has no offset

    def predict(self, *values: float | np.ndarray) -> np.ndarray:
        """y at the given values of the variables, in the order of `variables`."""
        terms = [np.asarray(x, dtype=float) ** b for x, b in zip(values, self.exponents, strict=True)]
        return self.a * np.prod(np.broadcast_arrays(*terms), axis=0) + self.offset

    def describe(self, target: str) -> str:
        """The law with each coefficient and its standard error, e.g. `L = 19.2(±0.3) N^-0.0985(±0.001)`."""
        factors = [
            f"{name}^{b:.4g}(±{se:.2g})" for name, b, se in zip(self.variables, self.exponents, self.exponent_ses)
        ]
        law = f"{target} = {self.a:.5g}(±{self.a_se:.2g}) {' '.join(factors)}"
        if self.offset_se is None:
            return law
        return f"{law} {'-' if self.offset < 0 else '+'} {abs(self.offset):.4g}(±{self.offset_se:.2g})"


def _standard_errors(jacobian: np.ndarray, residuals: np.ndarray) -> np.ndarray:
    """Standard errors of least-squares coefficients: sqrt(diag(s^2 (J^T J)^-1))."""
    n, p = jacobian.shape
    if n <= p:
        return np.full(p, np.nan)
    variance = residuals @ residuals / (n - p)
    return np.sqrt(np.diag(variance * np.linalg.pinv(jacobian.T @ jacobian)))


def fit_power_law(variables: dict[str, np.ndarray], y: np.ndarray) -> PowerLaw:
    """y = a * prod(x^b) by least squares on logs: log y = log a + sum b log x."""
    design = np.column_stack([np.ones(len(y)), *(np.log(np.asarray(x, dtype=float)) for x in variables.values())])
    log_y = np.log(np.asarray(y, dtype=float))
    coefficients, *_ = np.linalg.lstsq(design, log_y, rcond=None)
    errors = _standard_errors(design, log_y - design @ coefficients)
    a = float(np.exp(coefficients[0]))
    return PowerLaw(
        variables=tuple(variables),
        a=a,
        exponents=tuple(float(b) for b in coefficients[1:]),
        a_se=a * float(errors[0]),  # delta method: se(a) = a se(log a)
        exponent_ses=tuple(float(e) for e in errors[1:]),
    )


def _offset_model(params: np.ndarray, log_x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """a x^b + c and its Jacobian in (log a, b, c); log a keeps a positive and well scaled."""
    log_a, b, _ = params
    power = np.exp(log_a + b * log_x)
    return power + params[2], np.column_stack([power, power * log_x, np.ones_like(log_x)])


def _levenberg_marquardt(log_x: np.ndarray, y: np.ndarray, start: np.ndarray, iterations: int = 500) -> np.ndarray:
    """Least-squares (log a, b, c) from a starting point, with Marquardt's diagonal damping."""
    params, damping = start, 1e-3
    prediction, jacobian = _offset_model(params, log_x)
    cost = np.sum((prediction - y) ** 2)
    for _ in range(iterations):
        normal = jacobian.T @ jacobian
        step = np.linalg.solve(normal + damping * np.diag(np.diag(normal)), -jacobian.T @ (prediction - y))
        candidate = params + step
        new_prediction, new_jacobian = _offset_model(candidate, log_x)
        new_cost = np.sum((new_prediction - y) ** 2)
        if new_cost < cost:
            converged = cost - new_cost <= 1e-15 * cost
            params, prediction, jacobian, cost, damping = (
                candidate,
                new_prediction,
                new_jacobian,
                new_cost,
                damping / 10,
            )
            if converged:
                break
        elif damping > 1e10:  # no step downhill at any damping: at the minimum
            break
        else:
            damping *= 10
    return params


def _profile_errors(log_x: np.ndarray, y: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Each offset c's squared error of a x^b + c, with (log a, b) fitted on log(y - c): the
    profile that picks the nonlinear fit's start, solved for every offset in one least-squares
    call (bootstrapped fits run it hundreds of times)."""
    design = np.column_stack([np.ones_like(log_x), log_x])
    coefficients, *_ = np.linalg.lstsq(design, np.log(y[None, :] - offsets[:, None]).T, rcond=None)
    predicted = np.exp(coefficients[0][:, None] + coefficients[1][:, None] * log_x[None, :]) + offsets[:, None]
    return np.sum((predicted - y[None, :]) ** 2, axis=1)


def fit_power_law_offset(x: np.ndarray, y: np.ndarray, variable: str = "N", grid: int = 400) -> PowerLaw:
    """y = a x^b + c (c an irreducible loss, 0 <= c < min y), by nonlinear least squares."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if len(np.unique(x)) < 3:
        raise ValueError(
            f"y = a {variable}^b + c needs at least 3 distinct values of {variable}, got {len(np.unique(x))}."
        )

    log_x = np.log(x)
    offsets = np.linspace(0.0, y.min(), grid, endpoint=False)
    best_c = float(offsets[np.argmin(_profile_errors(log_x, y, offsets))])
    law = fit_power_law({variable: x}, y - best_c)
    params = _levenberg_marquardt(log_x, y, np.array([np.log(law.a), law.exponents[0], best_c]))
    prediction, jacobian = _offset_model(params, log_x)
    errors = _standard_errors(jacobian, prediction - y)
    a = float(np.exp(params[0]))
    return PowerLaw(
        variables=(variable,),
        a=a,
        exponents=(float(params[1]),),
        a_se=a * float(errors[0]),
        exponent_ses=(float(errors[1]),),
        offset=float(params[2]),
        offset_se=float(errors[2]),
    )


@dataclass(frozen=True)
class Result:
    """One run's outcome, as the fits see it."""

    n_params: float
    replicas: int | None  # None: data parallel
    loss: float
    lr: float | None = None
    batch_tokens: float | None = None

    @property
    def group(self) -> str:
        return "DP" if self.replicas is None else f"M={self.replicas}"


def parameter_count(model: dict) -> int:
    """Parameters of a run's model config, counted on the meta device (no memory used)."""
    # Imported here: torch takes seconds to import, and fits of tabled losses never need it.
    from lightning_modules.llama import count_parameters
    from lightning_modules.llama_settings import LlamaSettings

    fields = {key: value for key, value in model.items() if key != "_target_"}
    if fields.get("vocab_size") is None:
        raise ValueError("the run's config has no model.vocab_size, so its parameters cannot be counted.")
    return count_parameters(LlamaSettings(**fields))


def result_of(run: Run) -> Result | None:
    """A run's final validation loss, size, replicas and hyperparameters; None without a val/loss."""
    loss = run.final("val/loss")
    if loss is None:
        return None
    batch, seq_len = run.setting("batch.global_batch_size"), run.setting("data.seq_len")
    return Result(
        n_params=parameter_count(run.setting("model")),
        replicas=run.setting("technique.diloco.replicas"),
        loss=loss,
        lr=run.setting("optimizer.lr"),
        batch_tokens=batch * seq_len if batch and seq_len else None,
    )


def results_of(runs: list[Run]) -> tuple[list[Result], list[str]]:
    """The results of the runs that can be fitted, and a note for each run that cannot."""
    results, notes = [], []
    for run in runs:
        try:
            result = result_of(run)
        except ValueError as error:
            notes.append(f"{run.path}: {error}")
            continue
        if result is None:
            notes.append(f"{run.path}: no val/loss logged")
        else:
            results.append(result)
    return results, notes


def paper_results(table: dict[float, dict[int | None, float]] = PAPER_TABLE4) -> list[Result]:
    """Losses tabled as {N: {M: loss}} (no hyperparameters: the paper's tables do not give them)."""
    return [Result(n, m, loss) for n, row in table.items() for m, loss in row.items()]


def relative_differences(law: PowerLaw, published: tuple[float, ...]) -> tuple[float, ...]:
    """law's (A, exponents...) over a published (A, exponents...), minus 1: how far a refit of a
    paper's table lands from the paper's own fit, comparable across coefficients of any size."""
    return tuple(ours / theirs - 1 for ours, theirs in zip((law.a, *law.exponents), published, strict=True))


def best_per_setting(results: list[Result]) -> list[Result]:
    """For each (replicas, N) the result with the lowest loss: the tuned run of that setting."""
    best: dict[tuple[int | None, float], Result] = {}
    for result in results:
        key = (result.replicas, result.n_params)
        if key not in best or result.loss < best[key].loss:
            best[key] = result
    return sorted(best.values(), key=lambda r: (r.replicas or 0, r.n_params))


def _tried(results: list[Result], like: Result, attribute: str) -> list[float]:
    """The values of a hyperparameter tried at the replicas and size of `like`, sorted."""
    same = [r for r in results if (r.replicas, r.n_params) == (like.replicas, like.n_params)]
    return sorted({getattr(r, attribute) for r in same} - {None})


def _groups(results: list[Result]) -> dict[str, list[Result]]:
    groups: dict[str, list[Result]] = {}
    for result in sorted(results, key=lambda r: (r.replicas is not None, r.replicas or 0)):
        groups.setdefault(result.group, []).append(result)
    return groups


def fit_all(results: list[Result], offset: bool = False) -> dict[str, PowerLaw]:
    """Every fit the results support, named as printed: L(N), L(N)+C, inner LR(N), batch(N) per
    group, and the joint L(N, M) over DiLoCo runs. A fit that lacks data (fewer than 2 sizes,
    or sizes where the hyperparameter was swept; 3 sizes for the offset form) is left out."""
    best = best_per_setting(results)
    fits: dict[str, PowerLaw] = {}
    for group, members in _groups(best).items():
        n = np.array([r.n_params for r in members])
        if len(members) >= 2:
            fits[f"L(N) {group}"] = fit_power_law({"N": n}, np.array([r.loss for r in members]))
        if offset and len(members) >= 3:
            fits[f"L(N)+C {group}"] = fit_power_law_offset(n, np.array([r.loss for r in members]))
        for name, attribute in HYPERPARAMETERS:
            # Only sizes where several values were tried say where the best one lies.
            swept = [r for r in members if len(_tried(results, r, attribute)) > 1]
            if len(swept) >= 2:
                values = np.array([getattr(r, attribute) for r in swept])
                fits[f"{name}(N) {group}"] = fit_power_law({"N": np.array([r.n_params for r in swept])}, values)
    diloco = [r for r in best if r.replicas is not None]
    if len({r.n_params for r in diloco}) >= 2 and len({r.replicas for r in diloco}) >= 2:
        n, m = np.array([r.n_params for r in diloco]), np.array([r.replicas for r in diloco], dtype=float)
        fits["L(N, M)"] = fit_power_law({"N": n, "M": m}, np.array([r.loss for r in diloco]))
    return fits


def edge_notes(results: list[Result]) -> list[str]:
    """Best settings that are the smallest or largest value tried at their size.

    The optimum may then lie outside the sweep, and a power law through such values
    describes the sweep's bounds rather than the optimum: widen the sweep there.
    """
    notes = []
    for best in best_per_setting(results):
        for name, attribute in HYPERPARAMETERS:
            tried = _tried(results, best, attribute)
            if len(tried) > 1 and getattr(best, attribute) in (tried[0], tried[-1]):
                notes.append(
                    f"{best.group} N={best.n_params:,.0f}: the best {name}, {getattr(best, attribute):.4g},"
                    f" is at the edge of those tried ({tried[0]:.4g} to {tried[-1]:.4g})"
                )
    return notes


def predictions(fits: dict[str, PowerLaw], n_params: float, replicas: list[int]) -> list[str]:
    """What each fit predicts at a size N (the joint fit: at each M in `replicas`)."""
    lines = []
    for name, law in fits.items():
        if law.variables == ("N",):
            lines.append(f"{name} at N={n_params:.3g}: {float(law.predict(n_params)):.4g}")
        else:
            lines += [f"{name} at N={n_params:.3g}, M={m}: {float(law.predict(n_params, m)):.4g}" for m in replicas]
    return lines


def _plot_panel(
    axis: plt.Axes, best: list[Result], fits: dict[str, PowerLaw], prefix: str, attribute: str, held_out: list[Result]
) -> None:
    """One quantity against N: each group's points, its fitted law, and the joint law at its M.

    Held-out points (hollow, in their group's colour) are not in the fits: the lines reach out
    to them, so the gap shows how well each law extrapolates.
    """
    held_out = [r for r in held_out if getattr(r, attribute) is not None]
    points = best + held_out
    sizes = np.geomspace(min(r.n_params for r in points), max(r.n_params for r in points), 100)
    colors = {group: f"C{index}" for index, group in enumerate(_groups(points))}
    for group, members in _groups(best).items():
        known = [r for r in members if getattr(r, attribute) is not None]
        axis.scatter(
            [r.n_params for r in known], [getattr(r, attribute) for r in known], s=16, color=colors[group], label=group
        )
        lines = [(f"{prefix}(N) {group}", "-"), (f"{prefix}(N)+C {group}", "--")]
        curves = [(fits[name].predict(sizes), style) for name, style in lines if name in fits]
        if attribute == "loss" and "L(N, M)" in fits and members[0].replicas is not None:
            curves.append((fits["L(N, M)"].predict(sizes, members[0].replicas), ":"))
        for values, style in curves:
            axis.plot(sizes, values, color=colors[group], linestyle=style, linewidth=1)
    for group, members in _groups(held_out).items():
        axis.scatter(
            [r.n_params for r in members],
            [getattr(r, attribute) for r in members],
            s=30,
            facecolors="none",
            edgecolors=colors[group],
        )
    # Plain numbers: over a narrow range log ticks otherwise read 3.4 x 10^0.
    plain = FuncFormatter(lambda value, _: f"{value:,.0f}" if value >= 1000 else f"{value:.3g}")
    axis.yaxis.set_major_formatter(plain)
    axis.yaxis.set_minor_formatter(plain)
    axis.legend(fontsize="small")


def plot_fits(
    results: list[Result], fits: dict[str, PowerLaw], path: Path, held_out: list[Result] | None = None
) -> None:
    """Loss against N (points and fitted lines per group), with inner LR and batch if fitted;
    `held_out` results, not fitted, drawn hollow beside the lines' extrapolation."""
    held_out = held_out or []
    panels = [("L", "final validation loss", "loss")] + [
        (name, name, attribute) for name, attribute in HYPERPARAMETERS if any(key.startswith(name) for key in fits)
    ]
    figure, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.5), squeeze=False)
    for axis, (prefix, label, attribute) in zip(axes[0], panels):
        axis.set(xscale="log", yscale="log", xlabel="parameters N", ylabel=label)
        _plot_panel(axis, best_per_setting(results), fits, prefix, attribute, held_out)
    hollow = "; hollow: held out, not fitted" if held_out else ""
    figure.suptitle(
        f"points: best run per size and replicas{hollow}\nlines: A N^alpha (dashed: + C; dotted: A N^alpha M^beta)",
        fontsize="medium",
    )
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)

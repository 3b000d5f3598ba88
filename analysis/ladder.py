"""A scaling ladder read back from its runs: per-method loss fits over model size, a held-out
prediction with its interval, the joint L(N, M) and the best inner LR against N.

The ladder is a study crossed with model sizes (``conf/sweep/scaling_ladder.yaml``): each arm is
a method (data parallelism, DiLoCo M = 1, M = 2), each ``model=...`` a size. A *rung* is one
method at one size: its judging runs' final losses by seed, its size N (parameters of its
model config) and the inner LR its search picked.

**Fits** (``analysis/scaling_laws.py``): per method L(N) = A N^alpha + C where four or more
sizes support an irreducible term (the fitted C lies in (0, the lowest loss)), else
L(N) = A N^alpha; over the DiLoCo methods the joint L(N, M) = A N^alpha M^beta; the best
inner LR as a N^b. **Intervals** come from a bootstrap over seeds: each size's seed losses
are resampled with replacement, the fit repeated, and the 2.5 and 97.5 percentiles of what
it gives taken (400 resamples, a fixed generator seed, so the interval is reproducible).

A prediction names the form it fitted and gives, beside that fit interval, a **prediction
interval** for what the held-out size's runs will measure. It widens the fit interval by what
the bootstrap does not see: the choice of form (both forms where four or more sizes allow the
offset, and every leave-one-size-out refit over the fitted sizes that keeps three: the
envelope of their predictions at N) and the held-out size's own seed noise (its mean over k
judging seeds varies by t * s / sqrt(k), s the seed spread pooled over the fitted sizes). It
is the envelope of the fit interval and the refits, widened on each side by that noise term.

**The prediction** is made from the smaller sizes alone and written to a file before the
largest size's runs are read: ``scripts/ladder.py predict`` refuses a size that is also in
the fit, and never loads a run of the size it predicts. A ladder that holds its largest size
out of the search (``study.held_out``) writes it from the study sweeper itself, once every
other size is judged and before the held-out size trains; that size's searched settings come
from laws in N fitted to the other sizes' winners (``study/setting_laws.py``), recorded with it.
"""

from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import yaml

from analysis.runs import METRICS, Run, load_run
from analysis.scaling_laws import PowerLaw, fit_power_law, fit_power_law_offset, parameter_count
from analysis.student_t import t_quantile
from common.errors import ConfigError, UserError

#: Fewest sizes a fit over N takes (the offset form has three coefficients).
MIN_SIZES = 3
BOOTSTRAP = 400
#: A held-out size's runs' ``study.phase``; the file its prediction is written to.
HELD_OUT, PREDICTION = "held_out", "ladder_prediction.yaml"


@dataclass(frozen=True)
class Rung:
    """One method at one size: judging losses by seed, the size, the inner LR it ran with."""

    method: str
    model: str
    n_params: int
    replicas: int | None  # None: data parallel
    losses: dict[int, float]
    lr: float | None
    #: False for a held-out size, whose LR was extrapolated, not picked by a search.
    searched: bool = True

    @property
    def loss(self) -> float:
        return float(np.mean(list(self.losses.values())))


def rungs(runs: list[Run], metric: str = "val/loss") -> list[Rung]:
    """The judging runs (finished; a study's tuning runs left out), grouped by method and size."""
    grouped: dict[tuple[str, str], list[Run]] = {}
    for run in runs:
        if run.phase == "tune" or run.arm is None or not run.finished or run.final(metric) is None:
            continue
        grouped.setdefault((run.arm, model_name(run)), []).append(run)
    found = []
    for (method, model), members in grouped.items():
        first = members[0]
        losses = {run.seed: run.final(metric) for run in members}
        found.append(
            Rung(
                method,
                model,
                parameter_count(first.setting("model")),
                first.setting("technique.diloco.replicas"),
                losses,
                first.setting("optimizer.lr"),
                first.phase != HELD_OUT,
            )
        )
    return sorted(found, key=lambda r: (r.method, r.n_params))


def model_name(run: Run) -> str:
    """The size's name: the model config's ``name`` (its preset), else its shape."""
    model = run.setting("model") or {}
    return str(model.get("name") or f"{model.get('n_layers')}x{model.get('d_model')}")


def by_method(found: list[Rung]) -> dict[str, list[Rung]]:
    methods: dict[str, list[Rung]] = {}
    for rung in found:
        methods.setdefault(rung.method, []).append(rung)
    return methods


def check_sizes(found: list[Rung], fit_sizes: list[str], predict: str | None = None) -> None:
    """A fit over N needs 3 or more sizes per method; a predicted size may not be among them."""
    if predict is not None and predict in fit_sizes:
        raise ConfigError(f"the prediction for {predict} would be fitted on {predict} itself: leave it out of --sizes.")
    for method, members in by_method(found).items():
        sizes = sorted({r.model for r in members if r.model in fit_sizes})
        if len(sizes) < MIN_SIZES:
            raise ConfigError(
                f"the {method} fit has {len(sizes)} size(s) ({', '.join(sizes) or 'none'}); a fit over N needs at least"
                f" {MIN_SIZES}: run more sizes of the ladder, or name them with --sizes."
            )


def fit_loss(members: list[Rung], losses: list[float] | None = None) -> PowerLaw:
    """L(N) through the rungs' mean losses (or the given ones): with an irreducible term where
    four or more sizes support one, else a plain power law."""
    n = np.array([r.n_params for r in members], dtype=float)
    y = np.array(losses if losses is not None else [r.loss for r in members])
    if len(members) >= 4:
        law = fit_power_law_offset(n, y)
        if 0 < law.offset < y.min():
            return law
    return fit_power_law({"N": n}, y)


def bootstrap(members: list[Rung], at: float, resamples: int = BOOTSTRAP) -> tuple[float, float]:
    """The 95% interval of the fit's value at N = ``at`` over seed resamples."""
    generator = np.random.default_rng(0)
    values = []
    for _ in range(resamples):
        means = [float(np.mean(generator.choice(list(r.losses.values()), size=len(r.losses)))) for r in members]
        values.append(fit_loss(members, means).predict(np.array([at]))[0])
    low, high = np.percentile(values, [2.5, 97.5])
    return float(low), float(high)


@dataclass(frozen=True)
class Prediction:
    """A method's predicted loss at a size left out of its fit: the fit's value, its bootstrap
    interval (``low``, ``high``) and the prediction interval for the size's measured mean."""

    method: str
    model: str
    n_params: int
    predicted: float
    low: float
    high: float
    form: str
    fitted_on: list[str]
    #: The settings the held-out size runs with where the study extrapolated them.
    settings: list[str] = field(default_factory=list)
    #: Each of those settings' law over the searched sizes (``study/setting_laws.py``).
    laws: list[dict] = field(default_factory=list)
    #: The prediction interval: the fit interval, the other forms and leave-one-size-out
    #: refits, and the held-out size's seed noise (None in a prediction recorded before it existed).
    interval_low: float | None = None
    interval_high: float | None = None

    def as_dict(self) -> dict:
        return {
            "method": self.method,
            "model": self.model,
            "n_params": self.n_params,
            "predicted": self.predicted,
            "low": self.low,
            "high": self.high,
            "form": self.form,
            "fitted_on": self.fitted_on,
            "settings": self.settings,
            "laws": self.laws,
            "interval_low": self.interval_low,
            "interval_high": self.interval_high,
        }


def form_of(law: PowerLaw) -> str:
    return "A N^alpha + C" if law.offset_se is not None else "A N^alpha"


def refits(members: list[Rung], at: float) -> list[float]:
    """Predictions at N = ``at`` from the forms and subsets the fit could as well have been:
    the plain power law, the offset form (four or more sizes), each on all the fitted sizes and
    on every subset that leaves one size out and keeps ``MIN_SIZES``."""
    subsets = [members] + [[r for r in members if r is not out] for out in members if len(members) > MIN_SIZES]
    values = []
    for subset in subsets:
        n = np.array([r.n_params for r in subset], dtype=float)
        y = np.array([r.loss for r in subset])
        laws = [fit_power_law({"N": n}, y)]
        if len(subset) >= 4:
            offset = fit_power_law_offset(n, y)
            if 0 < offset.offset < y.min():
                laws.append(offset)
        values += [float(law.predict(np.array([at]))[0]) for law in laws]
    return values


def seed_noise(members: list[Rung], seeds: int) -> float:
    """The 95% half-width of a k-seed mean's noise: t * s / sqrt(k), s pooled over the fitted
    sizes' seeds (t with their pooled degrees of freedom)."""

    squares = sum(float(np.sum((np.array(list(r.losses.values())) - r.loss) ** 2)) for r in members)
    df = sum(len(r.losses) - 1 for r in members)
    if df < 1:
        return 0.0
    return t_quantile(df) * float(np.sqrt(squares / df)) / np.sqrt(seeds)


def predict(
    found: list[Rung], fit_sizes: list[str], model: str, n_params: int, seeds: int | None = None
) -> list[Prediction]:
    """Each method's loss at ``model`` (``n_params``) from its rungs at ``fit_sizes`` alone, its
    prediction interval for a mean over ``seeds`` judging seeds (default: as many as the
    fitted sizes had)."""
    check_sizes(found, fit_sizes, model)
    predictions = []
    for method, members in by_method(found).items():
        members = [r for r in members if r.model in fit_sizes]
        law = fit_loss(members)
        low, high = bootstrap(members, n_params)
        others = refits(members, n_params)
        noise = seed_noise(members, seeds or min(len(r.losses) for r in members))
        predictions.append(
            Prediction(
                method,
                model,
                n_params,
                float(law.predict(np.array([n_params]))[0]),
                low,
                high,
                form_of(law),
                [r.model for r in members],
                interval_low=float(min(low, *others) - noise),
                interval_high=float(max(high, *others) + noise),
            )
        )
    return predictions


def run_models(dirs: list[Path]) -> dict[Path, dict]:
    """Each run folder's model config, read from its config alone (no results)."""
    models = {}
    for folder in dirs:
        for metrics in folder.rglob(str(METRICS)):
            config = yaml.safe_load((metrics.parent / "hparams.yaml").read_text()) or {}
            models[metrics.parent.parent] = config.get("model") or {}
    if not models:
        raise UserError(f"no runs under {', '.join(map(str, dirs))} (train with logger=csv).")
    return models


def write_prediction(
    dirs: list[Path],
    target: str,
    n_params: int,
    fit_sizes: list[str] | None = None,
    settings: dict[str, list[str]] | None = None,
    seeds: int | None = None,
    laws: dict[str, list[dict]] | None = None,
) -> list[Prediction]:
    """Predict every method's loss at ``target`` from the runs of ``fit_sizes`` (default: every
    other size the folders hold) and write it to ``dirs[0]/ladder_prediction.yaml``. Only the
    fitted sizes' runs are loaded: the target's results are never opened."""
    models = run_models(dirs)
    fit_sizes = fit_sizes or sorted({str(m.get("name")) for m in models.values()} - {target})
    found = rungs(
        [
            load_run(folder)
            for folder, model in models.items()
            if model.get("name") in fit_sizes and model.get("name") != target
        ]
    )
    predictions = predict(found, fit_sizes, target, n_params, seeds)  # refuses a fitted target, or too few sizes
    predictions = [
        replace(p, settings=(settings or {}).get(p.method, []), laws=(laws or {}).get(p.method, []))
        for p in predictions
    ]
    (dirs[0] / PREDICTION).write_text(yaml.safe_dump([p.as_dict() for p in predictions], sort_keys=False))
    return predictions


def joint_fit(found: list[Rung]) -> PowerLaw | None:
    """L = A N^alpha M^beta over the DiLoCo rungs (two or more sizes and replica counts)."""
    diloco = [r for r in found if r.replicas is not None]
    if len({r.n_params for r in diloco}) < 2 or len({r.replicas for r in diloco}) < 2:
        return None
    n, m = np.array([r.n_params for r in diloco], float), np.array([r.replicas for r in diloco], float)
    return fit_power_law({"N": n, "M": m}, np.array([r.loss for r in diloco]))


def lr_fit(members: list[Rung]) -> PowerLaw | None:
    """The inner LR each size's search picked, as a N^b (two or more sizes)."""
    tuned = [r for r in members if r.lr and r.searched]
    if len({r.n_params for r in tuned}) < 2:
        return None
    return fit_power_law({"N": np.array([r.n_params for r in tuned], float)}, np.array([r.lr for r in tuned]))

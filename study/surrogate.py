"""A smooth model of a search's losses: where the surface lies, not where one noisy run fell.

A search's best single observation is biased low (the winner's curse): among 44 points each
with 0.01 nats of seed noise, the lowest loss is usually a point that drew lucky noise. The
tuner (``study/tuner.py``) therefore picks its **finalists** by this model's posterior mean
and judges a dimension **bracketed** when the model's loss rises on both sides of the winner.
It is a Gaussian process over the search space, fitted to the results so far:

- each range dimension's grid index scaled to [0, 1] over its span, each list dimension
  one-hot (two values one unit apart);
- a linear mean in those coordinates (least squares), so that along a line the data leave
  falling the model keeps falling instead of reverting to the average of far-off points;
- on what the line leaves, a Matern 5/2 kernel with one length scale, the observation noise
  as a share of the signal's variance; the length scale and the noise are those of a fixed
  grid with the highest marginal likelihood (a grid, not an optimizer, so the fit is the same
  on every machine and thread count);
- a diverged run (``study/joint_search.py``) is seen as the worst trained loss plus one nat.

It is the tuner's own model, apart from the searcher's (Optuna's samplers keep theirs
private), so the same rules hold for every searcher.
"""

import math

import numpy as np

from study.joint_search import diverged
from study.search_space import Choice, Point, SearchSpace

LENGTH_SCALES = (0.1, 0.15, 0.25, 0.4, 0.6, 1.0)
#: Observation noise as a share of the standardized signal's variance.
NOISE_SHARES = (0.01, 0.03, 0.1, 0.3, 1.0)


def _features(space: SearchSpace, point: Point) -> list[float]:
    features = []
    for dimension, index in zip(space.dimensions, point):
        if isinstance(dimension, Choice):
            features += [math.sqrt(0.5) * (index == value) for value in dimension.span]
        else:
            span = dimension.span
            features.append((index - span.start) / max(span.stop - 1 - span.start, 1))
    return features


def _kernel(a: np.ndarray, b: np.ndarray, length: float) -> np.ndarray:
    r = np.sqrt(np.maximum(((a[:, None, :] - b[None, :, :]) ** 2).sum(-1), 0.0)) / length
    return (1 + math.sqrt(5) * r + 5 * r**2 / 3) * np.exp(-math.sqrt(5) * r)


def posterior_mean(space: SearchSpace, results: dict[Point, float], at: list[Point]) -> list[float]:
    """The model's mean loss at each point of ``at``, fitted to ``results`` (point -> loss)."""
    points = sorted(results)
    trained = [results[p] for p in points if not diverged(results[p])]
    worst = max(trained) + 1.0 if trained else 100.0
    y = np.array([worst if diverged(results[p]) else results[p] for p in points])
    x = np.array([_features(space, p) for p in points])
    design = np.hstack([np.ones((len(points), 1)), x])
    trend = np.linalg.solve(design.T @ design + 1e-6 * np.eye(design.shape[1]), design.T @ y)
    residual = y - design @ trend
    scale = float(residual.std()) or 1.0
    z = residual / scale
    best = None
    for length in LENGTH_SCALES:
        for noise in NOISE_SHARES:
            covariance = _kernel(x, x, length) + noise * np.eye(len(points))
            factor = np.linalg.cholesky(covariance)
            alpha = np.linalg.solve(factor.T, np.linalg.solve(factor, z))
            evidence = -0.5 * z @ alpha - np.log(np.diag(factor)).sum()
            if best is None or evidence > best[0] + 1e-12:
                best = (evidence, length, alpha)
    _, length, alpha = best
    query = np.array([_features(space, p) for p in at])
    return list(np.hstack([np.ones((len(at), 1)), query]) @ trend + scale * (_kernel(query, x, length) @ alpha))

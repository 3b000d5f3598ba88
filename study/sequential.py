"""Judging seeds added in rounds without inflating errors: each test's level spent over the looks.

A study that adds judging seeds while a claim is unresolved (``study.seeds: {first: [2, 3, 4],
max: 8}``) looks at its data more than once, and judging every look at the full level lets a
claim that is false pass more often than the level says: each look is another chance. A
group-sequential design spends the level over the looks instead (Lan & DeMets 1983, "Discrete
sequential boundaries for clinical trials", Biometrika 70): a spending function alpha(t) is
the chance, with no effect, that a one-sided test has passed by the information fraction
t = seeds / max seeds, and look k's boundary is set so that first passing at look k has
chance alpha(t_k) - alpha(t_{k-1}). Only the fractions of the looks so far enter, so the
looks need not be planned: the plan adds as many seeds as a claim seems to need.

``study.seeds.error_control`` picks the spending function:

- ``obrien_fleming`` (the default): alpha(t) = 2 - 2 Phi(z(1 - alpha/2) / sqrt(t)), strict at
  the early looks and close to the full level at the last one;
- ``pocock``: alpha(t) = alpha ln(1 + (e - 1) t), spread about evenly over the looks.

The boundaries are computed for the z statistic, a Brownian motion observed at the looks'
fractions (the chance of not having passed is integrated on a grid, look by look), and
applied to each look's t statistic at the same nominal level, the "significance level
approach" (Jennison & Turnbull 2000, "Group Sequential Methods", section 3.3), which keeps
small-sample error rates close to nominal; ``tests/test_sequential.py`` checks the rate by
simulation. A look at the cap (t = 1) spends what is left; a study that stops early has
spent less than its level.
"""

import math
from functools import lru_cache

import numpy as np
from scipy import optimize, stats

SPENDING = ("obrien_fleming", "pocock")
DEFAULT_SPENDING = "obrien_fleming"
#: Grid points per unit of the Brownian motion's scale (the integration's resolution).
GRID_PER_UNIT = 100
#: How far below the boundary the grid reaches, in units of the motion's standard deviation.
GRID_DEPTH = 9.0


def spent(alpha: float, fraction: float, spending: str) -> float:
    """The level spent by information fraction ``fraction`` (0 < fraction <= 1)."""
    t = min(max(fraction, 0.0), 1.0)
    if t == 0:
        return 0.0
    if spending == "pocock":
        return alpha * math.log(1 + (math.e - 1) * t)
    return float(2 - 2 * stats.norm.cdf(stats.norm.ppf(1 - alpha / 2) / math.sqrt(t)))


@lru_cache(maxsize=256)
def nominal_levels(alpha: float, fractions: tuple[float, ...], spending: str = DEFAULT_SPENDING) -> tuple[float, ...]:
    """Each look's nominal one-sided level for a test of overall level ``alpha``, the looks at
    these increasing information fractions."""
    levels, density, grid = [], None, None
    previous_t, previous_spent = 0.0, 0.0
    for t in fractions:
        t = min(t, 1.0)
        increment = spent(alpha, t, spending) - previous_spent
        if density is None:  # the first look: W(t) ~ N(0, t)
            boundary = math.sqrt(t) * stats.norm.ppf(1 - increment) if increment > 0 else math.inf
            grid = _grid(boundary, t)
            density = stats.norm.pdf(grid, scale=math.sqrt(t))
        else:
            step = t - previous_t
            weights = density * _trapezoid(grid)
            boundary = _boundary(grid, weights, step, increment) if increment > 0 and step > 0 else math.inf
            new_grid = _grid(boundary, t)
            density = (
                stats.norm.pdf(new_grid[:, None] - grid[None, :], scale=math.sqrt(step)) @ weights
                if step > 0
                else density
            )
            grid = new_grid if step > 0 else grid
        levels.append(float(1 - stats.norm.cdf(boundary / math.sqrt(t))) if math.isfinite(boundary) else 0.0)
        previous_t, previous_spent = max(previous_t, t), previous_spent + max(increment, 0.0)
    return tuple(levels)


def _grid(boundary: float, t: float) -> np.ndarray:
    """Points from far below to the boundary (the region where the test has not passed yet)."""
    scale = math.sqrt(t)
    top = boundary if math.isfinite(boundary) else GRID_DEPTH * scale
    count = int((top + GRID_DEPTH * scale) * GRID_PER_UNIT / scale) + 1
    return np.linspace(-GRID_DEPTH * scale, top, max(count, 3))


def _trapezoid(grid: np.ndarray) -> np.ndarray:
    weights = np.full(len(grid), grid[1] - grid[0])
    weights[[0, -1]] /= 2
    return weights


def _boundary(grid: np.ndarray, weights: np.ndarray, step: float, increment: float) -> float:
    """The boundary whose first crossing at this look has chance ``increment``."""

    def crossing(b: float) -> float:
        return float(np.sum(weights * stats.norm.sf((b - grid) / math.sqrt(step)))) - increment

    low, high = grid[0], grid[-1] + 12 * math.sqrt(step)
    if crossing(low) < 0:  # what is left to spend is more than any boundary can use
        return low
    return float(optimize.brentq(crossing, low, high, xtol=1e-10))

"""A held-out size's searched settings, each from a law in N fitted to the other sizes' winners.

Charles et al. (2025) set a large DiLoCo run's hyperparameters from small ones: each setting's
best value, found per size, follows a power law in the parameter count N. A ladder with
``study.held_out`` does the same for every setting its arms search:

- a **range** (inner LR, outer LR, H): the winners fitted as ``a N^b`` by least squares on
  logs, with a 95% interval on ``b`` (Student's t, sizes - 2 degrees of freedom). Where that
  interval holds 0 the sizes do not show the setting moving with N, and the law is a
  **constant**: the winners' geometric mean (the same fit with ``b`` fixed at 0). Either value
  is kept within the range's hard limits, to 3 significant digits (whole for an integer).
  A winner at one of those limits is the search space's edge, not a measured optimum (the
  loss may fall further beyond it), so the law names the sizes where that happened;
- a **list** (the outer optimizer) has no power law: the value most sizes' winners chose, a
  tie going to the largest size's choice among the tied ones.

The winners are grid points, so an exponent fitted over a few sizes moves in steps; the
interval is what says whether it moved at all.
"""

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from analysis.runs import Run
from analysis.scaling_laws import fit_power_law, parameter_count
from analysis.student_t import t_quantile
from common.errors import ConfigError
from study.search_space import Choice, Point, Range, SearchSpace, format_value

if TYPE_CHECKING:
    from study.preset import StudySpec

#: Fewest searched sizes a law takes (a slope and its spread need sizes - 2 >= 1).
MIN_SIZES = 3
POWER_LAW, CONSTANT, MAJORITY = "power law", "constant", "most sizes' winner"


@dataclass(frozen=True)
class SettingLaw:
    """One searched setting's law over the searched sizes and its value at the held-out size."""

    key: str
    form: str  # POWER_LAW | CONSTANT | MAJORITY
    #: Each searched size's parameter count and winning value (as the override writes it).
    winners: tuple[tuple[int, str], ...]
    value: str
    #: What the held-out size's jobs are given (a list's value may set several keys).
    overrides: tuple[str, ...]
    #: ``a N^b``'s coefficients and b's 95% interval (a range only; a constant keeps the fit's b).
    a: float | None = None
    exponent: float | None = None
    exponent_interval: tuple[float, float] | None = None
    #: The sizes whose winner sits at a hard limit of the range: there the law fits the edge.
    at_limit: tuple[int, ...] = ()

    def describe(self) -> str:
        """One line: the law and its value, e.g. ``optimizer.lr = 0.41 N^-0.42 [-0.61, -0.23]: 1.7e-3``."""
        if self.form == MAJORITY:
            return f"{self.key}: {self.form}, {self.value}"
        low, high = self.exponent_interval
        fitted = f"b = {self.exponent:.3g} [{low:.3g}, {high:.3g}]"
        if len({value for _, value in self.winners}) == 1:
            line = f"{self.key}: constant (every size's winner), {self.value}"
        elif self.form == CONSTANT:
            line = f"{self.key}: constant (the exponent's interval holds 0: {fitted}), {self.value}"
        else:
            line = f"{self.key} = {self.a:.3g} N^{self.exponent:.3g} ({fitted}): {self.value}"
        if self.at_limit:
            line += (
                f"; {len(self.at_limit)} of {len(self.winners)} sizes' winners at the range's hard limit"
                " (the space's edge, not a measured optimum)"
            )
        return line

    def as_dict(self) -> dict:
        found = {"key": self.key, "form": self.form, "value": self.value}
        found["winners"] = [{"n_params": n, "value": v} for n, v in self.winners]
        if self.exponent is not None:
            found |= {"a": self.a, "exponent": self.exponent, "exponent_interval": list(self.exponent_interval)}
            found["winners_at_limit"] = list(self.at_limit)
        return found


def setting_laws(space: SearchSpace, winners: list[tuple[int, Point]], n_params: int) -> list[SettingLaw]:
    """Every searched setting's law over the searched sizes' winners (their parameter counts
    and points) and its value at ``n_params``."""
    sizes = sorted({n for n, _ in winners})
    if len(sizes) < MIN_SIZES:
        raise ConfigError(
            f"study.held_out: {len(sizes)} searched size(s); extrapolating a setting needs at least {MIN_SIZES}."
        )
    ordered = sorted(winners, key=lambda pair: pair[0])
    laws = []
    for axis, dimension in enumerate(space.dimensions):
        labels = tuple((n, dimension.label(point[axis])) for n, point in ordered)
        if isinstance(dimension, Choice):
            index = _majority([p[axis] for _, p in ordered])
            laws.append(
                SettingLaw(dimension.key, MAJORITY, labels, dimension.label(index), tuple(dimension.overrides(index)))
            )
        else:
            laws.append(_range_law(dimension, ordered, axis, labels, n_params))
    return laws


def _majority(chosen: list[int]) -> int:
    """The choice most sizes won with; of tied ones, the largest size's (``chosen`` by size)."""
    top = max(chosen.count(index) for index in chosen)
    return next(index for index in reversed(chosen) if chosen.count(index) == top)


def _range_law(
    dimension: Range, winners: list[tuple[int, Point]], axis: int, labels: tuple, n_params: int
) -> SettingLaw:
    n = np.array([size for size, _ in winners], dtype=float)
    values = np.array([dimension.value(point[axis]) for _, point in winners], dtype=float)
    law = fit_power_law({"N": n}, values)
    b, se = law.exponents[0], law.exponent_ses[0]
    half = t_quantile(len(n) - 2) * se if math.isfinite(se) else math.inf
    interval = (b - half, b + half)
    if len(set(values)) == 1 or interval[0] <= 0.0 <= interval[1]:  # one value: b is 0 but for rounding
        form, value = CONSTANT, float(np.exp(np.mean(np.log(values))))
    else:
        form, value = POWER_LAW, float(law.predict(np.array([float(n_params)]))[0])
    low = -math.inf if dimension.min is None else dimension.min
    high = math.inf if dimension.max is None else dimension.max
    value = min(max(value, low), high)
    written = format_value(round(value) if dimension.integer else float(f"{value:.3g}"))
    at_limit = tuple(size for size, point in winners if any(dimension.at_hard_limit(point[axis], d) for d in (-1, 1)))
    override = (f"{dimension.key}={written}",)
    return SettingLaw(dimension.key, form, labels, written, override, law.a, b, interval, at_limit)


def searched_winners(runs: list[Run], spec: "StudySpec") -> dict[str, list[tuple[int, Point]]]:
    """Per searched method, each searched size's winner: its parameter count and its point,
    read from a judging run's overrides (the held-out size's settings are off the grids)."""
    found: dict[str, dict[int, Point]] = {}
    for run in runs:
        space = spec.spaces.get(run.arm) if run.arm else None
        if space is None or not space.dimensions or run.phase != "judge":
            continue
        point = space.point_of(run.overrides)
        if point is not None:
            found.setdefault(run.arm, {})[parameter_count(run.setting("model"))] = point
    return {arm: sorted(winners.items()) for arm, winners in found.items()}

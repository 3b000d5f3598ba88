"""Search spaces of a tuned study: the settings an arm is tuned over, each on a grid.

A study preset declares them under ``study.search`` (every arm's) and per arm
(``study.arms.NAME.search``, which adds to or replaces the shared ones)::

    search:
      optimizer.lr: {low: 2e-3, high: 8e-3, scale: log, step: 2, min: 2.5e-4, max: 3.2e-2}
      technique.diloco.sync_every: {low: 10, high: 90, scale: log, step: 3, min: 1}
      technique.diloco.outer_optimizer:           # a list: each value as it is, never extended
        - {momentum: 0.0, nesterov: false}
        - {momentum: 0.9, nesterov: true}

A **range** is a numeric grid: ``low * step**k`` (``scale: log``) or ``low + k * step``
(``scale: linear``). ``low`` and ``high`` bound the first grid the tuner tries; the tuner may
extend it one step at a time beyond either end (``study/tuner.py``), never past the hard
limits ``min`` and ``max`` (optional): a step that would cross a limit lands on the limit.
Integer ``low`` and ``step`` give an integer grid (rounded, e.g. H = 10, 30, 90 and 3, 1).

A **list** holds the values to try, in order: numbers, booleans, strings, or mappings of
sub-keys to values, which set several keys at once (``{momentum: 0.0, nesterov: false}``
sets ``...outer_optimizer.momentum`` and ``...outer_optimizer.nesterov``), for settings that
only make sense together (PyTorch refuses Nesterov without momentum).

A point of the space is a tuple of grid indices, one per dimension: ``k`` for a range (0 is
``low``), the position in a list. The overrides of a point are what a job runs with.
"""

from dataclasses import dataclass
from typing import Any

from common.errors import ConfigError

SCALES = ("log", "linear")
#: The most grid steps a range may extend beyond its first grid on either side (a guard
#: against a dimension without limits whose loss keeps falling).
MAX_EXTENSION = 16
#: How far a joint search (``study/joint_search.py``) reaches past the first grid on a side
#: without a hard limit: it proposes from a fixed span, not by extending step by step.
SEARCH_MARGIN = 2


def format_value(value: Any) -> str:
    """A value as an override writes it (6 significant digits for floats, so a grid value
    such as ``0.1 * 3`` reads as 0.3), the same string for the tuner and the run."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return format(value, ".6g")
    return str(value)


@dataclass(frozen=True)
class Range:
    """A numeric grid around [low, high], extendable up to the hard limits."""

    key: str
    low: float
    high: float
    scale: str = "log"
    step: float = 2.0
    min: float | None = None
    max: float | None = None

    @property
    def integer(self) -> bool:
        return all(isinstance(v, int) and not isinstance(v, bool) for v in (self.low, self.step))

    @property
    def first_grid(self) -> range:
        """The indices of the first grid: ``low`` (0) up to the last value not above ``high``."""
        top = 0
        while self._raw(top + 1) <= self.high * (1 + 1e-9):
            top += 1
        return range(0, top + 1)

    def _raw(self, index: int) -> float:
        return self.low * self.step**index if self.scale == "log" else self.low + index * self.step

    def value(self, index: int) -> float | int:
        """The grid value at ``index``, clamped to the hard limits."""
        raw = self._raw(index)
        if self.min is not None:
            raw = max(raw, self.min)
        if self.max is not None:
            raw = min(raw, self.max)
        if self.integer:
            return int(round(raw))
        return float(format_value(float(raw)))

    def neighbour(self, index: int, direction: int) -> int | None:
        """The next index in ``direction`` (+1 / -1) whose value differs, None at a hard limit
        (or past ``MAX_EXTENSION`` steps beyond the first grid)."""
        here = self.value(index)
        nxt = index + direction
        grid = self.first_grid
        if nxt < grid.start - MAX_EXTENSION or nxt > grid.stop - 1 + MAX_EXTENSION:
            return None
        if self.value(nxt) == here:  # clamped onto the limit (or rounded onto the same integer)
            return None
        return nxt

    def at_hard_limit(self, index: int, direction: int) -> bool:
        """Whether a hard limit (not the extension guard) stops the grid at ``index`` in
        ``direction``: the next value is clamped onto this one."""
        return (
            self.value(index + direction) == self.value(index) and (self.min if direction < 0 else self.max) is not None
        )

    @property
    def span(self) -> range:
        """The indices a joint search proposes from: out to the hard limits, or ``SEARCH_MARGIN``
        steps past the first grid on a side without one."""
        grid = self.first_grid
        ends = []
        for direction, start, limit in ((-1, grid.start, self.min), (1, grid.stop - 1, self.max)):
            index = start
            while (nxt := self.neighbour(index, direction)) is not None and (
                limit is not None or abs(nxt - start) <= SEARCH_MARGIN
            ):
                index = nxt
            ends.append(index)
        return range(ends[0], ends[1] + 1)

    def index_of(self, text: str) -> int | None:
        """The grid index whose value an override wrote as ``text`` (None if off the grid); of
        the indices clamped onto a limit, the one nearest the first grid (the tuner's)."""
        grid = self.first_grid
        below = range(grid.start - 1, grid.start - MAX_EXTENSION - 1, -1)
        above = range(grid.stop, grid.stop + MAX_EXTENSION)
        for index in (*grid, *above, *below):
            if format_value(self.value(index)) == text:
                return index
        return None

    def overrides(self, index: int) -> list[str]:
        return [f"{self.key}={format_value(self.value(index))}"]

    def label(self, index: int) -> str:
        return format_value(self.value(index))


@dataclass(frozen=True)
class Choice:
    """A list of values (or of mappings that set several sub-keys), tried as given."""

    key: str
    values: tuple[Any, ...]

    @property
    def first_grid(self) -> range:
        return range(len(self.values))

    span = first_grid

    def overrides(self, index: int) -> list[str]:
        value = self.values[index]
        if isinstance(value, dict):
            return [f"{self.key}.{sub}={format_value(v)}" for sub, v in value.items()]
        return [f"{self.key}={format_value(value)}"]

    def label(self, index: int) -> str:
        value = self.values[index]
        if isinstance(value, dict):
            return ",".join(f"{sub}={format_value(v)}" for sub, v in value.items())
        return format_value(value)

    @property
    def keys(self) -> list[str]:
        """Every setting this dimension writes."""
        return sorted({o.split("=", 1)[0] for index in self.first_grid for o in self.overrides(index)})


Dimension = Range | Choice
Point = tuple[int, ...]


@dataclass(frozen=True)
class SearchSpace:
    """An arm's dimensions, in the order the preset gives them."""

    dimensions: tuple[Dimension, ...]

    def centre(self) -> Point:
        """The middle of each dimension's first grid (the lower middle for an even count)."""
        return tuple(d.first_grid[(len(d.first_grid) - 1) // 2] for d in self.dimensions)

    def overrides(self, point: Point) -> list[str]:
        return [o for d, index in zip(self.dimensions, point) for o in d.overrides(index)]

    def labels(self, point: Point) -> dict[str, str]:
        return {d.key: d.label(index) for d, index in zip(self.dimensions, point)}

    def point_of(self, overrides: list[str]) -> Point | None:
        """The point a run's overrides came from, or None if they are off this space's grids."""
        given = set(overrides)
        point = []
        for dimension in self.dimensions:
            if isinstance(dimension, Range):
                texts = [o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0] == dimension.key]
                index = dimension.index_of(texts[-1]) if texts else None
            else:
                index = next((i for i in dimension.first_grid if set(dimension.overrides(i)) <= given), None)
            if index is None:
                return None
            point.append(index)
        return tuple(point)

    @property
    def keys(self) -> list[str]:
        return [k for d in self.dimensions for k in (d.keys if isinstance(d, Choice) else [d.key])]


def parse_search(node: Any, where: str) -> dict[str, Dimension]:
    """Check and convert a ``search`` block (key -> range mapping or list); mistakes name the
    key and the fix."""
    if node is None:
        return {}
    if not isinstance(node, dict):
        raise ConfigError(f"{where} must map settings to a range {{low, high, ...}} or a list of values, got {node!r}.")
    return {key: _dimension(key, spec, f"{where}.{key}") for key, spec in node.items()}


def _dimension(key: str, spec: Any, where: str) -> Dimension:
    if isinstance(spec, list):
        if not spec:
            raise ConfigError(f"{where} is an empty list: give the values to try, e.g. [0.0, 0.5, 0.9].")
        return Choice(key, tuple(spec))
    if not isinstance(spec, dict) or not {"low", "high"} <= set(spec):
        raise ConfigError(f"{where} needs low and high (and scale, step, min, max), or a list of values; got {spec!r}.")
    unknown = set(spec) - {"low", "high", "scale", "step", "min", "max"}
    if unknown:
        raise ConfigError(f"{where}: unknown fields {sorted(unknown)}; a range takes low, high, scale, step, min, max.")
    scale, step = spec.get("scale", "log"), spec.get("step", 2)
    numbers = {name: spec.get(name) for name in ("low", "high", "step", "min", "max")} | {"step": step}
    for name, value in numbers.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise ConfigError(f"{where}.{name} must be a number, got {value!r}.")
    low, high, lower, upper = spec["low"], spec["high"], spec.get("min"), spec.get("max")
    if scale not in SCALES:
        raise ConfigError(f"{where}.scale={scale!r} must be one of {SCALES}.")
    if high < low:
        raise ConfigError(f"{where}: the range is inverted (low {low} > high {high}); swap them.")
    if (scale == "log" and (step <= 1 or low <= 0)) or (scale == "linear" and step <= 0):
        raise ConfigError(
            f"{where}: a log grid needs low > 0 and step > 1, a linear one step > 0; got low {low}, step {step}."
        )
    if lower is not None and upper is not None and upper < lower:
        raise ConfigError(f"{where}: the hard limits are inverted (min {lower} > max {upper}); swap them.")
    for name, value in (("low", low), ("high", high)):
        if (lower is not None and value < lower) or (upper is not None and value > upper):
            raise ConfigError(
                f"{where}.{name}={value} lies outside the hard limits [{lower}, {upper}]; move it inside or widen the limits."
            )
    if scale == "log" and lower is not None and lower <= 0:
        raise ConfigError(f"{where}.min={lower} must be > 0 on a log grid.")
    return Range(key, low, high, scale, step, lower, upper)


def describe(dimension: Dimension) -> str:
    """One line for docs and reports: the first grid and the limits."""
    if isinstance(dimension, Choice):
        return f"{dimension.key} in [{', '.join(dimension.label(i) for i in dimension.first_grid)}]"
    values = ", ".join(dimension.label(i) for i in dimension.first_grid)
    limits = f", limits [{dimension.min if dimension.min is not None else '-inf'}, {dimension.max if dimension.max is not None else 'inf'}]"
    return f"{dimension.key} in [{values}] ({dimension.scale} x{dimension.step}{limits})"


def parse_anchors(node: Any, space: SearchSpace, where: str) -> tuple[Point, ...]:
    """Check and convert an arm's ``anchors``: points named by their settings (a searched key
    to a grid value, or to one of a list's values), the space's centre where a key is not
    named. Mistakes name the anchor, the key and the fix."""
    if node is None:
        return ()
    if not isinstance(node, list) or not all(isinstance(a, dict) and a for a in node):
        raise ConfigError(
            f"{where} must be a list of points, each mapping searched keys to values, e.g. [{{optimizer.lr: 2e-3}}]."
        )
    return tuple(dict.fromkeys(_anchor(anchor, space, f"{where}[{i}]") for i, anchor in enumerate(node)))


def _anchor(settings: dict[str, Any], space: SearchSpace, where: str) -> Point:
    by_key = {d.key: d for d in space.dimensions}
    unknown = sorted(set(settings) - set(by_key))
    if unknown:
        raise ConfigError(
            f"{where} names {unknown}, which the arm does not search (it searches {sorted(by_key)}): drop it or search it."
        )
    point = list(space.centre())
    for axis, dimension in enumerate(space.dimensions):
        if dimension.key not in settings:
            continue
        value = settings[dimension.key]
        if isinstance(dimension, Choice):
            index = next((i for i, v in enumerate(dimension.values) if v == value), None)
            options = ", ".join(dimension.label(i) for i in dimension.first_grid)
            fix = f"use one of the listed values ({options})"
        else:
            index = (
                dimension.index_of(format_value(value))
                if isinstance(value, int | float) and not isinstance(value, bool)
                else None
            )
            if index is not None and index not in dimension.span:
                index = None
            fix = f"use a grid value within the search's span ({', '.join(dimension.label(i) for i in dimension.span)})"
        if index is None:
            raise ConfigError(f"{where}: {dimension.key}={value!r} is not a point of the search space; {fix}.")
        point[axis] = index
    return tuple(point)

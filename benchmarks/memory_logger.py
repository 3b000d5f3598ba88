"""A Lightning logger that keeps every row in memory: what a run's loggers receive, step by step."""

from typing import Any

from lightning.pytorch.loggers import Logger


class MemoryLogger(Logger):
    """Rows of (step, metrics), in the order they were logged."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[tuple[int | None, dict[str, float]]] = []

    @property
    def name(self) -> str:
        return "memory"

    @property
    def version(self) -> str:
        return "0"

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.rows.append((step, dict(metrics)))

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        """Hyper-parameters are not kept: the config is at hand wherever this logger is used."""

    def series(self, key: str) -> dict[int, float]:
        """The logged values of one metric by step."""
        return {step: row[key] for step, row in self.rows if key in row}

    def last(self, key: str) -> float | None:
        values = [row[key] for _, row in self.rows if key in row]
        return values[-1] if values else None

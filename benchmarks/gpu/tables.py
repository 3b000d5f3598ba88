"""A section's result table: raw values per row (the JSON), formatted by column (the markdown)."""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class Column:
    key: str
    header: str
    format: Callable[[Any], str] = str


@dataclass
class Table:
    """One section's results: raw values per row (the JSON), formatted by column (the markdown)."""

    section: str
    columns: list[Column]
    rows: list[dict[str, Any]]

    def markdown(self) -> str:
        lines = [f"## {self.section}", "", "| " + " | ".join(c.header for c in self.columns) + " |"]
        lines.append("|" + "---|" * len(self.columns))
        for row in self.rows:
            cells = ["-" if row.get(c.key) is None else c.format(row[c.key]) for c in self.columns]
            lines.append("| " + " | ".join(cells) + " |")
        return "\n".join(lines)


def rate(value: float) -> str:
    return f"{value:,.0f}"


def percent(value: float) -> str:
    return f"{value:.1%}"


def decimals(value: float) -> str:
    return f"{value:.3f}"


def scientific(value: float) -> str:
    return f"{value:.2e}"


TOKENS, MFU = Column("tokens_per_sec", "tokens/s", rate), Column("mfu", "MFU", percent)
PEAK, STATUS = Column("peak_memory_gb", "peak GB", lambda v: f"{v:.1f}"), Column("status", "status")


def lever_columns(ratio: str, *measures: Column) -> list[Column]:
    """A table of levers: each row's layout, tokens/s, their ratio against the reference row
    (``ratio`` heads it), MFU, ``measures``, peak memory and how the run ended."""
    return [Column("variant", "layout"), TOKENS, Column("ratio", ratio, decimals), MFU, *measures, PEAK, STATUS]


def loss_columns(*measures: Column) -> list[Column]:
    """A loss comparison's columns: what is checked, on which model, over how many steps, the
    largest per-step difference, ``measures`` (the tolerance among them), the verdict."""
    steps, largest = Column("steps", "steps compared"), Column("max_abs_diff", "max abs diff", scientific)
    return [Column("check", "check"), Column("model", "model"), steps, largest, *measures, Column("result", "result")]


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """Each measured row's tokens/s as a ratio against the first row that measured any."""
    measured = [row for row in rows if row.get("tokens_per_sec") is not None]
    for row in measured:
        row["ratio"] = row["tokens_per_sec"] / measured[0]["tokens_per_sec"]


def mark_best(rows: list[dict[str, Any]], first: int) -> None:
    """Mark the fastest finished row of each model from row ``first`` on (a search's rows)."""
    for model in dict.fromkeys(row["model"] for row in rows[first:]):
        finished = [row for row in rows[first:] if row["model"] == model and row["tokens_per_sec"] is not None]
        if finished:
            best = max(finished, key=lambda row: row["tokens_per_sec"])
            best["status"] += " (best)"

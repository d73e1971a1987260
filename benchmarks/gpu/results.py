"""Tables, phase outcomes and the files a run writes (CSV and markdown).

A run writes at most 8 files, the most the device tool brings back from its output folder:
``summary.md`` (everything, for people), ``phases.csv`` and one CSV per table (see
:data:`FILES`).
"""

from __future__ import annotations

import csv
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "COLUMNS",
    "EventCounter",
    "PhaseOutcome",
    "Table",
    "format_value",
    "write_csv",
]

COLUMNS: dict[str, tuple[str, ...]] = {
    "phases": ("phase", "status", "seconds", "detail"),
    "environment": ("key", "value"),
    "telemetry_cost": ("source", "state", "calls", "median_us", "p99_us", "mean_us"),
    "telemetry_readings": (
        "state",
        "readings",
        "span_s",
        "gpu_util_mean_pct",
        "gpu_util_max_pct",
        "mem_util_mean_pct",
        "sm_util_mean_pct",
        "sm_util_max_pct",
        "sm_occupancy_mean_pct",
        "tensor_util_mean_pct",
        "tensor_util_max_pct",
        "free_min_gib",
        "power_mean_w",
        "energy_counter_j",
        "power_integral_j",
        "energy_ratio",
        "in_range",
    ),
    "serving": (
        "rate_rps",
        "config",
        "executor",
        "warmed",
        "arrivals",
        "completed",
        "failed",
        "rejected",
        "expired",
        "lost",
        "throughput_rps",
        "p50_ms",
        "p99_ms",
        "max_ms",
        "arrival_lag_p99_ms",
        "mean_batch",
        "batches",
        "oom_errors",
        "device_busy_s",
        "device_ms_per_request",
        "gpu_busy_s",
        "sm_active_s",
        "energy_j",
        "j_per_request",
        "mean_power_w",
        "window_ms_end",
        "cap_end",
        "decisions",
        "warmup_s",
        "error",
    ),
    "squeeze": (
        "t_s",
        "stage",
        "cap",
        "window_ms",
        "queue_depth",
        "free_gib",
        "submitted",
        "completed",
        "failed",
        "rejected",
        "expired",
        "lost",
        "oom_errors",
        "memory_guard_events",
    ),
    "llm_steps": (
        "impl",
        "batch",
        "ctx",
        "prefill_ms",
        "prefill_tokens_per_s",
        "decode_ms",
        "decode_tokens_per_s",
        "peak_mib",
        "status",
    ),
}
"""Each table's columns, in order; the CSV of table ``name`` is ``<name>.csv``."""


@dataclass
class Table:
    """Rows of one result table; every row has exactly the table's columns."""

    name: str
    rows: list[dict[str, Any]] = field(default_factory=list)

    @property
    def columns(self) -> tuple[str, ...]:
        return COLUMNS[self.name]

    def add(self, **values: Any) -> None:
        """Append a row; a missing column is empty, an unknown one is a KeyError."""
        unknown = set(values) - set(self.columns)
        if unknown:
            raise KeyError(f"{self.name}: unknown columns {sorted(unknown)}")
        self.rows.append({column: values.get(column, "") for column in self.columns})

    def markdown(self) -> list[str]:
        """The table as markdown lines."""
        lines = [
            "| " + " | ".join(self.columns) + " |",
            "|" + "---|" * len(self.columns),
        ]
        for row in self.rows:
            cells = (format_value(row[c]).replace("|", "/") for c in self.columns)
            lines.append("| " + " | ".join(cells) + " |")
        return lines


@dataclass
class PhaseOutcome:
    """How one phase ended: ``ok``, ``failed`` (with its traceback) or ``skipped``."""

    phase: str
    status: str = "ok"
    seconds: float = 0.0
    detail: str = ""
    traceback: str = ""
    tables: list[Table] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


class EventCounter:
    """A structlog processor that counts the library's events by (level, name) and drops them,
    keeping the first few of each name for the summary."""

    KEEP = 3

    def __init__(self) -> None:
        self.counts: Counter[tuple[str, str]] = Counter()
        self.examples: list[dict[str, Any]] = []

    def __call__(self, _: Any, method_name: str, event_dict: Any) -> Any:
        import structlog

        key = (method_name, str(event_dict.get("event")))
        self.counts[key] += 1
        if self.counts[key] <= self.KEEP:
            self.examples.append({"level": method_name, **dict(event_dict)})
        raise structlog.DropEvent

    def count(self, name: str) -> int:
        """Events called ``name``, any level."""
        return sum(n for (_, event), n in self.counts.items() if event == name)


def format_value(value: Any, digits: int = 4) -> str:
    """A cell as text: floats to ``digits`` significant digits (NaN as empty), the rest as
    ``str``."""
    if isinstance(value, float) and not isinstance(value, bool):
        return "" if math.isnan(value) else f"{value:.{digits}g}"
    return str(value)


def write_csv(path: Path, columns: Sequence[str], rows: Iterable[dict[str, Any]]) -> None:
    """Write ``rows`` (dicts over ``columns``) as CSV with a header."""
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(columns)
        for row in rows:
            writer.writerow([format_value(row.get(column, ""), 7) for column in columns])

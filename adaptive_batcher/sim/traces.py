"""Request traces as :class:`~adaptive_batcher.sim.workloads.Arrivals`.

A trace is a CSV file with a header row, or a JSON Lines file (``.jsonl`` / ``.ndjson``: one
JSON object per line), with one row or record per request: its arrival time in a named column
(seconds or milliseconds as numbers, or ISO 8601 dates and times) and, optionally, its size in
another. The default column and unit are those of the Azure LLM inference traces
(Azure/AzurePublicDataset, CC-BY 4.0; Patel et al., "Splitwise", ISCA 2024): a ``TIMESTAMP``
column (``2023-11-16 18:17:03.9799600``, 0.1 us resolution) with per-request ``ContextTokens``
and ``GeneratedTokens``. Two such traces live in the project's shared folder,
``../shared/traces/`` (:data:`TRACE_DIR`); they are read from there and never copied into the
repository. Their rates are low (2.6 and 5.5 req/s), so a replay compresses time (x100 to
x1000) to reach batching-relevant rates while keeping the burst structure.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Final

import numpy as np

from adaptive_batcher.sim._trace_files import read_columns, relative_seconds, sizes
from adaptive_batcher.sim.workloads import Arrivals

__all__ = [
    "TIMESTAMP_COLUMN",
    "TIME_UNITS",
    "TRACE_DIR",
    "TRACE_FORMATS",
    "default_trace_dir",
    "find_trace",
    "load_trace",
]

TRACE_DIR: Final[Path] = (
    Path(__file__).resolve().parents[2] / ".." / "shared" / "traces"
).resolve()
"""``../shared/traces`` relative to the repository root (meaningful in a checkout only)."""

TIMESTAMP_COLUMN: Final = "TIMESTAMP"
"""The Azure traces' arrival-time column: ISO-like wall-clock times, e.g.
``2023-11-16 18:17:03.9799600``; the default ``time_column``."""

TIME_UNITS: Final = ("datetime", "s", "ms")
"""How a time column is read: ISO 8601 dates and times (a zone offset is converted to UTC, a
time without one is read as UTC), or numbers of seconds or milliseconds from any origin (epoch
times, or times since the trace began)."""

TRACE_FORMATS: Final = {".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl"}
"""File suffix -> format; any other suffix is read as CSV."""


def default_trace_dir() -> Path:
    """Where traces are read from by default: ``ADAPTIVE_BATCHER_TRACES`` when set, else
    :data:`TRACE_DIR`."""
    folder = os.environ.get("ADAPTIVE_BATCHER_TRACES")
    return Path(folder) if folder else TRACE_DIR


def find_trace(name: str, trace_dir: str | os.PathLike[str] | None = None) -> Path | None:
    """The path of a trace in a folder, or None when it (or the folder) is absent.

    Args:
        name: file name, e.g. ``"azure_llm_2023_code.csv"``; without a suffix of
            :data:`TRACE_FORMATS`, ``name.csv`` then ``name.jsonl`` are tried.
        trace_dir: where to look; default :func:`default_trace_dir`.
    """
    folder = default_trace_dir() if trace_dir is None else Path(trace_dir)
    has_suffix = Path(name).suffix.lower() in TRACE_FORMATS
    for file_name in [name] if has_suffix else [f"{name}.csv", f"{name}.jsonl"]:
        path = folder / file_name
        if path.is_file():
            return path
    return None


def load_trace(
    path: str | os.PathLike[str],
    *,
    compress: float = 1.0,
    start_s: float = 0.0,
    duration_s: float | None = None,
    size_column: str | None = None,
    max_units: int | None = None,
    name: str | None = None,
    time_column: str = TIMESTAMP_COLUMN,
    time_unit: str = "datetime",
) -> Arrivals:
    """Read a trace as arrivals on a replay timeline.

    Times are taken relative to the earliest row (rows are sorted stably by time if the file
    is not), then the window ``[start_s, start_s + duration_s)`` of the trace's own seconds is
    kept, re-based to start at 0 (an idle start of the window is kept), and divided by
    ``compress``. E.g. ``compress=100, start_s=600, duration_s=300`` replays minutes 10-15 of
    the trace in 3 s. The result's ``duration_s`` is the window length (default: to the last
    row) divided by ``compress``.

    Args:
        path: the file: CSV with a header row, or JSON Lines (by suffix, see
            :data:`TRACE_FORMATS`).
        compress: time compression factor (> 0): x100 turns 2.6 req/s into 260 req/s.
        start_s: window start, seconds after the first row, in trace time (>= 0).
        duration_s: window length, seconds of trace time (> 0); None: to the end of the trace.
        size_column: the column (JSON: field) giving each request's size in units (e.g.
            ``"ContextTokens"``), integers; None: every request is one unit.
        max_units: sizes are clipped to ``[1, max_units]`` (>= 1); None: only to at least 1.
        name: the arrivals' label; default ``"<file stem> x<compress>"``.
        time_column: the column (JSON: field) with each request's arrival time.
        time_unit: how it is read, one of :data:`TIME_UNITS`: ``"datetime"`` (ISO 8601,
            default), ``"s"`` or ``"ms"`` (numbers).

    Returns:
        :class:`Arrivals` with float64 times in seconds and int64 sizes, shape ``(n,)``.

    Raises:
        OSError: the file cannot be read (FileNotFoundError when absent).
        ValueError: a bad argument (the message names it), or a bad file: not UTF-8 (a
            byte-order mark is allowed), no header, no rows or records, malformed CSV (a quote
            left open, a row whose field count is not the header's, a column named twice) or
            JSON (not one object per line, nesting too deep, a field given twice), a missing
            column or field, a time or size that does not parse, is out of range or overflows
            (the message names the file, the line and the column), ``start_s`` past the end of
            the trace. No row is skipped but blank lines.
    """
    where = os.fspath(path)
    _check_window(compress, start_s, duration_s, max_units)
    if time_unit not in TIME_UNITS:
        listed = ", ".join(repr(u) for u in TIME_UNITS)
        raise ValueError(f"time_unit must be one of {listed}, got {time_unit!r}")
    fmt = TRACE_FORMATS.get(Path(where).suffix.lower(), "csv")
    columns = read_columns(where, fmt, time_column, size_column)
    relative_s = relative_seconds(where, time_column, time_unit, columns.lines, columns.times)
    counts = (
        np.ones(relative_s.size, dtype=np.int64)
        if size_column is None
        else sizes(where, size_column, columns.lines, columns.sizes)
    )
    if np.any(relative_s[1:] < relative_s[:-1]):
        order = np.argsort(relative_s, kind="stable")
        relative_s, counts = relative_s[order], counts[order]
    span_s = float(relative_s[-1])
    if start_s > span_s:
        raise ValueError(
            f"{where}: start_s={start_s} is past the end of the trace ({span_s:.3f} s long)"
        )
    end_s = span_s if duration_s is None else start_s + duration_s
    first = int(np.searchsorted(relative_s, start_s, side="left"))
    if duration_s is None:
        last = relative_s.size
    else:
        last = int(np.searchsorted(relative_s, end_s, side="left"))
    times = (relative_s[first:last] - start_s) / compress
    kept_sizes = np.clip(counts[first:last], 1, max_units)
    label = name if name is not None else f"{Path(where).stem} x{compress:g}"
    return Arrivals(times, kept_sizes, label, (end_s - start_s) / compress)


def _check_window(
    compress: float, start_s: float, duration_s: float | None, max_units: int | None
) -> None:
    if not math.isfinite(compress) or compress <= 0:
        raise ValueError(f"compress must be finite and > 0, got {compress!r}")
    if not math.isfinite(start_s) or start_s < 0:
        raise ValueError(f"start_s must be finite and >= 0, got {start_s!r}")
    if duration_s is not None and (not math.isfinite(duration_s) or duration_s <= 0):
        raise ValueError(f"duration_s must be finite and > 0 or None, got {duration_s!r}")
    if max_units is not None and (isinstance(max_units, bool) or int(max_units) != max_units):
        raise ValueError(f"max_units must be an integer >= 1 or None, got {max_units!r}")
    if max_units is not None and max_units < 1:
        raise ValueError(f"max_units must be an integer >= 1 or None, got {max_units!r}")

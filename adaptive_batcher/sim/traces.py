"""Public request traces as :class:`~adaptive_batcher.sim.workloads.Arrivals`.

The format is that of the Azure LLM inference traces (Azure/AzurePublicDataset, CC-BY 4.0;
Patel et al., "Splitwise", ISCA 2024): a CSV with a ``TIMESTAMP`` column
(``2023-11-16 18:17:03.9799600``, 0.1 us resolution) and per-request ``ContextTokens`` and
``GeneratedTokens``. Two such traces live in the project's shared folder,
``../shared/traces/`` (:data:`TRACE_DIR`); they are read from there and never copied into the
repository. Their rates are low (2.6 and 5.5 req/s), so a replay compresses time (x100 to
x1000) to reach batching-relevant rates while keeping the burst structure.
"""

from __future__ import annotations

import csv
import math
import os
from pathlib import Path
from typing import Final

import numpy as np
import numpy.typing as npt

from adaptive_batcher.sim.workloads import Arrivals

__all__ = ["TIMESTAMP_COLUMN", "TRACE_DIR", "find_trace", "load_trace"]

TRACE_DIR: Final[Path] = (
    Path(__file__).resolve().parents[2] / ".." / "shared" / "traces"
).resolve()
"""``../shared/traces`` relative to the repository root (meaningful in a checkout only)."""

TIMESTAMP_COLUMN: Final = "TIMESTAMP"
"""The arrival-time column: ISO-like wall-clock times, e.g. ``2023-11-16 18:17:03.9799600``."""


def find_trace(name: str, trace_dir: str | os.PathLike[str] | None = None) -> Path | None:
    """The path of a shared trace, or None when it (or the shared folder) is absent.

    Args:
        name: file name with or without ``.csv``, e.g. ``"azure_llm_2023_code"``.
        trace_dir: where to look; default :data:`TRACE_DIR`.
    """
    folder = TRACE_DIR if trace_dir is None else Path(trace_dir)
    file_name = name if name.endswith(".csv") else f"{name}.csv"
    path = folder / file_name
    return path if path.is_file() else None


def load_trace(
    path: str | os.PathLike[str],
    *,
    compress: float = 1.0,
    start_s: float = 0.0,
    duration_s: float | None = None,
    size_column: str | None = None,
    max_units: int | None = None,
    name: str | None = None,
) -> Arrivals:
    """Read a trace CSV as arrivals on a replay timeline.

    Times are taken relative to the earliest row (rows are sorted stably by time if the file
    is not), then the window ``[start_s, start_s + duration_s)`` of the trace's own seconds is
    kept, re-based to start at 0 (an idle start of the window is kept), and divided by
    ``compress``. E.g. ``compress=100, start_s=600, duration_s=300`` replays minutes 10-15 of
    the trace in 3 s. The result's ``duration_s`` is the window length (default: to the last
    row) divided by ``compress``.

    Args:
        path: the CSV file (header row, a ``TIMESTAMP`` column).
        compress: time compression factor (> 0): x100 turns 2.6 req/s into 260 req/s.
        start_s: window start, seconds after the first row, in trace time (>= 0).
        duration_s: window length, seconds of trace time (> 0); None: to the end of the trace.
        size_column: the column giving each request's size in units (e.g. ``"ContextTokens"``
            or ``"GeneratedTokens"``); None: every request is one unit.
        max_units: sizes are clipped to ``[1, max_units]`` (>= 1); None: only to at least 1.
        name: the arrivals' label; default ``"<file stem> x<compress>"``.

    Returns:
        :class:`Arrivals` with float64 times in seconds and int64 sizes, shape ``(n,)``.

    Raises:
        OSError: the file cannot be read (FileNotFoundError when absent).
        ValueError: a bad argument, or a bad file: no header or no rows, a missing column, a
            timestamp or size that does not parse (the message names the file, the column and
            the line), ``start_s`` past the end of the trace.
    """
    where = os.fspath(path)
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

    lines, stamps, size_cells = _read_columns(where, size_column)
    stamps_ns = _parse_timestamps(where, lines, stamps)
    sizes = (
        np.ones(stamps_ns.size, dtype=np.int64)
        if size_column is None
        else _parse_sizes(where, size_column, lines, size_cells)
    )
    if np.any(stamps_ns[1:] < stamps_ns[:-1]):
        order = np.argsort(stamps_ns, kind="stable")
        stamps_ns, sizes = stamps_ns[order], sizes[order]
    relative_s = (stamps_ns - stamps_ns[0]).astype(np.float64) / 1e9
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
    kept_sizes = np.clip(sizes[first:last], 1, max_units)
    label = name if name is not None else f"{Path(where).stem} x{compress:g}"
    return Arrivals(times, kept_sizes, label, (end_s - start_s) / compress)


def _read_columns(where: str, size_column: str | None) -> tuple[list[int], list[str], list[str]]:
    """``(line numbers, TIMESTAMP cells, size cells)`` of the non-blank data rows."""
    with open(where, newline="", encoding="utf-8") as handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        if header is None:
            raise ValueError(f"{where}: empty file, expected a header with {TIMESTAMP_COLUMN!r}")
        columns = [c.strip() for c in header]
        wanted = [TIMESTAMP_COLUMN] if size_column is None else [TIMESTAMP_COLUMN, size_column]
        for column in wanted:
            if column not in columns:
                raise ValueError(
                    f"{where}: no column {column!r}; the header has {', '.join(columns)}"
                )
        t_index = columns.index(TIMESTAMP_COLUMN)
        s_index = t_index if size_column is None else columns.index(size_column)
        need = max(t_index, s_index) + 1
        lines: list[int] = []
        stamps: list[str] = []
        sizes: list[str] = []
        for line, row in enumerate(reader, start=2):
            if not row:
                continue
            if len(row) < need:
                raise ValueError(
                    f"{where} line {line}: {len(row)} fields, fewer than the header's {need}"
                )
            lines.append(line)
            stamps.append(row[t_index].strip())
            if size_column is not None:
                sizes.append(row[s_index].strip())
    if not stamps:
        raise ValueError(f"{where}: no data rows")
    return lines, stamps, sizes


def _parse_timestamps(where: str, lines: list[int], stamps: list[str]) -> npt.NDArray[np.int64]:
    """Nanoseconds since the epoch (numpy's ISO 8601 parser, the space separator included)."""
    try:
        parsed = np.array(stamps, dtype="datetime64[ns]")
    except ValueError:
        parsed = None
    if parsed is not None and not np.any(np.isnat(parsed)):
        return parsed.astype(np.int64)
    line, stamp = next(
        ((n, text) for n, text in zip(lines, stamps, strict=True) if not _is_timestamp(text)),
        (lines[0], stamps[0]),  # not reached: the array failed, so some element fails alone
    )
    raise ValueError(
        f"{where} line {line}: column {TIMESTAMP_COLUMN!r}: "
        f"not a timestamp like '2023-11-16 18:17:03.9799600': {stamp!r}"
    )


def _is_timestamp(text: str) -> bool:
    try:
        return not bool(np.isnat(np.datetime64(text, "ns")))
    except ValueError:
        return False


def _parse_sizes(
    where: str, column: str, lines: list[int], cells: list[str]
) -> npt.NDArray[np.int64]:
    values = np.empty(len(cells), dtype=np.int64)
    for i, (line, cell) in enumerate(zip(lines, cells, strict=True)):
        try:
            values[i] = int(cell)
        except (ValueError, OverflowError):
            raise ValueError(
                f"{where} line {line}: column {column!r}: not an integer: {cell!r}"
            ) from None
    return values

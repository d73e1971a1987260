"""Reading a trace file's time and size columns: CSV or JSON Lines, times in s, ms or dates.

The loader (:func:`adaptive_batcher.sim.traces.load_trace`) windows and compresses what this
module reads. Every error is a ``ValueError`` naming the file, the line and the column.
"""

from __future__ import annotations

import csv
import json
import math
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np
import numpy.typing as npt

__all__ = ["Columns", "read_columns", "relative_seconds", "sizes"]

_SECONDS_PER_UNIT = {"s": 1.0, "ms": 1e-3}


@dataclass(frozen=True, slots=True)
class Columns:
    """The data rows of a trace: their line numbers, time cells and size cells (empty when no
    size column was asked for). CSV cells are strings; JSON values are as decoded."""

    lines: list[int]
    times: list[object]
    sizes: list[object]


def read_columns(where: str, fmt: str, time_column: str, size_column: str | None) -> Columns:
    """The time and size columns of the CSV (``fmt="csv"``) or JSON Lines file ``where``."""
    if fmt == "jsonl":
        return _read_jsonl(where, time_column, size_column)
    return _read_csv(where, time_column, size_column)


def _read_csv(where: str, time_column: str, size_column: str | None) -> Columns:
    with open(where, newline="", encoding="utf-8") as handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        if header is None:
            raise ValueError(f"{where}: empty file, expected a header with {time_column!r}")
        columns = [c.strip() for c in header]
        for column in [time_column] if size_column is None else [time_column, size_column]:
            if column not in columns:
                raise ValueError(
                    f"{where}: no column {column!r}; the header has {', '.join(columns)}"
                )
        t_index = columns.index(time_column)
        s_index = t_index if size_column is None else columns.index(size_column)
        need = max(t_index, s_index) + 1
        found = Columns([], [], [])
        for line, row in enumerate(reader, start=2):
            if not row:
                continue
            if len(row) < need:
                raise ValueError(
                    f"{where} line {line}: {len(row)} fields, fewer than the header's {need}"
                )
            found.lines.append(line)
            found.times.append(row[t_index].strip())
            if size_column is not None:
                found.sizes.append(row[s_index].strip())
    if not found.lines:
        raise ValueError(f"{where}: no data rows")
    return found


def _read_jsonl(where: str, time_column: str, size_column: str | None) -> Columns:
    found = Columns([], [], [])
    with open(where, encoding="utf-8") as handle:
        for line, text in enumerate(handle, start=1):
            if not text.strip():
                continue
            try:
                record = json.loads(text)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{where} line {line}: not a JSON record: {exc.msg}") from None
            if not isinstance(record, dict):
                raise ValueError(
                    f"{where} line {line}: a JSON object expected, got {type(record).__name__}"
                )
            for field in [time_column] if size_column is None else [time_column, size_column]:
                if field not in record:
                    raise ValueError(
                        f"{where} line {line}: no field {field!r}; the record has "
                        f"{', '.join(map(str, record)) or 'no fields'}"
                    )
            found.lines.append(line)
            found.times.append(record[time_column])
            if size_column is not None:
                found.sizes.append(record[size_column])
    if not found.lines:
        raise ValueError(f"{where}: no records")
    return found


def relative_seconds(
    where: str, column: str, unit: str, lines: Sequence[int], cells: Sequence[object]
) -> npt.NDArray[np.float64]:
    """Each row's time in seconds after the earliest row's, float64, in file order.

    ``unit`` is ``"s"`` or ``"ms"`` (numbers: epoch or any origin) or ``"datetime"`` (ISO 8601
    dates and times; a time zone offset is converted to UTC, a time without one is read as UTC).
    """
    if unit == "datetime":
        nanoseconds = _datetimes_ns(where, column, lines, cells)
        relative: npt.NDArray[np.float64] = (nanoseconds - nanoseconds.min()).astype(np.float64)
        return relative / 1e9
    values = np.empty(len(cells), dtype=np.float64)
    for i, (line, cell) in enumerate(zip(lines, cells, strict=True)):
        values[i] = _number(where, column, unit, line, cell)
    seconds: npt.NDArray[np.float64] = (values - values.min()) * _SECONDS_PER_UNIT[unit]
    return seconds


def _number(where: str, column: str, unit: str, line: int, cell: object) -> float:
    try:
        if isinstance(cell, bool) or not isinstance(cell, str | int | float):
            raise ValueError
        value = float(cell)
    except (ValueError, OverflowError):
        value = math.nan
    if not math.isfinite(value):
        raise ValueError(
            f"{where} line {line}: column {column!r}: not a time in {unit} "
            f"(a finite number): {cell!r}"
        )
    return value


_BARE_NUMBER = re.compile(r"\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\s*")


def _datetimes_ns(
    where: str, column: str, lines: Sequence[int], cells: Sequence[object]
) -> npt.NDArray[np.int64]:
    """Nanoseconds since the epoch: numpy's ISO 8601 parser (0.1 us and the space separator
    included) for times without a zone, ``datetime.fromisoformat`` for the others."""
    texts = [cell if isinstance(cell, str) else "" for cell in cells]
    for line, text in zip(lines, texts, strict=True):
        if _BARE_NUMBER.fullmatch(text):  # numpy would read "12" as the year 12
            raise ValueError(
                f"{where} line {line}: column {column!r}: {text!r} is a number, not a date "
                "and time; for numbers give their unit (time unit 's' or 'ms'; replay: "
                "--time-unit)"
            )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            parsed = np.array(texts, dtype="datetime64[ns]")
    except (ValueError, Warning):  # a zone: numpy warns (deprecated), and we read it below
        parsed = None
    if parsed is not None and not np.any(np.isnat(parsed)):
        return parsed.astype(np.int64)
    values = np.empty(len(texts), dtype=np.int64)
    for i, (line, text) in enumerate(zip(lines, texts, strict=True)):
        values[i] = _iso_ns(where, column, line, text, cells[i])
    return values


def _iso_ns(where: str, column: str, line: int, text: str, cell: object) -> int:
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        try:
            stamp: np.datetime64 = np.datetime64(text, "ns")
        except ValueError:
            stamp = np.datetime64("NaT", "ns")
        if np.isnat(stamp):
            raise ValueError(
                f"{where} line {line}: column {column!r}: "
                f"not a timestamp like '2023-11-16 18:17:03.9799600': {cell!r}"
            ) from None
        return int(stamp.astype(np.int64))
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    since_epoch = moment - datetime(1970, 1, 1, tzinfo=UTC)
    return (since_epoch.days * 86_400 + since_epoch.seconds) * 10**9 + (
        since_epoch.microseconds * 1_000
    )


def sizes(
    where: str, column: str, lines: Sequence[int], cells: Sequence[object]
) -> npt.NDArray[np.int64]:
    """The size cells as int64: integers, as text or JSON numbers (not fractions, not bools)."""
    values = np.empty(len(cells), dtype=np.int64)
    for i, (line, cell) in enumerate(zip(lines, cells, strict=True)):
        try:
            if isinstance(cell, bool) or not isinstance(cell, str | int | float):
                raise ValueError
            if isinstance(cell, float) and not cell.is_integer():
                raise ValueError
            values[i] = int(cell)
        except (ValueError, OverflowError):
            raise ValueError(
                f"{where} line {line}: column {column!r}: not an integer: {cell!r}"
            ) from None
    return values

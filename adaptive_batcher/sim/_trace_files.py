"""Reading a trace file's time and size columns: CSV or JSON Lines, times in s, ms or dates.

The loader (:func:`adaptive_batcher.sim.traces.load_trace`) windows and compresses what this
module reads. Every error is a ``ValueError`` naming the file, the line and the column: text
that is not UTF-8 (a byte-order mark is allowed), CSV with a quote left open or a stray quote,
a row with more or fewer fields than the header, a requested column named twice in the header,
a JSON line that is not one object (or nests too deep, or names a field twice), a time that is
not a finite number or not a date (or one outside the years 1678-2262 that nanosecond times
hold), times whose span overflows, a size that is not an integer (or beyond 64 bits). No row is
skipped but blank lines.
"""

from __future__ import annotations

import csv
import io
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
    """The time and size columns of the CSV (``fmt="csv"``) or JSON Lines file ``where``.

    Raises:
        OSError: the file cannot be read.
        ValueError: the file is not UTF-8 (a byte-order mark is allowed) or is malformed; the
            message names the file, the line and the problem.
    """
    text = _read_text(where)
    if fmt == "jsonl":
        return _read_jsonl(where, text, time_column, size_column)
    return _read_csv(where, text, time_column, size_column)


def _read_text(where: str) -> str:
    """The file's text: UTF-8, with or without a byte-order mark."""
    with open(where, "rb") as handle:
        data = handle.read()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ValueError(
            f"{where} line {line}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset "
            f"{exc.start}); save the trace as UTF-8"
        ) from None


def _read_csv(where: str, text: str, time_column: str, size_column: str | None) -> Columns:
    # strict: a quote left open or a stray quote is an error, never rows run together
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    try:
        header = next(reader, None)
        if header is None:
            raise ValueError(f"{where}: empty file, expected a header with {time_column!r}")
        columns = [c.strip() for c in header]
        for column in [time_column] if size_column is None else [time_column, size_column]:
            if column not in columns:
                raise ValueError(
                    f"{where}: no column {column!r}; the header has {', '.join(columns)}"
                )
            if columns.count(column) > 1:
                raise ValueError(
                    f"{where}: column {column!r} appears {columns.count(column)} times in the "
                    "header; which one holds the data is ambiguous"
                )
        t_index = columns.index(time_column)
        s_index = t_index if size_column is None else columns.index(size_column)
        found = Columns([], [], [])
        width = len(columns)
        for row in reader:
            line = reader.line_num
            if not row:
                continue
            if len(row) != width:
                fewer = "fewer" if len(row) < width else "more"
                raise ValueError(
                    f"{where} line {line}: {len(row)} fields, {fewer} than the header's {width}"
                )
            found.lines.append(line)
            found.times.append(row[t_index].strip())
            if size_column is not None:
                found.sizes.append(row[s_index].strip())
    except csv.Error as exc:
        problem = str(exc)
        if problem == "unexpected end of data":
            problem = "a quoted field is not closed before the end of the file"
        raise ValueError(f"{where} line {reader.line_num}: not valid CSV: {problem}") from None
    if not found.lines:
        raise ValueError(f"{where}: no data rows")
    return found


def _read_jsonl(where: str, text: str, time_column: str, size_column: str | None) -> Columns:
    found = Columns([], [], [])
    for line, record_text in enumerate(text.split("\n"), start=1):
        if not record_text.strip():
            continue
        record = _json_record(where, line, record_text)
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


def _json_record(where: str, line: int, text: str) -> dict[str, object]:
    """One line's JSON object; ValueError naming the file and line for anything else (bad
    JSON, a field given twice, nesting too deep, a number too long)."""
    try:
        record = json.loads(text, object_pairs_hook=_unique_fields)
    except _DuplicateFieldError as exc:
        raise ValueError(f"{where} line {line}: field {exc.name!r} given twice") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where} line {line}: not a JSON record: {exc.msg}") from None
    except RecursionError:
        raise ValueError(f"{where} line {line}: not a JSON record: nested too deeply") from None
    except ValueError as exc:  # an integer of more digits than Python converts
        raise ValueError(f"{where} line {line}: not a JSON record: {exc}") from None
    if not isinstance(record, dict):
        raise ValueError(
            f"{where} line {line}: a JSON object expected, got {type(record).__name__}"
        )
    return record


class _DuplicateFieldError(Exception):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


def _unique_fields(pairs: list[tuple[str, object]]) -> dict[str, object]:
    """A JSON object's fields; a name given twice (JSON keeps the last silently) is refused."""
    record = dict(pairs)
    if len(record) != len(pairs):
        seen: set[str] = set()
        for name, _ in pairs:
            if name in seen:
                raise _DuplicateFieldError(name)
            seen.add(name)
    return record


def relative_seconds(
    where: str, column: str, unit: str, lines: Sequence[int], cells: Sequence[object]
) -> npt.NDArray[np.float64]:
    """Each row's time in seconds after the earliest row's, float64, in file order.

    ``unit`` is ``"s"`` or ``"ms"`` (numbers: epoch or any origin) or ``"datetime"`` (ISO 8601
    dates and times; a time zone offset is converted to UTC, a time without one is read as UTC).
    """
    if unit == "datetime":
        nanoseconds = _datetimes_ns(where, column, lines, cells)
        # the span of two times in range may pass int64 (584 years): exact as uint64
        span = (nanoseconds - nanoseconds.min()).view(np.uint64)
        relative: npt.NDArray[np.float64] = span.astype(np.float64)
        return relative / 1e9
    values = np.empty(len(cells), dtype=np.float64)
    for i, (line, cell) in enumerate(zip(lines, cells, strict=True)):
        values[i] = _number(where, column, unit, line, cell)
    with np.errstate(over="ignore"):
        seconds: npt.NDArray[np.float64] = (values - values.min()) * _SECONDS_PER_UNIT[unit]
    if not np.all(np.isfinite(seconds)):
        line = lines[int(np.argmin(np.isfinite(seconds)))]
        raise ValueError(
            f"{where} line {line}: column {column!r}: the times span more than a float holds "
            f"(from {float(values.min())!r} to {float(values.max())!r} {unit})"
        )
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
            # nanoseconds wrap round silently outside their years: checked in seconds
            coarse = np.array(texts, dtype="datetime64[s]")
    except (ValueError, Warning):  # a zone: numpy warns (deprecated), and we read it below
        parsed = None
    if parsed is not None and not np.any(np.isnat(parsed)):
        outside = (coarse < _FIRST_NS_S) | (coarse >= _END_NS_S)
        if np.any(outside):
            first = int(np.argmax(outside))
            raise _out_of_range(where, column, lines[first], cells[first])
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
            coarse: np.datetime64 = np.datetime64(text, "s")
        except ValueError:
            stamp = coarse = np.datetime64("NaT", "ns")
        if np.isnat(stamp):
            raise ValueError(
                f"{where} line {line}: column {column!r}: "
                f"not a timestamp like '2023-11-16 18:17:03.9799600': {cell!r}"
            ) from None
        if not _FIRST_NS_S <= coarse < _END_NS_S:
            raise _out_of_range(where, column, line, cell) from None
        return int(stamp.astype(np.int64))
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    since_epoch = moment - datetime(1970, 1, 1, tzinfo=UTC)
    nanoseconds = (since_epoch.days * 86_400 + since_epoch.seconds) * 10**9 + (
        since_epoch.microseconds * 1_000
    )
    if not _FIRST_NS <= nanoseconds < _END_NS:
        raise _out_of_range(where, column, line, cell)
    return nanoseconds


# the years whose times nanoseconds since 1970 hold in an int64 (1677-09-21 to 2262-04-11)
_FIRST_NS_S = np.datetime64("1678-01-01T00:00:00", "s")
_END_NS_S = np.datetime64("2262-01-01T00:00:00", "s")
_FIRST_NS = int(_FIRST_NS_S.astype(np.int64)) * 10**9
_END_NS = int(_END_NS_S.astype(np.int64)) * 10**9


def _out_of_range(where: str, column: str, line: int, cell: object) -> ValueError:
    return ValueError(
        f"{where} line {line}: column {column!r}: {cell!r} is outside the years 1678-2261 "
        "that nanosecond timestamps hold"
    )


def sizes(
    where: str, column: str, lines: Sequence[int], cells: Sequence[object]
) -> npt.NDArray[np.int64]:
    """The size cells as int64: integers, as text or JSON numbers (not fractions, not bools, not
    beyond int64; the loader replays those below 1 as 1 unit)."""
    values = np.empty(len(cells), dtype=np.int64)
    for i, (line, cell) in enumerate(zip(lines, cells, strict=True)):
        try:
            if isinstance(cell, bool) or not isinstance(cell, str | int | float):
                raise ValueError
            if isinstance(cell, float) and not cell.is_integer():
                raise ValueError
            value = int(cell)
        except (ValueError, OverflowError):
            raise ValueError(
                f"{where} line {line}: column {column!r}: not an integer: {cell!r}"
            ) from None
        if not -(2**63) <= value < 2**63:
            raise ValueError(
                f"{where} line {line}: column {column!r}: a size beyond a 64-bit integer: {cell!r}"
            )
        values[i] = value
    return values

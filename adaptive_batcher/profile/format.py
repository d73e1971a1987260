"""The profile file format (JSON, schema ``adaptive_batcher.profile/1``): its one reader and writer.

The JSON file is also the simulator's measured service-time table
(:meth:`adaptive_batcher.sim.service.TableService.from_profile_json` reads it with
:func:`load_profile`), so its schema is fixed::

    {
      "schema": "adaptive_batcher.profile/1",
      "model": str, "device": str, "repeats": int,
      "max_repeats": int | null, "cv_threshold": float | null,
      "torch_threads": int | null, "torch_interop_threads": int | null,
      "available_cores": int | null,
      "noisy": bool, "warnings": [str, ...],
      "rows": [{"batch_size": int, "median_ms": float, "p99_ms": float,
                "items_per_s": float, "peak_mem_bytes": int | null,
                "repeats": int | null, "cv": float | null, "robust_cv": float | null}, ...],
      "oom_batch_size": int | null,
      "knee": {"batch_size": int, "median_ms": float, "p99_ms": float,
               "items_per_s": float, "method": "kneedle" | "fraction_of_max"},
      "recommendation": {"max_batch_size": int, "window_ms": float, "slo_p99_ms": float | null,
                         "meets_slo": bool, "reasons": [str, ...],
                         "noisy": bool, "warnings": [str, ...]} | null
    }

A recommendation's ``"slo_p99_ms"`` holds
:attr:`~adaptive_batcher.profile.recommend.Recommendation.slo_latency_ms`, the SLO's latency target
at its percentile (99 from the command line); the key keeps the name schema 1 was fixed with, so
that files written before and after the field's rename read the same.

Rows are in ascending batch size; times are milliseconds, memory bytes, throughput items/s; CV
and robust CV are fractions (0.05 = 5 %). The reader ignores keys it does not know, so later
minor additions stay readable, and it reads files written before the spread, thread and noise
keys existed (``max_repeats`` ... ``warnings``, a row's ``repeats``, ``cv`` and ``robust_cv``, a
recommendation's ``noisy`` and ``warnings``): a missing one reads as null, false or empty.

A leaf module: it imports numpy and the profiler's result types but none of the optional
libraries (rich, matplotlib, kneed), so the simulator and ``BatcherSettings`` read profiles
without the ``cli`` extra. (:func:`profile_to_dict` without a ``knee`` finds one, which needs
kneed.)
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Final

from adaptive_batcher.profile.knee import Knee, find_knee
from adaptive_batcher.profile.recommend import Recommendation
from adaptive_batcher.profile.result import ProfileResult, ProfileRow

__all__ = [
    "SCHEMA",
    "ProfileFormatError",
    "load_profile",
    "profile_to_dict",
    "read_service_profile",
    "write_profile",
]

SCHEMA: Final = "adaptive_batcher.profile/1"
"""The value of the ``"schema"`` key of every profile file this version reads and writes."""


class ProfileFormatError(ValueError):
    """A profile file is not valid JSON or does not follow the schema.

    Attributes:
        path: the file.
        key: the offending key as a path (``"rows[2].median_ms"``), or None for the whole file.
    """

    def __init__(self, path: str | os.PathLike[str], key: str | None, problem: str) -> None:
        where = f"key {key!r}: " if key is not None else ""
        super().__init__(f"{os.fspath(path)}: {where}{problem}")
        self.path = Path(path)
        self.key = key


def profile_to_dict(
    result: ProfileResult,
    *,
    knee: Knee | None = None,
    recommendation: Recommendation | None = None,
) -> dict[str, Any]:
    """The JSON document for a profile (schema in the module docstring).

    Args:
        result: a sweep with at least one row.
        knee: default :func:`~adaptive_batcher.profile.knee.find_knee` of ``result``.
        recommendation: written as ``null`` when None.

    Raises:
        ValueError: ``result`` has no rows (there is no service-time table to write).
    """
    if not result.rows:
        raise ValueError(
            "cannot write a profile with no rows "
            f"(batch size {result.oom_batch_size} already ran out of memory)"
        )
    knee = find_knee(result) if knee is None else knee
    rec: dict[str, Any] | None = None
    if recommendation is not None:
        rec = {
            "max_batch_size": recommendation.max_batch_size,
            "window_ms": recommendation.window_ms,
            "slo_p99_ms": recommendation.slo_latency_ms,
            "meets_slo": recommendation.meets_slo,
            "reasons": list(recommendation.reasons),
            "noisy": recommendation.noisy,
            "warnings": list(recommendation.warnings),
        }
    return {
        "schema": SCHEMA,
        "model": result.model_name,
        "device": result.device,
        "repeats": result.repeats,
        "max_repeats": result.max_repeats,
        "cv_threshold": result.cv_threshold,
        "torch_threads": result.torch_threads,
        "torch_interop_threads": result.torch_interop_threads,
        "available_cores": result.available_cores,
        "noisy": result.noisy,
        "warnings": list(result.warnings),
        "rows": [
            {
                "batch_size": row.batch_size,
                "median_ms": row.median_ms,
                "p99_ms": row.p99_ms,
                "items_per_s": row.items_per_s,
                "peak_mem_bytes": row.peak_mem_bytes,
                "repeats": row.repeats,
                "cv": row.cv,
                "robust_cv": row.robust_cv,
            }
            for row in result.rows
        ],
        "oom_batch_size": result.oom_batch_size,
        "knee": {
            "batch_size": knee.batch_size,
            "median_ms": knee.median_ms,
            "p99_ms": knee.p99_ms,
            "items_per_s": knee.items_per_s,
            "method": knee.method,
        },
        "recommendation": rec,
    }


def write_profile(
    path: str | os.PathLike[str],
    result: ProfileResult,
    *,
    knee: Knee | None = None,
    recommendation: Recommendation | None = None,
) -> Path:
    """Write the profile as JSON (UTF-8, strict: no NaN/Infinity) and return the path.

    The file is written to a temporary sibling first and then renamed over ``path``, so a reader
    never sees half a file.

    Raises:
        ValueError: ``result`` has no rows.
        OSError: the file cannot be written.
    """
    document = profile_to_dict(result, knee=knee, recommendation=recommendation)
    target = Path(path)
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.write_text(json.dumps(document, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    tmp.replace(target)
    return target


class _Reader:
    """Typed access to a decoded document; every error names the file and the key."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = path

    def fail(self, key: str | None, problem: str) -> ProfileFormatError:
        return ProfileFormatError(self.path, key, problem)

    def get(self, obj: dict[str, Any], key: str, prefix: str = "") -> Any:
        if key not in obj:
            raise self.fail(None, f"missing key {prefix + key!r}")
        return obj[key]

    def optional_int(self, obj: dict[str, Any], key: str, prefix: str, minimum: int) -> int | None:
        """An optional key (absent in older files) holding an int or null."""
        return self.as_optional_int(obj.get(key), prefix + key, minimum=minimum)

    def optional_number(self, obj: dict[str, Any], key: str, prefix: str) -> float | None:
        """An optional key (absent in older files) holding a number or null."""
        return self.as_optional_number(obj.get(key), prefix + key)

    def optional_flag(self, obj: dict[str, Any], key: str, prefix: str) -> bool:
        """An optional key (absent in older files: false) holding true or false."""
        return self.as_bool(obj.get(key, False), prefix + key)

    def optional_strings(self, obj: dict[str, Any], key: str, prefix: str) -> tuple[str, ...]:
        """An optional key (absent in older files: empty) holding an array of strings."""
        values = self.as_list(obj.get(key, []), prefix + key)
        return tuple(self.as_str(value, f"{prefix}{key}[{i}]") for i, value in enumerate(values))

    def as_object(self, value: Any, key: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(key, f"must be an object, got {_json_type(value)}")
        return value

    def as_int(self, value: Any, key: str, *, minimum: int | None = None) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(key, f"must be an int, got {_json_type(value)}")
        if minimum is not None and value < minimum:
            raise self.fail(key, f"must be >= {minimum}, got {value}")
        return value

    def as_optional_int(self, value: Any, key: str, *, minimum: int | None = None) -> int | None:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(key, f"must be an int or null, got {_json_type(value)}")
        return self.as_int(value, key, minimum=minimum)

    def as_number(self, value: Any, key: str) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.fail(key, f"must be a number, got {_json_type(value)}")
        return float(value)

    def as_optional_number(self, value: Any, key: str) -> float | None:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.fail(key, f"must be a number or null, got {_json_type(value)}")
        return float(value)

    def as_str(self, value: Any, key: str) -> str:
        if not isinstance(value, str):
            raise self.fail(key, f"must be a string, got {_json_type(value)}")
        return value

    def as_bool(self, value: Any, key: str) -> bool:
        if not isinstance(value, bool):
            raise self.fail(key, f"must be true or false, got {_json_type(value)}")
        return value

    def as_list(self, value: Any, key: str) -> list[Any]:
        if not isinstance(value, list):
            raise self.fail(key, f"must be an array, got {_json_type(value)}")
        return value


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _read_rows(reader: _Reader, doc: dict[str, Any]) -> list[ProfileRow]:
    raw_rows = reader.as_list(reader.get(doc, "rows"), "rows")
    if not raw_rows:
        raise reader.fail("rows", "must not be empty")
    rows: list[ProfileRow] = []
    for i, raw in enumerate(raw_rows):
        where = f"rows[{i}]"
        obj = reader.as_object(raw, where)
        prefix = f"{where}."
        batch_size = reader.as_int(
            reader.get(obj, "batch_size", prefix), prefix + "batch_size", minimum=1
        )
        if rows and batch_size <= rows[-1].batch_size:
            raise reader.fail(
                prefix + "batch_size",
                f"must be larger than the previous row's ({rows[-1].batch_size}): "
                "rows are in strictly increasing batch size",
            )
        median_ms = reader.as_number(reader.get(obj, "median_ms", prefix), prefix + "median_ms")
        p99_ms = reader.as_number(reader.get(obj, "p99_ms", prefix), prefix + "p99_ms")
        items_per_s = reader.as_number(
            reader.get(obj, "items_per_s", prefix), prefix + "items_per_s"
        )
        peak = reader.as_optional_int(
            reader.get(obj, "peak_mem_bytes", prefix), prefix + "peak_mem_bytes", minimum=0
        )
        repeats = reader.optional_int(obj, "repeats", prefix, 1)
        cv = reader.optional_number(obj, "cv", prefix)
        robust_cv = reader.optional_number(obj, "robust_cv", prefix)
        try:
            rows.append(
                ProfileRow(batch_size, median_ms, p99_ms, items_per_s, peak, repeats, cv, robust_cv)
            )
        except (TypeError, ValueError) as exc:
            raise reader.fail(where, str(exc)) from exc
    return rows


def _read_recommendation(reader: _Reader, raw: Any) -> Recommendation | None:
    if raw is None:
        return None
    obj = reader.as_object(raw, "recommendation")
    prefix = "recommendation."
    max_batch_size = reader.as_int(
        reader.get(obj, "max_batch_size", prefix), prefix + "max_batch_size", minimum=1
    )
    window_ms = reader.as_number(reader.get(obj, "window_ms", prefix), prefix + "window_ms")
    slo_latency_ms = reader.as_optional_number(
        reader.get(obj, "slo_p99_ms", prefix), prefix + "slo_p99_ms"
    )
    meets_slo = reader.as_bool(reader.get(obj, "meets_slo", prefix), prefix + "meets_slo")
    raw_reasons = reader.as_list(reader.get(obj, "reasons", prefix), prefix + "reasons")
    reasons = tuple(
        reader.as_str(reason, f"{prefix}reasons[{i}]") for i, reason in enumerate(raw_reasons)
    )
    noisy = reader.optional_flag(obj, "noisy", prefix)
    warnings = reader.optional_strings(obj, "warnings", prefix)
    try:
        return Recommendation(
            max_batch_size, window_ms, slo_latency_ms, meets_slo, reasons, noisy, warnings
        )
    except (TypeError, ValueError) as exc:
        raise reader.fail("recommendation", str(exc)) from exc


def read_service_profile(path: str | os.PathLike[str]) -> tuple[tuple[int, float], ...]:
    """The ``(batch_size, median_ms)`` rows of the profile file at ``path``: the seed of a
    batcher's service-time model (its ``service_profile`` setting, read by the shells).

    Raises:
        FileNotFoundError: no file at ``path`` (the message names ``service_profile``).
        OSError, ProfileFormatError: as :func:`load_profile`.
    """
    if not os.path.exists(path):
        raise FileNotFoundError(f"service_profile: no such file: {os.fspath(path)!r}")
    result, _ = load_profile(path)
    return tuple((row.batch_size, row.median_ms) for row in result.rows)


def load_profile(path: str | os.PathLike[str]) -> tuple[ProfileResult, Recommendation | None]:
    """Read a profile written by :func:`write_profile` (or by hand, following the schema).

    Returns:
        ``(result, recommendation)``; the recommendation is None when the file holds ``null``.

    Raises:
        FileNotFoundError, OSError: the file cannot be read.
        ProfileFormatError: (a ValueError) the file is not UTF-8 JSON (a byte-order mark is
            allowed; nesting too deep, a key given twice in one object and a number too long
            are refused too), has another schema, or a key is missing or wrong; the message
            starts with the file's path and names the key, e.g.
            ``profile.json: key 'rows[1].median_ms': must be a number, got a string``.
    """
    reader = _Reader(path)
    try:
        text = Path(path).read_text(encoding="utf-8-sig")  # a byte-order mark is allowed
    except UnicodeDecodeError as exc:
        raise reader.fail(None, f"not UTF-8 text: {exc}") from exc
    try:
        decoded = json.loads(text, object_pairs_hook=_unique_keys)
    except _DuplicateKeyError as exc:
        raise reader.fail(exc.key, "given twice in one object (JSON keeps the last)") from None
    except json.JSONDecodeError as exc:
        raise reader.fail(None, f"not valid JSON: {exc}") from exc
    except RecursionError:
        raise reader.fail(None, "not valid JSON: nested too deeply") from None
    except ValueError as exc:  # an integer of more digits than Python converts
        raise reader.fail(None, f"not valid JSON: {exc}") from None
    return _read_document(reader, decoded)


class _DuplicateKeyError(Exception):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object; a key given twice (which JSON would resolve silently) is refused."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKeyError(key)
            seen.add(key)
    return obj


def _result(
    reader: _Reader,
    doc: dict[str, Any],
    rows: list[ProfileRow],
    oom: int | None,
    device: str,
    model: str,
    repeats: int,
) -> ProfileResult:
    """The ProfileResult, with the optional sweep keys (absent in older files) read too."""
    max_repeats = reader.optional_int(doc, "max_repeats", "", repeats)
    cv_threshold = reader.optional_number(doc, "cv_threshold", "")
    torch_threads = reader.optional_int(doc, "torch_threads", "", 1)
    interop_threads = reader.optional_int(doc, "torch_interop_threads", "", 1)
    cores = reader.optional_int(doc, "available_cores", "", 1)
    warnings = reader.optional_strings(doc, "warnings", "")
    noisy = reader.optional_flag(doc, "noisy", "")
    try:
        return ProfileResult(
            tuple(rows),
            oom,
            device,
            model,
            repeats,
            max_repeats=max_repeats,
            cv_threshold=cv_threshold,
            torch_threads=torch_threads,
            torch_interop_threads=interop_threads,
            available_cores=cores,
            warnings=warnings,
            noisy=noisy,
        )
    except (TypeError, ValueError) as exc:
        raise reader.fail(None, str(exc)) from exc


def _read_document(reader: _Reader, decoded: Any) -> tuple[ProfileResult, Recommendation | None]:
    if not isinstance(decoded, dict):
        raise reader.fail(None, f"must hold a JSON object, got {_json_type(decoded)}")
    doc: dict[str, Any] = decoded
    schema = reader.get(doc, "schema")
    if schema != SCHEMA:
        raise reader.fail("schema", f"must be {SCHEMA!r}, got {schema!r}")
    model = reader.as_str(reader.get(doc, "model"), "model")
    device = reader.as_str(reader.get(doc, "device"), "device")
    repeats = reader.as_int(reader.get(doc, "repeats"), "repeats", minimum=1)
    rows = _read_rows(reader, doc)
    oom = reader.as_optional_int(reader.get(doc, "oom_batch_size"), "oom_batch_size", minimum=1)
    if oom is not None and oom <= rows[-1].batch_size:
        raise reader.fail(
            "oom_batch_size",
            f"must be larger than every row's batch size (largest: {rows[-1].batch_size}), "
            f"got {oom}",
        )
    result = _result(reader, doc, rows, oom, device, model, repeats)
    knee = reader.as_object(reader.get(doc, "knee"), "knee")
    knee_size = reader.as_int(reader.get(knee, "batch_size", "knee."), "knee.batch_size")
    if knee_size not in result.batch_sizes:
        raise reader.fail(
            "knee.batch_size",
            f"{knee_size} is not among the rows' batch sizes {list(result.batch_sizes)}",
        )
    recommendation = _read_recommendation(reader, reader.get(doc, "recommendation"))
    return result, recommendation

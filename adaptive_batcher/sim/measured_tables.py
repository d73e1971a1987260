"""The measured tables shipped as package data (``adaptive_batcher/data/h200/`` and ``cpu/``).

Measured on one NVIDIA H200, 2026-11-29, PyTorch 2.11.0+cu130, bf16 eager, random weights, by
this project's measurement campaign (columns in ``adaptive_batcher/data/h200/README.md``).
Tables are read with :mod:`importlib.resources`, so they work from a wheel as well as a checkout.
CPU profiles (``adaptive_batcher/data/cpu/``) were measured on this project's 2-core CI-class
machine with ``adaptive-batcher profile``; see the README there. This module only loads the
shipped tables; the offline profiler that measures a model of your own is
:mod:`adaptive_batcher.profile`.
"""

from __future__ import annotations

import csv
import io
from importlib import resources
from pathlib import Path
from typing import Final

__all__ = [
    "CPU_PROFILES",
    "H200_TABLES",
    "MIB",
    "Row",
    "cpu_profile_path",
    "list_h200_tables",
    "load_h200_table",
]

CPU_PROFILES: Final = ("mlp_epyc_2core",)
"""Names of the shipped CPU profiles (profile JSON files without ``.json``)."""

H200_TABLES: Final = ("batch_profile", "bert_seq", "decoder_profile", "llama_kv")
"""Names of the shipped H200 tables (file names without ``.csv``)."""

MIB: Final = 1024 * 1024
"""Bytes in one MiB, the unit of the tables' ``peak_mib`` columns."""

_TEXT_COLUMNS: Final = frozenset({"model", "phase"})

Row = dict[str, str | float]
"""One table row: ``model`` and ``phase`` are strings, every other column a float."""


def list_h200_tables() -> tuple[str, ...]:
    """The names accepted by :func:`load_h200_table`, e.g. ``"batch_profile"``."""
    return H200_TABLES


def load_h200_table(name: str) -> list[Row]:
    """Parse one shipped H200 table.

    Args:
        name: a name from :data:`H200_TABLES`, with or without ``.csv``.

    Returns:
        The rows in file order, as dicts keyed by column name; ``model`` and ``phase`` keep their
        text, every other value is a float (times in ms, memory in MiB, rates per second, sizes
        in items or tokens, as the column names say).

    Raises:
        ValueError: ``name`` is not a shipped table, or a numeric cell does not parse (the
            message names the table, line and column).
    """
    stem = name.removesuffix(".csv")
    if stem not in H200_TABLES:
        raise ValueError(f"unknown H200 table {name!r}; available: {', '.join(H200_TABLES)}")
    resource = resources.files("adaptive_batcher.data") / "h200" / f"{stem}.csv"
    text = resource.read_text(encoding="utf-8")
    rows: list[Row] = []
    reader = csv.DictReader(io.StringIO(text))
    for line, raw in enumerate(reader, start=2):
        row: Row = {}
        for column, cell in raw.items():
            if column in _TEXT_COLUMNS:
                row[column] = cell
                continue
            try:
                row[column] = float(cell)
            except (TypeError, ValueError):
                raise ValueError(
                    f"{stem}.csv line {line}: column {column!r} is not a number: {cell!r}"
                ) from None
        rows.append(row)
    return rows


def cpu_profile_path(name: str) -> Path:
    """Path of a shipped CPU profile (``adaptive-batcher profile`` JSON), e.g. ``"mlp_epyc_2core"``.

    Raises:
        ValueError: an unknown name (the message lists the shipped ones).
    """
    if name not in CPU_PROFILES:
        raise ValueError(f"unknown CPU profile {name!r}; shipped: {', '.join(CPU_PROFILES)}")
    return Path(str(resources.files("adaptive_batcher.data") / "cpu" / f"{name}.json"))

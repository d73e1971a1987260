"""Shared benchmark plumbing: quiet logs, one-core pinning, and a side-by-side summary.

Each benchmark adds its headline figure with ``report(group, name, value, unit)``; at the end of the
session a table per group is printed with every figure and its ratio to the group's reference
(ours), and written to ``benchmarks/results/<group>.md`` (not committed).
"""

from __future__ import annotations

import logging
import os
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog

RESULTS: dict[str, list[tuple[str, float, str]]] = defaultdict(list)
RESULTS_DIR = Path(__file__).parent / "results"


def report(group: str, name: str, value: float, unit: str) -> None:
    """Record one headline figure for the side-by-side summary."""
    RESULTS[group].append((name, value, unit))


@pytest.fixture(autouse=True, scope="session")
def _quiet_logs() -> None:
    # what an application in production does: library debug events are filtered out
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))


@pytest.fixture
def one_core() -> Iterator[None]:
    """Pin the process to one CPU for the duration of a benchmark (Linux; no-op elsewhere)."""
    if not hasattr(os, "sched_setaffinity"):
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(before)})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not RESULTS:
        return
    RESULTS_DIR.mkdir(exist_ok=True)
    for group, rows in RESULTS.items():
        reference = rows[0][1]
        lines = [
            f"### {group}",
            "",
            "| batcher | value | unit | ratio to first |",
            "|---|---|---|---|",
        ]
        for name, value, unit in rows:
            ratio = value / reference if reference else float("nan")
            lines.append(f"| {name} | {value:,.1f} | {unit} | {ratio:.2f} |")
        text = "\n".join(lines) + "\n"
        (RESULTS_DIR / f"{group}.md").write_text(text)
        terminalreporter.write_line("")
        for line in lines:
            terminalreporter.write_line(line)

"""Shared benchmark plumbing: quiet logs, one-core pinning, a side-by-side summary, and the
durations of the chaos and soak runs.

Each benchmark adds its headline figure with ``report(group, name, value, unit)``; at the end of the
session a table per group is printed with every figure and its ratio to the group's reference
(ours), and written to ``benchmarks/results/<group>.md`` (not committed). ``report_lines(name,
lines)`` adds free-form markdown (the chaos and soak tables), printed and written the same way.

Options: ``--chaos-seconds`` (real time per chaos seed, default 30 or ``ADAPTIVE_BATCHER_CHAOS_S``)
and ``--soak-seconds`` (length of the soak run, default 60 or ``ADAPTIVE_BATCHER_SOAK_S``; 600 for
the ten-minute soak).
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
LINES: dict[str, list[str]] = {}
RESULTS_DIR = Path(__file__).parent / "results"


def report(group: str, name: str, value: float, unit: str) -> None:
    """Record one headline figure for the side-by-side summary."""
    RESULTS[group].append((name, value, unit))


def report_lines(name: str, lines: list[str]) -> None:
    """Record markdown lines, printed at the end and written to ``results/<name>.md``."""
    LINES[name] = list(lines)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("adaptive_batcher benchmarks")
    group.addoption(
        "--chaos-seconds",
        type=float,
        default=float(os.environ.get("ADAPTIVE_BATCHER_CHAOS_S", "30")),
        help="real time per chaos seed, seconds (env ADAPTIVE_BATCHER_CHAOS_S; default 30)",
    )
    group.addoption(
        "--soak-seconds",
        type=float,
        default=float(os.environ.get("ADAPTIVE_BATCHER_SOAK_S", "60")),
        help="length of the soak run, seconds (env ADAPTIVE_BATCHER_SOAK_S; default 60, "
        "600 for the ten-minute soak)",
    )


@pytest.fixture
def chaos_seconds(request: pytest.FixtureRequest) -> float:
    """Real time per chaos seed, seconds."""
    return float(request.config.getoption("--chaos-seconds"))


@pytest.fixture
def soak_seconds(request: pytest.FixtureRequest) -> float:
    """Length of the soak run, seconds."""
    return float(request.config.getoption("--soak-seconds"))


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
    if not RESULTS and not LINES:
        return
    RESULTS_DIR.mkdir(exist_ok=True)
    for name, lines in LINES.items():
        (RESULTS_DIR / f"{name}.md").write_text("\n".join(lines) + "\n")
        terminalreporter.write_line("")
        for line in lines:
            terminalreporter.write_line(line)
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

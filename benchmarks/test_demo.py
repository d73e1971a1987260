"""The real-time demo (issue 10's target): ``adaptive-batcher demo`` with the controller against
``adaptive-batcher demo --static``, on an idle machine and with two busy-loop processes running.

Each condition runs ``RUNS`` pairs, controller and static interleaved so drift in the machine's
load reaches both alike; every run is a fresh process of the command a user types, read from its
summary table. Target: in every run the controller answers at least as many requests within the
SLO as ``--static`` in the run beside it, up to chance (``benchmarks/chance.py``). Also
reported: device time per request (the cost the controller's wider window saves) and p99. About
25 s per run, 2 x 2 x 3 runs.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from benchmarks.chance import no_worse_beyond_chance
from benchmarks.conftest import report_lines

RUNS = 3
BUSY_LOOPS = 2
# the summary table's rows (rich draws it with │ between label and value)
FIELDS = {
    "completed": "requests completed",
    "within_slo": r"answered within the SLO \([\d.]+ ms\)",
    "lost": "requests shed, failed or rejected",
    "device_ms_per_request": "device time per request, ms",
    "mean_batch": "mean batch size",
    "p99_ms": "p99 latency, ms",
}


def run_demo(static: bool) -> dict[str, float]:
    """One ``adaptive-batcher demo`` run in a fresh process: its summary figures."""
    command = [sys.executable, "-m", "adaptive_batcher.cli.main", "demo"]
    env = dict(os.environ, COLUMNS="200")  # wide enough that no value is cut
    output = subprocess.run(
        [*command, *(["--static"] if static else [])],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        timeout=300,
    ).stdout
    summary = output[output.rfind("summary") :]
    figures = {}
    for name, label in FIELDS.items():
        found = re.search(label + r"\s*│\s*([\d.]+)", summary)
        assert found, f"no {name!r} in the demo's summary:\n{summary}"
        figures[name] = float(found.group(1))
    return figures


@contextmanager
def busy_loops(count: int) -> Iterator[None]:
    """``count`` processes spinning on the CPU for the duration of the block."""
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        time.sleep(1.0)  # let them start spinning
        yield
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()


@pytest.mark.parametrize("condition", ["idle", "busy"])
def test_demo_controller_vs_static(benchmark: Any, condition: str) -> None:
    pairs: list[tuple[dict[str, float], dict[str, float]]] = []

    def runs() -> None:
        with busy_loops(BUSY_LOOPS if condition == "busy" else 0):
            for _ in range(RUNS):
                pairs.append((run_demo(static=False), run_demo(static=True)))

    benchmark.pedantic(runs, rounds=1, iterations=1)
    lines = [
        f"### demo, {condition} machine ({BUSY_LOOPS if condition == 'busy' else 0} busy loops)",
        "",
        "| run | within SLO: ours / static | lost: ours / static | device ms per request: "
        "ours / static (ratio) | p99 ms: ours / static |",
        "|---|---|---|---|---|",
    ]
    for index, (ours, static) in enumerate(pairs):
        ratio = ours["device_ms_per_request"] / static["device_ms_per_request"]
        lines.append(
            f"| {index + 1} | {ours['within_slo']:.0f} / {static['within_slo']:.0f} "
            f"| {ours['lost']:.0f} / {static['lost']:.0f} "
            f"| {ours['device_ms_per_request']:.3f} / {static['device_ms_per_request']:.3f} "
            f"({ratio:.2f}) | {ours['p99_ms']:.1f} / {static['p99_ms']:.1f} |"
        )
    report_lines(f"demo_{condition}", lines)
    benchmark.extra_info["pairs"] = pairs
    for ours, static in pairs:
        offered = round(ours["completed"] + ours["lost"])
        assert offered == round(static["completed"] + static["lost"]), lines  # same arrivals
        assert no_worse_beyond_chance(
            round(ours["within_slo"]), round(static["within_slo"]), offered
        ), lines

"""Chaos runs (issue 13): real-time Poisson load with a random mix of model failures, OOM splits,
hung calls, cancellations, deadlines, queue-full bursts, run-time setting changes and closes of
every kind, against ``AdaptiveBatcher`` with the async, thread and inline executors; and (issue 22)
stuck telemetry, stalling and raising batch listeners, and streams read by two tasks at once.
Every seed must lose no request (``lost``: callers with no outcome or one they cannot get).

Each seed runs ``--chaos-seconds`` (default 30) of real time as a sequence of batcher lifetimes;
the invariants of :mod:`benchmarks.chaos` are checked after every one. The fault mix and the
counts go to the terminal summary, ``benchmarks/results/chaos_seed_<n>.md`` and pytest-benchmark's
``extra_info``. Bounded and not part of the unit-test run.
"""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.chaos import ChaosReport, flat_info, run_chaos, summary_lines
from benchmarks.conftest import report, report_lines

SEEDS = (1, 2, 3, 4, 5, 6)


@pytest.mark.parametrize("seed", SEEDS)
def test_chaos(benchmark: Any, chaos_seconds: float, seed: int) -> None:
    runs: list[ChaosReport] = []
    benchmark.pedantic(lambda: runs.append(run_chaos(seed, chaos_seconds)), rounds=1, iterations=1)
    result = runs[0]
    benchmark.extra_info.update(flat_info(result))
    report_lines(f"chaos_seed_{seed}", summary_lines(result))
    report("chaos_requests_submitted", f"seed {seed}", result.submitted, "requests")
    report("chaos_requests_lost", f"seed {seed}", result.lost, "requests")
    assert not result.violations, "\n".join(result.violations[:30])
    assert result.lost == 0
    # the run exercised what it claims to (a run with no faults would prove nothing)
    outcomes = result.outcomes
    assert outcomes["ok"] > 1000
    assert outcomes["cancelled"] > 0 and outcomes["expired"] > 0
    assert outcomes["slot_error"] > 0 and outcomes["batch_failed_transient"] > 0
    assert result.faults["oom_raised"] > 0
    # issue 22's faults: a stuck telemetry reading at a close, a listener raising a
    # BaseException and one stalling the loop, streams read by two tasks at once
    assert result.faults["closes_with_stuck_telemetry"] > 0
    assert result.faults["listener_raised"] + result.faults["listener_stalls"] > 0
    assert result.faults["concurrent_readers"] > 0
    assert outcomes["ok"] > 0

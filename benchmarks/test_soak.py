"""Soak run (issue 13): steady Poisson load, 1 % of requests timing out and 1 % cancelled, and
no drift over time: throughput holds, p99 does not climb, memory stays bounded, nothing backs up.

``--soak-seconds`` (default 60, or ``ADAPTIVE_BATCHER_SOAK_S``) sets the length; 600 gives the
ten-minute soak. The per-interval table goes to the terminal summary, ``benchmarks/results/
soak.md`` and pytest-benchmark's ``extra_info``.

Bounds, and why:

* throughput: the last interval answers at least 0.9x the requests per second of the first (the
  load is open-loop at a rate well within capacity, so a drop means the batcher fell behind);
* p99: the median of the last third of the intervals' p99 is at most 1.5x the median of the
  first third plus 2 ms (medians, so that one interval disturbed by the shared machine does not
  decide);
* memory, from the end of the first interval to the end: resident set growth at most 16 MiB,
  at most 2000 more objects tracked by the garbage collector and at most 20,000 more allocated
  blocks; these stay the same for the ten-minute run, so a leak of one object per 250 requests
  served fails it (800 req/s for 600 s is 480,000 requests);
* the queue holds at most one full batch (64) at every interval's end.
"""

from __future__ import annotations

import statistics
from typing import Any

from benchmarks.conftest import report, report_lines
from benchmarks.soak import SoakReport, flat_info, run_soak, summary_lines

INTERVAL_S = 5.0
MAX_RSS_GROWTH_BYTES = 16 * 2**20
MAX_GC_OBJECT_GROWTH = 2000
MAX_ALLOCATED_BLOCK_GROWTH = 20_000
MAX_QUEUE_DEPTH = 64


def test_soak(benchmark: Any, soak_seconds: float) -> None:
    runs: list[SoakReport] = []
    benchmark.pedantic(
        lambda: runs.append(run_soak(soak_seconds, INTERVAL_S)), rounds=1, iterations=1
    )
    result = runs[0]
    benchmark.extra_info.update(flat_info(result))
    report_lines("soak", summary_lines(result))
    intervals = result.intervals
    first, last = intervals[0], intervals[-1]
    report("soak_answered_per_s", "first interval", first.answered_per_s, "req/s")
    report("soak_answered_per_s", "last interval", last.answered_per_s, "req/s")

    # every request ended, each with its own answer or an expected error
    counts, outcomes = result.counts, result.outcomes
    assert counts is not None and result.unsettled == 0
    ended = counts.completed + counts.failed + counts.rejected + counts.expired + counts.cancelled
    assert counts.submitted == ended == outcomes["started"]
    assert set(outcomes) <= {"ok", "expired", "cancelled", "started"}, outcomes
    assert outcomes["expired"] > 0 and outcomes["cancelled"] > 0  # the faults did happen

    # no drift
    assert len(intervals) >= 3
    assert last.answered_per_s >= 0.9 * first.answered_per_s
    third = max(1, len(intervals) // 3)
    early = statistics.median(i.p99_ms for i in intervals[:third])
    late = statistics.median(i.p99_ms for i in intervals[-third:])
    assert late <= 1.5 * early + 2.0, (early, late)
    assert last.rss_bytes - first.rss_bytes <= MAX_RSS_GROWTH_BYTES
    assert last.gc_objects - first.gc_objects <= MAX_GC_OBJECT_GROWTH
    assert last.allocated_blocks - first.allocated_blocks <= MAX_ALLOCATED_BLOCK_GROWTH
    assert max(i.queue_depth for i in intervals) <= MAX_QUEUE_DEPTH

"""Soak harness: steady Poisson load with 1 % of requests timing out and 1 % cancelled, measured
per interval, to catch drift (the class of Triton issue #8870: throughput falling over time when
requests time out).

Per interval: requests answered per second, p50 and p99 of the callers' latency (ms, successful
requests), deadline expiries and cancellations, queue depth, and the process's memory: resident
set size (``/proc/self/statm``), ``sys.getallocatedblocks()`` and the number of objects the garbage
collector tracks (both after ``gc.collect()``).
"""

from __future__ import annotations

import asyncio
import gc
import math
import os
import random
import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from adaptive_batcher import SLO, AdaptiveBatcher, DeadlineExceededError
from adaptive_batcher.metrics.recorder import Counts

RATE_PER_S = 800.0
TIMEOUT_FRACTION = 0.01  # requests with a deadline below the queueing they meet
TIMEOUT_DEADLINE_MS = 0.5
CANCEL_FRACTION = 0.01
SERVICE_BASE_S = 0.002
SERVICE_PER_ITEM_S = 0.00005


def rss_bytes() -> int:
    """The process's resident set size, bytes (Linux ``/proc``; 0 where it is missing)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


@dataclass(frozen=True)
class Interval:
    """One measured interval of the soak run."""

    index: int
    end_s: float
    answered_per_s: float
    p50_ms: float
    p99_ms: float
    expired: int
    cancelled: int
    queue_depth: int
    rss_bytes: int
    allocated_blocks: int
    gc_objects: int


@dataclass
class SoakReport:
    """The intervals, the outcome tally and the batcher's final counts."""

    duration_s: float
    interval_s: float
    intervals: list[Interval] = field(default_factory=list)
    outcomes: Counter[str] = field(default_factory=Counter)
    counts: Counts | None = None
    unsettled: int = 0


class _Window:
    """What happened since the last interval boundary."""

    def __init__(self) -> None:
        self.latencies_ms: list[float] = []
        self.expired = 0
        self.cancelled = 0


async def _model(batch: list[int]) -> list[int]:
    await asyncio.sleep(SERVICE_BASE_S + SERVICE_PER_ITEM_S * len(batch))
    return [-token for token in batch]


class SoakRun:
    """Drives one batcher for ``duration_s`` seconds and measures it every ``interval_s``."""

    def __init__(self, duration_s: float, interval_s: float, seed: int) -> None:
        self.rng = random.Random(seed)
        self.report = SoakReport(duration_s, interval_s)
        self.window = _Window()
        self.tasks: set[asyncio.Task[None]] = set()
        self.started = 0
        self.batcher: AdaptiveBatcher[int, int] = AdaptiveBatcher(
            _model,
            max_batch_size=64,
            window_ms=2.0,
            slo=SLO(latency_ms=25.0),
            name="soak",
        )

    async def _call(self, token: int, deadline_ms: float | None) -> None:
        loop = asyncio.get_running_loop()
        self.started += 1
        start = loop.time()
        outcome = "ok"
        try:
            result = await self.batcher.submit(token, deadline_ms=deadline_ms)
            if result != -token:
                outcome = "wrong_result"
            else:
                self.window.latencies_ms.append((loop.time() - start) * 1e3)
        except DeadlineExceededError:
            outcome = "expired"
            self.window.expired += 1
        except asyncio.CancelledError:
            self.window.cancelled += 1
            self.report.outcomes["cancelled"] += 1
            raise
        except Exception as exc:
            outcome = f"error_{type(exc).__name__}"
        self.report.outcomes[outcome] += 1

    def _spawn(self, token: int) -> None:
        rng = self.rng
        draw = rng.random()
        deadline = TIMEOUT_DEADLINE_MS if draw < TIMEOUT_FRACTION else None
        loop = asyncio.get_running_loop()
        task = loop.create_task(self._call(token, deadline))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        if TIMEOUT_FRACTION <= draw < TIMEOUT_FRACTION + CANCEL_FRACTION:
            loop.call_later(rng.uniform(0.0, 0.004), task.cancel)

    async def _load(self, until: float) -> None:
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        token = 0
        while next_at < until:
            now = loop.time()
            while next_at <= now:
                token += 1
                self._spawn(token)
                next_at += self.rng.expovariate(RATE_PER_S)
            await asyncio.sleep(max(0.0, next_at - loop.time()))

    def _measure(self, index: int, end_s: float) -> None:
        window, self.window = self.window, _Window()
        gc.collect()
        latencies = np.asarray(window.latencies_ms)
        p50, p99 = (
            (float(np.percentile(latencies, 50)), float(np.percentile(latencies, 99)))
            if latencies.size
            else (math.nan, math.nan)
        )
        self.report.intervals.append(
            Interval(
                index=index,
                end_s=end_s,
                answered_per_s=latencies.size / self.report.interval_s,
                p50_ms=p50,
                p99_ms=p99,
                expired=window.expired,
                cancelled=window.cancelled,
                queue_depth=self.batcher.stats().queue_depth,
                rss_bytes=rss_bytes(),
                allocated_blocks=sys.getallocatedblocks(),
                gc_objects=len(gc.get_objects()),
            )
        )

    async def run(self) -> SoakReport:
        loop = asyncio.get_running_loop()
        start = loop.time()
        interval_s = self.report.interval_s
        count = max(1, round(self.report.duration_s / interval_s))
        load = asyncio.ensure_future(self._load(start + count * interval_s))
        for index in range(count):
            await asyncio.sleep(max(0.0, start + (index + 1) * interval_s - loop.time()))
            self._measure(index, loop.time() - start)
        await load
        await self.batcher.aclose()
        if self.tasks:
            await asyncio.wait(set(self.tasks), timeout=10.0)
        self.report.unsettled = sum(not task.done() for task in self.tasks)
        self.report.counts = self.batcher.stats().counts
        self.report.outcomes["started"] = self.started
        return self.report


def run_soak(duration_s: float, interval_s: float = 5.0, seed: int = 0) -> SoakReport:
    """Run the soak on a new event loop."""
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(SoakRun(duration_s, interval_s, seed).run())
    finally:
        loop.close()


def summary_lines(report: SoakReport) -> list[str]:
    """The per-interval table and the outcome tally, markdown."""
    lines = [
        f"### soak: {report.duration_s:.0f} s at {RATE_PER_S:.0f} req/s (Poisson), "
        f"{TIMEOUT_FRACTION:.0%} with deadline {TIMEOUT_DEADLINE_MS} ms, "
        f"{CANCEL_FRACTION:.0%} cancelled",
        "",
        "| t (s) | answered/s | p50 ms | p99 ms | expired | cancelled | queue | RSS MiB "
        "| allocated blocks | gc objects |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for i in report.intervals:
        lines.append(
            f"| {i.end_s:.0f} | {i.answered_per_s:.0f} | {i.p50_ms:.2f} | {i.p99_ms:.2f} "
            f"| {i.expired} | {i.cancelled} | {i.queue_depth} | {i.rss_bytes / 2**20:.1f} "
            f"| {i.allocated_blocks} | {i.gc_objects} |"
        )
    lines += ["", f"outcomes: {dict(sorted(report.outcomes.items()))}", f"counts: {report.counts}"]
    return lines


def flat_info(report: SoakReport) -> dict[str, Any]:
    """``extra_info`` for pytest-benchmark."""
    info: dict[str, Any] = {"duration_s": report.duration_s, "interval_s": report.interval_s}
    for i in report.intervals:
        info[f"t{i.end_s:.0f}_answered_per_s"] = round(i.answered_per_s, 1)
        info[f"t{i.end_s:.0f}_p99_ms"] = round(i.p99_ms, 3)
        info[f"t{i.end_s:.0f}_rss_mib"] = round(i.rss_bytes / 2**20, 2)
        info[f"t{i.end_s:.0f}_gc_objects"] = i.gc_objects
    info.update({f"outcome_{k}": v for k, v in report.outcomes.items()})
    return info

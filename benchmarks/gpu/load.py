"""Open-loop load on a batcher: Poisson arrivals (``adaptive_batcher.sim.workloads.Poisson``),
one task per request, each request's outcome and latency as its caller saw it.

A request is *lost* when its caller got neither a result nor an error by the end (after the
drain and a close): the one outcome the library promises never happens.
"""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from adaptive_batcher import (
    AdaptiveBatcher,
    BatcherClosedError,
    DeadlineExceededError,
    QueueFullError,
)
from adaptive_batcher.sim.workloads import Poisson

__all__ = ["LoadRun", "poisson_times", "quantile_ms"]

Mark = tuple[float, Callable[[], None]]


def poisson_times(rate_rps: float, duration_s: float, seed: int) -> Sequence[float]:
    """Arrival times (s from 0) of a Poisson process, from the simulator's workload."""
    arrivals = Poisson(rate_rps).generate(duration_s, np.random.default_rng(seed))
    return [float(t) for t in arrivals.times_s]


def quantile_ms(latencies_s: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of latencies in seconds, in ms; NaN when there are none."""
    if not latencies_s:
        return math.nan
    return float(np.quantile(np.asarray(latencies_s), q)) * 1e3


class LoadRun:
    """Drives one batcher with arrivals and records what each caller got."""

    def __init__(self, batcher: AdaptiveBatcher[int, Any]) -> None:
        self.batcher = batcher
        self.latencies_s: list[float] = []
        self.lags_s: list[float] = []
        self.outcomes: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.spawned = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop = asyncio.get_running_loop()

    async def _call(self, item: int) -> None:
        loop = self._loop
        start = loop.time()
        try:
            await self.batcher.submit(item)
        except DeadlineExceededError:
            self.outcomes["expired"] += 1
        except (QueueFullError, BatcherClosedError):
            self.outcomes["rejected"] += 1
        except asyncio.CancelledError:
            self.outcomes["cancelled"] += 1
            raise
        except Exception as exc:
            self.outcomes["failed"] += 1
            self.errors[type(exc).__name__] += 1
        else:
            self.outcomes["completed"] += 1
            self.latencies_s.append(loop.time() - start)

    def spawn(self, count: int = 1) -> None:
        """Submit ``count`` requests now, each in its own task."""
        for _ in range(count):
            self.spawned += 1
            task = self._loop.create_task(self._call(self.spawned))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def drive(self, times_s: Sequence[float], marks: Sequence[Mark] = ()) -> float:
        """Submit a request at each time in ``times_s`` (s from now), and call each mark's
        function once its time has come; returns the loop time at the start.

        Requests due while the loop was busy go out together as soon as it is free; how late
        they were is kept in ``lags_s``.
        """
        loop = self._loop
        start = loop.time()
        pending = sorted(marks, key=lambda mark: mark[0])
        index, count = 0, len(times_s)
        while index < count or pending:
            now = loop.time() - start
            while pending and pending[0][0] <= now:
                pending.pop(0)[1]()
            while index < count and times_s[index] <= now:
                self.lags_s.append(now - times_s[index])
                self.spawn()
                index += 1
            upcoming = [times_s[index]] if index < count else []
            upcoming += [pending[0][0]] if pending else []
            if upcoming:
                await asyncio.sleep(max(0.0, min(upcoming) - (loop.time() - start)))
        return start

    @property
    def unsettled(self) -> int:
        """Requests whose callers are still waiting."""
        return len(self._tasks)

    async def settle(self, timeout_s: float) -> int:
        """Wait up to ``timeout_s`` for every caller to end; returns how many still wait."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout_s)
        return self.unsettled

    async def finish(self, timeout_s: float) -> int:
        """Close the batcher (queued requests fail with ``BatcherClosedError``), wait for the
        callers, cancel any still waiting; returns that number: the lost requests."""
        await self.batcher.aclose(drain=False, timeout_s=timeout_s)
        lost = await self.settle(timeout_s)
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout_s)
        return lost

"""One stall of the event loop (a full garbage collection) under load: the controller rides it out.

On a virtual clock (deterministic): Poisson 1500 req/s against a model of 3 ms + 0.2 ms per
item, SLO p99 60 ms, the default PID; at 6 s the loop stands still for 150 ms. The batch running
meanwhile measures the whole stall, and the requests that arrive during it wait it out: the
latency measure (p99 over the last 2 s) holds the stall for 2 s and the window narrows for that
long, but the cap must not move (a stall is not a change of service time) and the window must
come back once the stall has left the measure. With seed 1 the stalled batch is of a size the
service-time estimator had seen once: taken as is, the stall became that size's median and the
monotone fit carried it up to the cap, which halved for good.
"""

from __future__ import annotations

import asyncio
import gc
import random
import statistics
from collections.abc import Iterator, MutableMapping
from typing import Any

import pytest
import structlog
from structlog.testing import capture_logs

from adaptive_batcher import SLO, AdaptiveBatcher
from adaptive_batcher.runtime.collector import FREEZE_ADVICE
from adaptive_batcher.testing import VirtualClockLoop, run_in_virtual_time

RATE_RPS = 1500.0
STALL_AT_S = 6.0
STALL_S = 0.15
RUN_S = 10.0


async def model(batch: list[Any]) -> list[Any]:
    await asyncio.sleep(0.003 + 0.0002 * len(batch))
    return batch


def decision_events(_: Any, __: str, event: MutableMapping[str, Any]) -> Any:
    """Keep the decisions and the stalls, with the loop's time of each."""
    if event.get("event") not in ("controller.decision", "batcher.loop_stalled"):
        raise structlog.DropEvent
    event["at_s"] = asyncio.get_running_loop().time()
    return event


async def poisson_load(
    batcher: AdaptiveBatcher[Any, Any], rate_rps: float, until_s: float, seed: int
) -> None:
    """Submit ``0`` at Poisson times of ``rate_rps`` until ``until_s`` on the loop's clock,
    then wait for every answer; each request ends with its result."""
    loop = asyncio.get_running_loop()
    rng = random.Random(seed)
    pending: set[asyncio.Task[Any]] = set()
    t = loop.time()
    while t < until_s:
        while t <= loop.time():
            task = loop.create_task(batcher.submit(0))
            pending.add(task)
            task.add_done_callback(pending.discard)
            t += rng.expovariate(rate_rps)
        await asyncio.sleep(t - loop.time())
    await asyncio.gather(*pending)
    counts = batcher.stats().counts
    assert counts.completed == counts.submitted


async def serve(seed: int) -> None:
    loop = asyncio.get_running_loop()
    assert isinstance(loop, VirtualClockLoop)
    batcher = AdaptiveBatcher(model, max_batch_size=64, window_ms=5.0, slo=SLO(latency_ms=60.0))
    async with batcher:
        loop.call_at(STALL_AT_S, loop.stall, STALL_S)
        await poisson_load(batcher, RATE_RPS, RUN_S, seed)


@pytest.mark.parametrize("seed", [0, 1])
def test_one_stall_moves_neither_the_cap_nor_the_window_for_long(seed: int) -> None:
    with capture_logs(processors=[decision_events]) as logs:
        run_in_virtual_time(serve(seed))
    decisions = [e for e in logs if e["event"] == "controller.decision"]
    trace = [(e["at_s"], e["window_ms"], e["max_batch_size"]) for e in decisions]
    before = [d for d in trace if STALL_AT_S - 2.0 <= d[0] < STALL_AT_S]
    after = [d for d in trace if d[0] >= STALL_AT_S]
    assert before and after
    assert min(cap for _, _, cap in after) >= min(cap for _, _, cap in before)
    usual_ms = statistics.median(window for _, window, _ in before)
    back_s = next(at for at, window, _ in after if window >= 0.5 * usual_ms)
    assert back_s - STALL_AT_S <= 2.5  # the latency measure's span (2 s) and a tick


async def _slow(batch: list[Any]) -> list[Any]:
    await asyncio.sleep(0.03)
    return batch


async def _stall_with_no_window_timer() -> None:
    loop = asyncio.get_running_loop()
    assert isinstance(loop, VirtualClockLoop)
    batcher = AdaptiveBatcher(_slow, max_batch_size=4, window_ms=0.0)
    async with batcher:
        first = [loop.create_task(batcher.submit(i)) for i in range(4)]  # a full batch runs
        await asyncio.sleep(0.005)
        queued = [loop.create_task(batcher.submit(i)) for i in range(4)]  # waits for the slot
        await asyncio.sleep(0.005)
        loop.stall(0.1)  # no window timer is pending: only the heartbeat fires late
        await asyncio.gather(*first, *queued)


def test_a_stall_with_no_window_timer_pending_is_seen_once() -> None:
    with capture_logs() as logs:
        run_in_virtual_time(_stall_with_no_window_timer())
    stalls = [e for e in logs if e["event"] == "batcher.loop_stalled"]
    assert len(stalls) == 1
    assert stalls[0]["late_ms"] >= 50.0


async def _numpy_clock() -> int:
    import numpy as np

    async def fast(batch: list[Any]) -> list[Any]:
        await asyncio.sleep(0.002 + 0.0001 * len(batch))
        return batch

    batcher = AdaptiveBatcher(fast, max_batch_size=64, window_ms=5.0, slo=SLO(latency_ms=50.0))
    with capture_logs() as logs:
        tasks = []
        for _ in range(2000):
            await asyncio.sleep(np.float64(0.001))  # the loop's clock becomes a numpy float
            tasks.append(asyncio.create_task(batcher.submit(0)))
        await asyncio.gather(*tasks)
        await batcher.aclose()
    return sum(e["event"] == "controller.failed" for e in logs)


def test_a_numpy_clock_does_not_fail_the_controller() -> None:
    """Gaps drawn with numpy make the virtual loop's time a numpy float; the service-time
    estimator's change test then subtracted numpy booleans and every tick failed."""
    assert run_in_virtual_time(_numpy_clock()) == 0


async def _stall_holding(collect: bool) -> None:
    loop = asyncio.get_running_loop()
    assert isinstance(loop, VirtualClockLoop)
    batcher = AdaptiveBatcher(_slow, max_batch_size=4, window_ms=0.0)
    async with batcher:
        first = [loop.create_task(batcher.submit(i)) for i in range(8)]
        await asyncio.sleep(0.005)
        if collect:
            gc.collect()  # a full collection inside the stall
        loop.stall(0.1)
        await asyncio.gather(*first)


def _stall_events(collect: bool) -> list[MutableMapping[str, Any]]:
    gc.disable()  # no collection of the collector's own choosing in the run
    try:
        with capture_logs() as logs:
            run_in_virtual_time(_stall_holding(collect))
    finally:
        gc.enable()
    return [e for e in logs if e["event"] == "batcher.loop_stalled"]


@pytest.fixture
def unfrozen() -> Iterator[None]:
    frozen = gc.get_freeze_count()
    gc.unfreeze()
    yield
    if frozen:
        gc.freeze()


@pytest.mark.usefixtures("unfrozen")
def test_a_stall_that_held_a_full_collection_says_so_and_how_to_avoid_it() -> None:
    """Before: the README's app stood still 100-160 ms in its first second of traffic, every
    start, and the event did not say why (generation-2 collections walking torch's objects)."""
    [stall] = _stall_events(collect=True)
    assert stall["full_gc"] == 1
    assert stall["advice"] == FREEZE_ADVICE


@pytest.mark.usefixtures("unfrozen")
def test_a_stall_without_a_collection_gives_no_advice() -> None:
    [stall] = _stall_events(collect=False)
    assert stall["full_gc"] == 0
    assert "advice" not in stall


@pytest.mark.usefixtures("unfrozen")
def test_a_frozen_heap_gets_the_count_without_the_advice() -> None:
    gc.freeze()
    [stall] = _stall_events(collect=True)
    assert stall["full_gc"] == 1
    assert "advice" not in stall

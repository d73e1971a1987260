"""Warm-up starts the controller's service-time model: a cold burst on a slow model is shed
from the first tick, instead of after the first 8 batches (virtual time)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from structlog.testing import capture_logs

from adaptive_batcher import SLO, AdaptiveBatcher, BatcherClosedError, DeadlineExceededError
from adaptive_batcher.testing import run_in_virtual_time

SLO_300 = SLO(latency_ms=300.0)
BATCH_S = 0.040  # a slow model (an LLM prefill): 6 batches before the first tick at 0.25 s


async def model(batch: list[Any]) -> list[Any]:
    await asyncio.sleep(BATCH_S)
    return batch


async def cold_burst(warm_up: bool) -> list[tuple[float, bool]]:
    """(answered at s, within the SLO) for each of 2000 requests sent at once at start."""
    loop = asyncio.get_running_loop()
    async with AdaptiveBatcher(
        model, max_batch_size=16, window_ms=0.0, slo=SLO_300, shed_late=True
    ) as batcher:
        if warm_up:
            await batcher.warmup(lambda: 0)
        start = loop.time()

        async def one() -> tuple[float, bool]:
            try:
                await batcher.submit(0)
            except DeadlineExceededError:
                return loop.time() - start, True  # shed: not a late answer
            answered = loop.time() - start
            return answered, answered <= SLO_300.latency_ms / 1e3

        return await asyncio.gather(*(one() for _ in range(2000)))


@pytest.mark.parametrize("warm_up", [True, False])
def test_after_warm_up_shedding_starts_at_the_first_tick(warm_up: bool) -> None:
    outcomes = run_in_virtual_time(cold_burst(warm_up))
    # the first tick is at 0.25 s; the requests queued then expire by 0.26 s, so every batch
    # that starts after that ends within the SLO
    late_after_first_tick = [t for t, ok in outcomes if t > 0.26 + BATCH_S and not ok]
    if warm_up:
        assert late_after_first_tick == []
    else:  # without a warm-up the plan waits for 8 batches: the next tick, at 0.5 s
        assert late_after_first_tick
        assert max(late_after_first_tick) <= 0.5 + 2 * BATCH_S


def test_warm_up_runs_each_size_twice_more_warm_only_for_a_controller_with_an_slo() -> None:
    calls: list[int] = []

    async def counting(batch: list[Any]) -> list[Any]:
        calls.append(len(batch))
        return batch

    async def warm(**kwargs: Any) -> None:
        async with AdaptiveBatcher(counting, max_batch_size=4, **kwargs) as batcher:
            await batcher.warmup(lambda: 0)

    run_in_virtual_time(warm(slo=SLO_300))
    assert calls == [1, 2, 4, 1, 1, 2, 2, 4, 4]  # cold, then twice warm: the model's start
    calls.clear()
    run_in_virtual_time(warm())
    assert calls == [1, 2, 4]
    calls.clear()
    run_in_virtual_time(warm(slo=SLO_300, service_profile=[(1, 1.0), (4, 2.0)]))
    assert calls == [1, 2, 4]  # the profile given is the start


def test_one_stalled_warm_call_does_not_become_the_model() -> None:
    """The faster of two warm calls seeds the model: a 100 ms stall on one call of the largest
    size (which serving may not reach for a while) does not hold the cap below it."""
    calls_at_64 = [0]

    async def stalling(batch: list[Any]) -> list[Any]:
        calls_at_64[0] += len(batch) == 64
        stall_s = 0.1 if len(batch) == 64 and calls_at_64[0] == 2 else 0.0  # first warm call
        await asyncio.sleep(0.005 + 0.0004 * len(batch) + stall_s)
        return batch

    async def seeded() -> float:
        async with AdaptiveBatcher(stalling, max_batch_size=64, slo=SLO(latency_ms=100.0)) as b:
            await b.warmup(lambda: 0)
            controller = b._core.controller
            assert controller is not None
            return controller.service_estimator.median_ms(64)

    assert run_in_virtual_time(seeded()) == pytest.approx(5.0 + 0.4 * 64)


def test_a_model_measured_at_0_ms_does_not_fail_the_controllers_ticks() -> None:
    """On the virtual clock an instant model takes 0 ms: the seeded model predicts 0, and the
    tick's log line divided by it (every tick failed with ZeroDivisionError)."""

    async def instant(batch: list[Any]) -> list[Any]:
        return batch

    async def serve() -> None:
        async with AdaptiveBatcher(instant, max_batch_size=8, slo=SLO_300) as batcher:
            await batcher.warmup(lambda: 0)
            for _ in range(40):
                await batcher.submit_many(range(4))
                await asyncio.sleep(0.05)

    with capture_logs() as logs:
        run_in_virtual_time(serve())
    assert [e for e in logs if e["event"] == "controller.failed"] == []
    assert any(e["event"] == "controller.decision" for e in logs)


def test_closing_during_warm_up_stops_it() -> None:
    calls: list[int] = []

    async def slow(batch: list[Any]) -> list[Any]:
        calls.append(len(batch))
        await asyncio.sleep(0.05)
        return batch

    async def close_midway() -> None:
        batcher = AdaptiveBatcher(slow, max_batch_size=64, slo=SLO_300)
        warming = asyncio.ensure_future(batcher.warmup(lambda: 0))
        await asyncio.sleep(0.12)  # in the third warm-up call
        await batcher.aclose()
        with pytest.raises(BatcherClosedError, match="closed during warm-up"):
            await warming

    run_in_virtual_time(close_midway())
    assert len(calls) == 3  # no call after the close (of 7 cold and 14 warm)


@pytest.mark.parametrize("sync", [False, True])
def test_closing_during_warm_up_waits_for_the_call_running(sync: bool) -> None:
    """``aclose()`` returns once the model call of the warm-up has ended, as it waits for a
    running batch: after it, nothing runs in the model (it returned 0.2 s early)."""
    ended: list[float] = []

    async def slow_async(batch: list[Any]) -> list[Any]:
        await asyncio.sleep(0.3)
        ended.append(asyncio.get_running_loop().time())
        return batch

    def slow_sync(batch: list[Any]) -> list[Any]:
        time.sleep(0.3)
        ended.append(time.monotonic())
        return batch

    async def close_midway() -> tuple[float, float]:
        batcher = AdaptiveBatcher(slow_sync if sync else slow_async, max_batch_size=8)
        warming = asyncio.ensure_future(batcher.warmup(lambda: 0))
        await asyncio.sleep(0.4)  # in the second call
        await batcher.aclose()
        closed = time.monotonic() if sync else asyncio.get_running_loop().time()
        with pytest.raises(BatcherClosedError, match="closed during warm-up"):
            await warming
        return closed, ended[-1]

    closed, last_ended = (
        asyncio.run(close_midway()) if sync else run_in_virtual_time(close_midway())
    )
    assert last_ended <= closed


@pytest.mark.parametrize("drain", [True, False])
@pytest.mark.parametrize("sync", [False, True])
def test_a_timed_out_close_during_warm_up_raises_closed_and_does_not_cancel_the_caller(
    sync: bool, drain: bool
) -> None:
    """A close whose ``timeout_s`` runs out cancels the warm-up's model call, not the task
    running ``warmup()``: that task gets ``BatcherClosedError``, as with an untimed close."""

    async def slow_async(batch: list[Any]) -> list[Any]:
        await asyncio.sleep(0.05)
        return batch

    def slow_sync(batch: list[Any]) -> list[Any]:
        time.sleep(0.05)
        return batch

    async def close_midway() -> asyncio.Task[dict[int, float]]:
        batcher = AdaptiveBatcher(slow_sync if sync else slow_async, max_batch_size=64)
        warming = asyncio.create_task(batcher.warmup(lambda: 1))
        await asyncio.sleep(0.08)  # in the second call
        await batcher.aclose(drain=drain, timeout_s=0)
        with pytest.raises(BatcherClosedError, match="closed during warm-up"):
            await warming
        return warming

    warming = asyncio.run(close_midway()) if sync else run_in_virtual_time(close_midway())
    assert not warming.cancelled()


def test_cancelling_the_warm_up_task_still_cancels_it() -> None:
    """The caller's own cancellation of ``warmup()`` is not turned into a closed error, even
    when the batcher closes meanwhile."""

    async def slow(batch: list[Any]) -> list[Any]:
        await asyncio.sleep(0.05)
        return batch

    async def cancel_midway() -> asyncio.Task[dict[int, float]]:
        batcher = AdaptiveBatcher(slow, max_batch_size=64)
        warming = asyncio.create_task(batcher.warmup(lambda: 1))
        await asyncio.sleep(0.08)
        warming.cancel()
        await batcher.aclose(timeout_s=0)
        with pytest.raises(asyncio.CancelledError):
            await warming
        return warming

    assert run_in_virtual_time(cancel_midway()).cancelled()

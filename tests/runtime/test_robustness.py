"""Faults outside the model call, shutdown with a time limit, and input the user gets wrong."""

from __future__ import annotations

import asyncio
import logging
import math
import threading
from collections.abc import MutableMapping
from typing import Any

import pytest
import structlog

from adaptive_batcher import (
    SLO,
    AdaptiveBatcher,
    BatcherClosedError,
    BatchFailedError,
    ResultCountError,
)
from adaptive_batcher.telemetry import TelemetrySample
from adaptive_batcher.testing import EchoModel


def failing(batch: list[int]) -> list[int]:
    raise RuntimeError("model failed")


async def outcomes(batcher: AdaptiveBatcher[Any, Any], n: int) -> list[Any]:
    return await asyncio.gather(*(batcher.submit(i) for i in range(n)), return_exceptions=True)


async def test_a_broken_is_oom_hook_still_fails_callers_explicitly() -> None:
    def broken(exc: BaseException) -> bool:
        raise ZeroDivisionError("bug in the hook")

    async with AdaptiveBatcher(failing, is_oom=broken, executor="inline", window_ms=1) as b:
        results = await asyncio.wait_for(outcomes(b, 4), timeout=2.0)
    assert all(isinstance(r, BatchFailedError) for r in results)


@pytest.mark.parametrize("event", ["batch.dispatched", "controller.decision", "*"])
async def test_a_logging_pipeline_that_raises_never_stops_serving(event: str) -> None:
    """The application's log processors may raise; requests still complete, the controller
    still decides, and close still works."""

    def explode(_: Any, __: str, event_dict: MutableMapping[str, Any]) -> Any:
        if event in ("*", event_dict.get("event")):
            raise RuntimeError("log sink down")
        return event_dict

    structlog.configure(
        processors=[explode, structlog.processors.KeyValueRenderer()],
        wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG),
    )

    async def model(batch: list[int]) -> list[int]:
        await asyncio.sleep(0.002)
        return batch

    batcher = AdaptiveBatcher(model, window_ms=1, slo=SLO(latency_ms=50), control_interval_ms=10)
    async with batcher:
        for _ in range(10):
            results = await asyncio.wait_for(outcomes(batcher, 20), timeout=2.0)
            assert results == list(range(20))
            await asyncio.sleep(0.01)
    assert batcher.stats().decisions > 0


async def test_an_exception_whose_repr_raises_is_still_reported() -> None:
    class NastyError(Exception):
        def __repr__(self) -> str:
            raise ValueError("no repr for you")

    def model(batch: list[int]) -> list[int]:
        raise NastyError()

    async with AdaptiveBatcher(model, executor="inline", window_ms=1) as batcher:
        (result,) = await outcomes(batcher, 1)
    assert isinstance(result, BatchFailedError)
    assert "repr() failed" in str(result)


@pytest.mark.parametrize("returned", [{0: 1, 1: 2}, {1, 2}, "ab"])
async def test_mappings_sets_and_strings_are_not_result_lists(returned: Any) -> None:
    async with AdaptiveBatcher(lambda b: returned, executor="inline", window_ms=1) as batcher:
        results = await outcomes(batcher, 2)
    assert all(isinstance(r, ResultCountError) for r in results)
    assert "expected a sequence of 2 results" in str(results[0])


async def test_close_with_a_time_limit_fails_what_a_hung_model_holds() -> None:
    hang = asyncio.Event()

    async def model(batch: list[int]) -> list[int]:
        await hang.wait()  # never set: the model hangs
        return batch

    batcher = AdaptiveBatcher(model, max_batch_size=2, window_ms=0)
    tasks = [asyncio.create_task(batcher.submit(i)) for i in range(5)]
    await asyncio.sleep(0.01)
    started = asyncio.get_running_loop().time()
    await batcher.aclose(timeout_s=0.1)
    assert asyncio.get_running_loop().time() - started < 1.0
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(isinstance(r, BatcherClosedError) for r in results)
    assert {str(r) for r in results} == {
        "batcher closed while this ran",
        "batcher closed before this ran",
    }


async def test_escalating_to_no_drain_fails_the_backlog_at_once() -> None:
    release = asyncio.Event()

    async def model(batch: list[int]) -> list[int]:
        await release.wait()
        return batch

    batcher = AdaptiveBatcher(model, max_batch_size=1, window_ms=0)
    tasks = [asyncio.create_task(batcher.submit(i)) for i in range(4)]
    await asyncio.sleep(0.01)
    graceful = asyncio.create_task(batcher.aclose())  # drains: would wait for the hung model
    await asyncio.sleep(0.01)
    escalate = asyncio.create_task(batcher.aclose(drain=False))
    await asyncio.sleep(0.01)
    queued = [t for t in tasks[1:] if t.done()]
    assert len(queued) == 3  # the backlog failed at once
    assert all(isinstance(t.exception(), BatcherClosedError) for t in queued)
    release.set()  # the running batch finishes normally
    await asyncio.gather(graceful, escalate)
    assert tasks[0].result() == 0


async def test_submit_many_can_return_exceptions_in_place() -> None:
    model = EchoModel(fail_on=[2])
    async with AdaptiveBatcher(model, max_batch_size=1, window_ms=0) as batcher:
        results = await batcher.submit_many([1, 2, 3], return_exceptions=True)
    assert results[0] == 1
    assert results[2] == 3
    assert isinstance(results[1], BatchFailedError)


async def test_a_closed_batcher_refuses_reuse() -> None:
    batcher = AdaptiveBatcher(EchoModel())
    await batcher.aclose()
    with pytest.raises(BatcherClosedError, match="create a new one"):
        async with batcher:
            pass
    with pytest.raises(BatcherClosedError):
        await batcher.warmup(lambda: 0)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"policy": "pid"}, TypeError, r"policy must be a Policy \(with decide\(\) and reset"),
        ({"guards": [1]}, TypeError, "each guard must be callable, got int"),
        ({"control_interval_ms": 0}, ValueError, "control_interval_ms must be a finite number > 0"),
        ({"control_interval_ms": float("nan")}, ValueError, "control_interval_ms must be"),
        ({"shed_late": True}, ValueError, "shed_late=True needs an slo"),
        ({"shed_late": "yes", "slo": SLO(latency_ms=10)}, TypeError, "shed_late must be a bool"),
        ({"is_oom": None}, TypeError, "is_oom must be callable, got NoneType"),
        ({"service_profile": []}, ValueError, "service_profile needs at least one"),
        ({"bounds": 5}, TypeError, "bounds must be a Bounds or None, got int"),
        ({"timeout": 1}, TypeError, "unexpected keyword argument"),
    ],
)
def test_control_arguments_are_checked_up_front(
    kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        AdaptiveBatcher(EchoModel(), **kwargs)


async def test_aclose_timeout_is_checked() -> None:
    for bad in (-1, math.nan, -math.inf):
        with pytest.raises(ValueError, match="timeout_s must be a finite number >= 0"):
            await AdaptiveBatcher(EchoModel()).aclose(timeout_s=bad)
    with pytest.raises(TypeError, match="timeout_s"):
        await AdaptiveBatcher(EchoModel()).aclose(timeout_s="1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout_s must be a finite number >= 0"):
        await AdaptiveBatcher(EchoModel()).aclose(timeout_s=-(10**400))  # no OverflowError
    await AdaptiveBatcher(EchoModel()).aclose(timeout_s=10**400)  # beyond a float: no limit


async def test_aclose_with_an_infinite_timeout_waits_without_limit_as_none_does() -> None:
    gate = asyncio.Event()

    async def model(batch: list[int]) -> list[int]:
        await gate.wait()
        return batch

    batcher = AdaptiveBatcher(model, window_ms=0)
    answer = asyncio.ensure_future(batcher.submit(1))
    await asyncio.sleep(0.01)
    closing = asyncio.ensure_future(batcher.aclose(timeout_s=math.inf))
    await asyncio.sleep(0.05)
    assert not closing.done()  # still waiting for the running batch
    gate.set()
    await closing
    assert await answer == 1


async def test_warmup_with_sizes_never_exceeds_the_cap_and_reports_what_ran() -> None:
    import numpy as np

    from adaptive_batcher import pad_rows, row_count

    rows_seen: list[int] = []

    def model(batch: list[Any]) -> list[Any]:
        rows_seen.append(sum(row_count(b) for b in batch))
        return batch

    batcher = AdaptiveBatcher(
        model,
        max_batch_size=32,
        size_fn=row_count,
        batch_sizes=[2, 4, 8, 16, 32],
        pad_fn=pad_rows,
        executor="inline",
    )
    await batcher.warmup(lambda: np.zeros((3, 2)))  # 3-row items: bucket 2 cannot hold one
    await batcher.aclose()
    assert max(rows_seen) <= 32
    assert rows_seen == [4, 8, 16, 32]  # 3 -> 4, 6 -> 8, 15 -> 16, 30 -> 32
    assert batcher.warmed_sizes == frozenset({4, 8, 16, 32})


async def test_a_keyboard_interrupt_in_a_result_slot_is_not_raised_into_the_caller() -> None:
    def model(batch: list[int]) -> list[Any]:
        return [KeyboardInterrupt() if i == 1 else i for i in batch]

    async with AdaptiveBatcher(model, executor="inline", window_ms=1) as batcher:
        results = await outcomes(batcher, 3)
    assert results[0] == 0
    assert results[2] == 2
    assert isinstance(results[1], BatchFailedError)
    assert isinstance(results[1].cause, KeyboardInterrupt)


async def test_raising_the_slots_at_run_time_adds_model_threads() -> None:
    import threading
    import time

    running = 0
    peak = 0
    lock = threading.Lock()

    def model(batch: list[int]) -> list[int]:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        time.sleep(0.02)
        with lock:
            running -= 1
        return batch

    async with AdaptiveBatcher(model, max_batch_size=1, window_ms=0, executor="thread") as b:
        b.set_limits(max_concurrent_batches=4)
        await b.submit_many(range(8))
    assert peak == 4


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"name": 1}, TypeError, "name must be a str, got int"),
        ({"bisect_on_error": "yes"}, TypeError, "bisect_on_error must be a bool, got str"),
        ({"telemetry": object()}, TypeError, "telemetry must have a sample"),
        ({"telemetry_hz": 0}, ValueError, "telemetry_hz must be a finite number > 0"),
    ],
)
def test_more_constructor_checks(
    kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        AdaptiveBatcher(EchoModel(), **kwargs)


class StuckTelemetry:
    """A telemetry source whose sample() blocks until released (a wedged NVML call)."""

    name = "stuck"

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def sample(self) -> TelemetrySample:
        self.entered.set()
        self.release.wait()
        return TelemetrySample(source=self.name)


@pytest.mark.parametrize("timeout_s", [0.2, None])
async def test_a_close_never_waits_for_a_stuck_telemetry_reading(timeout_s: float | None) -> None:
    """Before: aclose joined the sampler's thread on the event loop with no bound, so a stuck
    sample() froze the loop until it returned (here: until the safety timer released it)."""
    source = StuckTelemetry()
    safety = threading.Timer(5.0, source.release.set)  # the old code's loop thaws only then
    safety.start()
    try:
        batcher = AdaptiveBatcher(
            lambda b: b, telemetry=source, telemetry_hz=100, window_ms=0, executor="inline"
        )
        assert await batcher.submit(1) == 1
        assert await asyncio.to_thread(source.entered.wait, 5)
        await batcher.aclose(timeout_s=timeout_s)
        assert not source.release.is_set()  # the close returned while the reading was stuck
    finally:
        source.release.set()
        safety.cancel()

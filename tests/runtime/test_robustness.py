"""Faults outside the model call, shutdown with a time limit, and input the user gets wrong."""

from __future__ import annotations

import asyncio
import logging
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


async def test_a_logging_processor_that_raises_never_strands_callers() -> None:
    def explode(_: Any, __: str, event_dict: MutableMapping[str, Any]) -> Any:
        if event_dict.get("event") == "batch.dispatched":
            raise RuntimeError("log sink down")
        return event_dict

    structlog.configure(
        processors=[explode, structlog.processors.KeyValueRenderer()],
        wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG),
    )
    async with AdaptiveBatcher(EchoModel(), window_ms=1) as batcher:
        results = await asyncio.wait_for(outcomes(batcher, 3), timeout=2.0)
    assert all(isinstance(r, BatchFailedError) for r in results)
    assert batcher.stats().counts.failed == 3


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
        ({"shed_late": "yes", "slo": SLO(p99_ms=10)}, TypeError, "shed_late must be a bool"),
        ({"is_oom": None}, TypeError, "is_oom must be callable, got NoneType"),
        ({"service_profile": []}, ValueError, "service_profile needs rows"),
        ({"bounds": 5}, TypeError, "bounds must be a Bounds, got int"),
        ({"timeout": 1}, TypeError, "unexpected keyword argument"),
    ],
)
def test_control_arguments_are_checked_up_front(
    kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        AdaptiveBatcher(EchoModel(), **kwargs)


async def test_aclose_timeout_is_checked() -> None:
    with pytest.raises(ValueError, match="timeout_s must be a finite number >= 0"):
        await AdaptiveBatcher(EchoModel()).aclose(timeout_s=-1)

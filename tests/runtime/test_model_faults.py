"""Models that raise what asyncio treats specially: StopIteration (raised or returned in a slot),
a close awaited from inside the model, and BaseExceptions (SystemExit, KeyboardInterrupt,
GeneratorExit). Every request must end; hangs are guarded by timeouts so they fail."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import pytest

from adaptive_batcher import AdaptiveBatcher, BatcherClosedError, BatchFailedError
from adaptive_batcher.metrics.recorder import Counts
from adaptive_batcher.testing import FakeCudaEvent

GUARD_S = 2.0  # far above any batch here: reaching it means a request hung


def ended_total(counts: Counts) -> int:
    return counts.completed + counts.failed + counts.rejected + counts.expired + counts.cancelled


def assert_counts_add_up(batcher: AdaptiveBatcher[Any, Any]) -> None:
    counts = batcher.stats().counts
    assert counts.submitted == ended_total(counts), counts


def raising(exc_type: type[BaseException]) -> Callable[[list[str]], list[str]]:
    """A sync model that raises ``exc_type`` for a batch holding "bad"."""

    def model(batch: list[str]) -> list[str]:
        if "bad" in batch:
            raise exc_type()
        return [x.upper() for x in batch]

    return model


def make_batcher(model: Any, kind: str, **kwargs: Any) -> AdaptiveBatcher[Any, Any]:
    if kind == "cuda":
        kwargs["cuda_event_factory"] = FakeCudaEvent
    kwargs.setdefault("window_ms", 1)
    return AdaptiveBatcher(model, executor=kind, max_batch_size=4, **kwargs)


async def outcome(batcher: AdaptiveBatcher[Any, Any], item: Any) -> Any:
    try:
        return await asyncio.wait_for(batcher.submit(item), GUARD_S)
    except BatchFailedError as exc:
        return exc


async def outcomes(batcher: AdaptiveBatcher[Any, Any], items: list[Any]) -> list[Any]:
    return await asyncio.wait_for(
        asyncio.gather(*(batcher.submit(i) for i in items), return_exceptions=True), GUARD_S
    )


async def close(batcher: AdaptiveBatcher[Any, Any]) -> None:
    """``aclose()`` with no time limit of its own, guarded (``async with`` would hang)."""
    await asyncio.wait_for(batcher.aclose(), GUARD_S)


# -- 1. a model that raises StopIteration ----------------------------------------------------

SYNC_KINDS = ["auto", "thread", "inline", "cuda"]


@pytest.mark.parametrize("kind", SYNC_KINDS)
async def test_a_sync_model_raising_stop_iteration_fails_its_batch_and_nothing_stalls(
    kind: str,
) -> None:
    """It used to hang with a worker thread: asyncio cannot set a StopIteration on a future, so
    the batch never ended, later requests queued behind it and aclose() never returned."""
    batcher = make_batcher(raising(StopIteration), kind)
    assert await outcome(batcher, "a") == "A"
    failed = await outcome(batcher, "bad")
    assert await outcome(batcher, "b") == "B"
    await close(batcher)

    assert isinstance(failed, BatchFailedError)
    assert type(failed.cause) is StopIteration
    assert failed.__cause__ is failed.cause
    assert_counts_add_up(batcher)
    assert batcher.stats().counts.failed == 1


@pytest.mark.parametrize("kind", SYNC_KINDS)
async def test_bisect_isolates_an_item_whose_model_call_raises_stop_iteration(kind: str) -> None:
    batcher = make_batcher(raising(StopIteration), kind, bisect_on_error=True, window_ms=20)
    results = await outcomes(batcher, ["a", "bad", "b", "c"])
    await close(batcher)
    assert results[0] == "A" and results[2:] == ["B", "C"]
    assert isinstance(results[1], BatchFailedError)
    assert type(results[1].cause) is StopIteration
    assert results[1].batch_size == 1
    assert_counts_add_up(batcher)


async def test_a_cuda_event_raising_stop_iteration_fails_the_batch_instead_of_hanging() -> None:
    class StoppingEvent(FakeCudaEvent):
        def synchronize(self) -> None:
            raise StopIteration

    batcher = AdaptiveBatcher(
        lambda b: b, executor="cuda", cuda_event_factory=StoppingEvent, window_ms=1
    )
    failed = await outcome(batcher, 1)
    await close(batcher)
    assert isinstance(failed, BatchFailedError)
    assert type(failed.cause) is StopIteration
    assert_counts_add_up(batcher)


async def test_an_async_model_raising_stop_iteration_fails_as_python_converts_it() -> None:
    """Python turns a StopIteration leaving a coroutine into RuntimeError (PEP 479) inside the
    model, before the batcher sees it; that RuntimeError is the cause, chained from it."""

    async def model(batch: list[str]) -> list[str]:
        if "bad" in batch:
            raise StopIteration
        return [x.upper() for x in batch]

    batcher = make_batcher(model, "async")
    failed = await outcome(batcher, "bad")
    assert await outcome(batcher, "b") == "B"
    await close(batcher)
    assert isinstance(failed, BatchFailedError)
    assert type(failed.cause) is RuntimeError
    assert type(failed.cause.__cause__) is StopIteration
    assert_counts_add_up(batcher)


async def test_an_async_model_raising_stop_async_iteration_fails_its_batch() -> None:
    async def model(batch: list[str]) -> list[str]:
        if "bad" in batch:
            raise StopAsyncIteration
        return [x.upper() for x in batch]

    batcher = make_batcher(model, "async", bisect_on_error=True, window_ms=20)
    results = await outcomes(batcher, ["a", "bad"])
    await close(batcher)
    assert results[0] == "A"
    assert isinstance(results[1], BatchFailedError)
    assert type(results[1].cause) is StopAsyncIteration
    assert_counts_add_up(batcher)


async def test_warmup_reports_a_stop_iteration_as_a_runtime_error_chained_from_it() -> None:
    batcher = make_batcher(raising(StopIteration), "thread")
    with pytest.raises(RuntimeError) as raised:
        await asyncio.wait_for(batcher.warmup(lambda: "bad"), GUARD_S)
    assert type(raised.value.__cause__) is StopIteration
    await close(batcher)


# -- 2. StopIteration returned in one result slot --------------------------------------------


@pytest.mark.parametrize("kind", ["inline", "thread"])
async def test_stop_iteration_in_one_slot_fails_only_that_caller(kind: str) -> None:
    """It used to fail every neighbour after it: setting it on the caller's future raised
    TypeError in the middle of handing out results."""

    def model(batch: list[str]) -> list[Any]:
        return [StopIteration("slot") if x == "bad" else x.upper() for x in batch]

    batcher = make_batcher(model, kind, window_ms=20)
    results = await outcomes(batcher, ["a", "bad", "b", "c"])
    await close(batcher)
    assert results[0] == "A" and results[2:] == ["B", "C"]
    assert isinstance(results[1], BatchFailedError)
    assert type(results[1].cause) is StopIteration
    assert results[1].cause.args == ("slot",)
    assert_counts_add_up(batcher)
    assert batcher.stats().counts.failed == 1


# -- 3. a model that awaits the batcher's close ----------------------------------------------


@pytest.mark.parametrize("drain", [True, False])
async def test_a_model_awaiting_aclose_does_not_deadlock(drain: bool) -> None:
    """The close used to wait for the running batch, and the batch for the close."""
    batcher: AdaptiveBatcher[int, int]
    closes = 0

    async def model(batch: list[int]) -> list[int]:
        nonlocal closes
        if 0 in batch:
            await batcher.aclose(drain=drain)
            closes += 1
        await asyncio.sleep(0.001)
        return [x * 10 for x in batch]

    batcher = AdaptiveBatcher(model, max_batch_size=2, window_ms=1)
    results = await outcomes(batcher, list(range(7)))  # a batch of 2 runs, 5 wait behind it
    assert closes == 1
    assert results[:2] == [0, 10]  # the calling batch ends normally
    if drain:
        assert results[2:] == [20, 30, 40, 50, 60]
    else:
        assert all(isinstance(r, BatcherClosedError) for r in results[2:])
    with pytest.raises(BatcherClosedError):
        await batcher.submit(9)
    await close(batcher)  # a second close from outside returns
    assert batcher.stats().in_flight_batches == 0
    assert_counts_add_up(batcher)


async def test_a_time_limited_close_awaited_by_the_model_still_ends_every_request() -> None:
    batcher: AdaptiveBatcher[int, int]
    release = asyncio.Event()

    async def model(batch: list[int]) -> list[int]:
        if 0 in batch:
            await batcher.aclose(timeout_s=0.01)
            await release.wait()  # outlives the close's time limit: it is cancelled
        return batch

    batcher = AdaptiveBatcher(model, max_batch_size=2, window_ms=1)
    results = await outcomes(batcher, list(range(4)))
    assert all(isinstance(r, BatcherClosedError) for r in results)
    assert_counts_add_up(batcher)


# -- 4. BaseExceptions that are not Exceptions -----------------------------------------------


class Recorded:
    """What the callers saw and what the loop's exception handler was told."""

    def __init__(self) -> None:
        self.errors: list[BaseException] = []
        self.handler_messages: list[str] = []


async def call_and_record(batcher: AdaptiveBatcher[Any, Any], item: Any, seen: Recorded) -> None:
    try:
        await batcher.submit(item)
    except BatchFailedError as exc:
        seen.errors.append(exc)


def run_in_fresh_loop(main: Callable[[], Coroutine[Any, Any, Any]], seen: Recorded) -> None:
    """Run ``main()`` in a new loop that reports its exception-handler calls into ``seen``."""
    loop = asyncio.new_event_loop()
    loop.set_exception_handler(lambda _, context: seen.handler_messages.append(context["message"]))
    try:
        loop.run_until_complete(asyncio.wait_for(main(), GUARD_S))
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
        gc.collect()  # a task whose exception was never retrieved reports it when collected


@pytest.mark.parametrize("exc_type", [SystemExit, KeyboardInterrupt])
@pytest.mark.parametrize("kind", ["thread", "inline"])
def test_exit_from_the_model_settles_the_batch_callers_then_stops_the_program(
    exc_type: type[BaseException], kind: str
) -> None:
    """The callers of the batch see BatchFailedError first; then asyncio.run raises the exit,
    as it does for its own tasks. It used to leave the loop at once: the callers never saw an
    error and were cancelled by asyncio.run's clean-up."""
    seen = Recorded()
    batcher = make_batcher(raising(exc_type), kind, window_ms=20)

    async def main() -> None:
        await asyncio.gather(*(call_and_record(batcher, x, seen) for x in ["bad", "a"]))

    with pytest.raises(exc_type):
        asyncio.run(main())
    gc.collect()  # tasks left by a regression are finalized here, not inside pytest's report
    assert len(seen.errors) == 2
    assert all(type(e.__cause__) is exc_type for e in seen.errors)
    assert batcher.stats().counts.failed == 2
    assert_counts_add_up(batcher)


def test_after_an_exit_is_caught_the_loop_and_the_batcher_still_serve() -> None:
    seen = Recorded()
    loop = asyncio.new_event_loop()
    loop.set_exception_handler(lambda _, context: seen.handler_messages.append(context["message"]))
    batcher = make_batcher(raising(KeyboardInterrupt), "thread", window_ms=20)

    async def both_callers() -> None:
        await asyncio.gather(*(call_and_record(batcher, x, seen) for x in ["bad", "a"]))

    async def guarded(awaitable: Awaitable[Any]) -> Any:
        return await asyncio.wait_for(awaitable, GUARD_S)

    try:
        callers = loop.create_task(both_callers())
        with pytest.raises(KeyboardInterrupt):
            loop.run_until_complete(guarded(callers))
        loop.run_until_complete(guarded(callers))  # they saw their errors before the interrupt
        assert loop.run_until_complete(guarded(batcher.submit("b"))) == "B"
        loop.run_until_complete(guarded(batcher.aclose()))
    finally:
        loop.close()
    assert len(seen.errors) == 2
    assert_counts_add_up(batcher)
    assert seen.handler_messages == []


class CustomBaseError(BaseException):
    """A BaseException of the model's own, neither an Exception nor an exit."""


@pytest.mark.parametrize("exc_type", [GeneratorExit, CustomBaseError])
@pytest.mark.parametrize("kind", ["thread", "inline"])
def test_other_base_exceptions_are_model_failures_with_no_loop_noise(
    exc_type: type[BaseException], kind: str
) -> None:
    """They used to end the batch task with the exception, which asyncio then reported as
    "Task exception was never retrieved"."""
    seen = Recorded()
    batcher = make_batcher(raising(exc_type), kind, bisect_on_error=True, window_ms=20)
    results: list[Any] = []

    async def main() -> None:
        results.extend(await outcomes(batcher, ["a", "bad", "b"]))
        await close(batcher)

    run_in_fresh_loop(main, seen)
    assert seen.handler_messages == []
    assert results[0] == "A" and results[2] == "B"
    assert isinstance(results[1], BatchFailedError)
    assert type(results[1].cause) is exc_type
    assert_counts_add_up(batcher)

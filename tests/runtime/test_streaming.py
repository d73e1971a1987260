"""Streaming models: async generators answering each caller element by element."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
from collections.abc import AsyncIterator
from typing import Any

import pytest

from adaptive_batcher import (
    SLO,
    AdaptiveBatcher,
    BatcherClosedError,
    BatchFailedError,
    ConcurrentReadError,
    DeadlineExceededError,
    PaddingError,
    ResultCountError,
    StreamBufferFullError,
    batched,
)
from adaptive_batcher.runtime.decorator import BatchedStream
from adaptive_batcher.testing import run_in_virtual_time


async def read(stream: AsyncIterator[Any]) -> list[Any]:
    return [element async for element in stream]


async def read_until_error(stream: AsyncIterator[Any]) -> tuple[list[Any], BaseException | None]:
    seen: list[Any] = []
    try:
        async for element in stream:
            seen.append(element)
    except Exception as exc:
        return seen, exc
    return seen, None


async def three_steps(batch: list[str]) -> AsyncIterator[list[str]]:
    for step in range(3):
        yield [f"{item}{step}" for item in batch]


async def test_each_yield_gives_every_caller_its_own_element() -> None:
    calls: list[list[str]] = []

    async def model(batch: list[str]) -> AsyncIterator[list[str]]:
        calls.append(list(batch))
        async for step in three_steps(batch):
            yield step

    async with AdaptiveBatcher(model, max_batch_size=4, window_ms=50) as batcher:
        streams = [batcher.submit_stream(x) for x in "abc"]
        results = await asyncio.gather(*(read(s) for s in streams))
    assert results == [["a0", "a1", "a2"], ["b0", "b1", "b2"], ["c0", "c1", "c2"]]
    assert calls == [["a", "b", "c"]]  # one batch, one model call


async def test_submit_stream_queues_at_the_call_not_at_the_first_read() -> None:
    async with AdaptiveBatcher(three_steps, max_batch_size=2, window_ms=60_000) as batcher:
        first = batcher.submit_stream("a")
        second = batcher.submit_stream("b")  # the batch is full: it runs without a read
        # reading one stream to its end needs the other to be queued already
        assert await asyncio.wait_for(read(first), timeout=5) == ["a0", "a1", "a2"]
        assert await read(second) == ["b0", "b1", "b2"]


@pytest.mark.parametrize(
    "stop", [StopIteration, StopAsyncIteration, StopIteration(), StopAsyncIteration()]
)
async def test_a_stop_marker_ends_only_that_callers_stream(stop: Any) -> None:
    async def model(batch: list[str]) -> AsyncIterator[list[Any]]:
        yield [f"{item}0" for item in batch]
        yield [stop, *(f"{item}1" for item in batch[1:])]
        yield ["ignored", *(f"{item}2" for item in batch[1:])]

    async with AdaptiveBatcher(model, max_batch_size=2, window_ms=50) as batcher:
        streams = [batcher.submit_stream(x) for x in "ab"]
        results = await asyncio.gather(*(read(s) for s in streams))
    assert results == [["a0"], ["b0", "b1", "b2"]]


async def test_an_exception_in_a_slot_ends_that_stream_with_it() -> None:
    async def model(batch: list[str]) -> AsyncIterator[list[Any]]:
        yield list(batch)
        yield [KeyError("bad a"), batch[1]]
        yield ["ignored", batch[1]]

    async with AdaptiveBatcher(model, max_batch_size=2, window_ms=50) as batcher:
        first, second = batcher.submit_stream("a"), batcher.submit_stream("b")
        seen, error = await read_until_error(first)
        assert seen == ["a"] and isinstance(error, KeyError)
        assert await read(second) == ["b", "b", "b"]
        counts = batcher.stats().counts
    assert (counts.completed, counts.failed) == (1, 1)


async def test_a_model_failure_mid_stream_ends_every_open_stream_after_its_elements() -> None:
    async def model(batch: list[str]) -> AsyncIterator[list[str]]:
        yield list(batch)
        raise ZeroDivisionError("boom")
        yield list(batch)  # pragma: no cover - never reached

    async with AdaptiveBatcher(model, max_batch_size=2, window_ms=50) as batcher:
        outcomes = await asyncio.gather(*(read_until_error(batcher.submit_stream(x)) for x in "ab"))
        counts = batcher.stats().counts
    for item, (seen, error) in zip("ab", outcomes, strict=True):
        assert seen == [item]
        assert isinstance(error, BatchFailedError)
        assert isinstance(error.cause, ZeroDivisionError)
    assert (counts.completed, counts.failed) == (0, 2)


async def test_a_step_of_the_wrong_length_fails_the_streams_and_closes_the_model() -> None:
    closed: list[bool] = []

    async def model(batch: list[str]) -> AsyncIterator[list[str]]:
        try:
            yield list(batch)
            yield [*batch, "extra"]
            yield list(batch)
        finally:
            closed.append(True)

    async with AdaptiveBatcher(model, max_batch_size=2, window_ms=50) as batcher:
        outcomes = await asyncio.gather(*(read_until_error(batcher.submit_stream(x)) for x in "ab"))
    assert [seen for seen, _ in outcomes] == [["a"], ["b"]]
    assert all(isinstance(error, ResultCountError) for _, error in outcomes)
    assert closed == [True]


async def test_a_streaming_model_that_empties_its_input_gets_a_result_count_error() -> None:
    """Each step is checked against the batch counted before the model ran."""

    async def model(batch: list[str]) -> AsyncIterator[list[str]]:
        batch.clear()
        yield []

    async with AdaptiveBatcher(model, max_batch_size=2, window_ms=50) as batcher:
        outcomes = await asyncio.gather(*(read_until_error(batcher.submit_stream(x)) for x in "ab"))
        with pytest.raises(ResultCountError, match="model returned 0 results for a batch of 1"):
            await batcher.warmup(lambda: "w")
    assert [seen for seen, _ in outcomes] == [[], []]
    assert all(isinstance(error, ResultCountError) for _, error in outcomes), outcomes


async def test_a_reader_cancelled_while_queued_never_reaches_the_model() -> None:
    seen_batches: list[list[str]] = []

    async def model(batch: list[str]) -> AsyncIterator[list[str]]:
        seen_batches.append(list(batch))
        yield list(batch)

    async with AdaptiveBatcher(model, max_batch_size=3, window_ms=60_000) as batcher:
        reader = asyncio.ensure_future(read(batcher.submit_stream("gone")))
        await asyncio.sleep(0)
        reader.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reader
        assert batcher.stats().queue_depth == 0
        kept = batcher.submit_stream("kept")
        assert await asyncio.wait_for(batcher.aclose(), timeout=5) is None  # drain: runs now
        assert await read(kept) == ["kept"]
        assert batcher.stats().counts.cancelled == 1
    assert seen_batches == [["kept"]]


async def test_a_reader_cancelled_mid_stream_leaves_the_others_streaming() -> None:
    gate = asyncio.Event()

    async def model(batch: list[str]) -> AsyncIterator[list[str]]:
        yield list(batch)
        await gate.wait()
        yield list(batch)

    async with AdaptiveBatcher(model, max_batch_size=2, window_ms=50) as batcher:
        leaving = batcher.submit_stream("a")
        staying = batcher.submit_stream("b")
        assert await leaving.__anext__() == "a"
        reader = asyncio.ensure_future(leaving.__anext__())
        await asyncio.sleep(0)
        reader.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reader
        with pytest.raises(StopAsyncIteration):  # a cancelled stream is over
            await leaving.__anext__()
        gate.set()
        assert await read(staying) == ["b", "b"]
    # answered at the first element, so the one that left after it is not also cancelled
    counts = batcher.stats().counts
    assert (counts.submitted, counts.completed, counts.cancelled) == (2, 2, 0)


async def test_a_reader_that_leaves_before_its_first_element_counts_as_cancelled() -> None:
    gate = asyncio.Event()

    async def model(batch: list[str]) -> AsyncIterator[list[str]]:
        await gate.wait()
        yield list(batch)

    async with AdaptiveBatcher(model, max_batch_size=2, window_ms=0) as batcher:
        stream = batcher.submit_stream("a")
        reader = asyncio.ensure_future(stream.__anext__())
        await asyncio.sleep(0.01)  # the batch is running, nothing delivered yet
        reader.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reader
        gate.set()
    counts = batcher.stats().counts
    assert (counts.submitted, counts.completed, counts.cancelled) == (1, 0, 1)


async def test_a_stream_closed_before_its_first_read_is_withdrawn() -> None:
    """Closed while queued: it never reaches the model and counts as cancelled."""
    seen: list[list[str]] = []

    async def model(batch: list[str]) -> AsyncIterator[list[str]]:
        seen.append(list(batch))
        yield list(batch)

    async with AdaptiveBatcher(model, max_batch_size=4, window_ms=50) as batcher:
        gone = batcher.submit_stream("gone")
        await gone.aclose()
        assert await read(batcher.submit_stream("kept")) == ["kept"]
    assert seen == [["kept"]]
    counts = batcher.stats().counts
    assert (counts.submitted, counts.completed, counts.cancelled) == (2, 1, 1)


async def _endless(batch: list[int]) -> AsyncIterator[list[int]]:
    while True:
        await asyncio.sleep(0.005)
        yield list(batch)


async def test_a_running_stream_closed_or_dropped_unread_frees_the_slot() -> None:
    """Its batch running and no element read yet: closing it (or dropping it) stops the model,
    so the next caller gets the only slot and the close does not hang."""
    import gc

    for leave in ("aclose", "drop"):
        batcher = AdaptiveBatcher(_endless, max_batch_size=1, window_ms=0)
        stream = batcher.submit_stream(1)
        await asyncio.sleep(0.05)  # its batch is running, stepping
        if leave == "aclose":
            await stream.aclose()
        else:
            del stream
            gc.collect()
        after = batcher.submit_stream(2)
        assert await asyncio.wait_for(after.__anext__(), timeout=5) == 2, leave
        await after.aclose()
        await asyncio.wait_for(batcher.aclose(), timeout=5)
        # both were answered (elements handed out, read or not) before their readers left
        counts = batcher.stats().counts
        assert (counts.submitted, counts.completed, counts.cancelled) == (2, 2, 0), leave


async def test_an_error_a_left_reader_never_reads_is_not_logged_as_never_retrieved(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import gc

    async def model(batch: list[int]) -> AsyncIterator[list[Any]]:
        yield list(batch)
        yield [ValueError("slot") for _ in batch]

    async with AdaptiveBatcher(model, max_batch_size=1, window_ms=0) as batcher:
        stream = batcher.submit_stream(1)
        async for _ in stream:
            break  # kept in a variable: it could be read on, so it stays
        await asyncio.sleep(0.05)  # the error is set on its end
        del stream
        gc.collect()
    assert "never retrieved" not in caplog.text


async def test_a_dropped_stream_whose_error_comes_first_logs_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Dropped by a ``break`` out of ``async for``; the slot's error is set before the
    withdrawal (at the loop's next turn) runs: it is read there, not left unretrieved."""
    import gc

    async def model(batch: list[str]) -> AsyncIterator[list[Any]]:
        yield [f"{x}:0" for x in batch]
        await asyncio.sleep(0)
        yield [ValueError("bad slot") for _ in batch]

    batcher = AdaptiveBatcher(model, max_batch_size=4, window_ms=0)
    async for _ in batcher.submit_stream("a"):
        break
    await asyncio.sleep(0.05)
    await batcher.aclose()
    counts = batcher.stats().counts
    assert counts.submitted == counts.completed + counts.failed + counts.cancelled == 1
    del batcher
    gc.collect()  # the stream's future goes: an unread error would be logged now
    assert "never retrieved" not in caplog.text


async def test_a_submit_on_a_streaming_model_cancelled_after_the_first_step_counts_once() -> None:
    batcher = AdaptiveBatcher(_endless, max_batch_size=1, window_ms=0)
    task = asyncio.ensure_future(batcher.submit(1))
    await asyncio.sleep(0.05)  # its batch has handed out steps: counted as completed
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.wait_for(batcher.aclose(), timeout=5)
    counts = batcher.stats().counts
    assert (counts.submitted, counts.completed, counts.cancelled) == (1, 1, 0)


async def test_when_every_reader_has_left_the_model_stops_and_frees_the_slot() -> None:
    steps: list[int] = []
    closed: list[bool] = []

    async def model(batch: list[str]) -> AsyncIterator[list[str]]:
        try:
            for step in range(1000):
                steps.append(step)
                yield list(batch)
                await asyncio.sleep(0)
        finally:
            closed.append(True)

    async with AdaptiveBatcher(model, max_batch_size=1, window_ms=0) as batcher:
        async for _ in batcher.submit_stream("a"):
            break  # the reader leaves after one element
        # the next request gets the only slot: the first generator was stopped
        second = batcher.submit_stream("b")
        assert await asyncio.wait_for(second.__anext__(), timeout=5) == "b"
        await second.aclose()
    assert closed == [True, True]
    assert len(steps) < 10
    counts = batcher.stats().counts
    assert (counts.submitted, counts.completed, counts.cancelled) == (2, 2, 0)


async def test_a_streaming_batch_holds_its_slot_until_the_generator_is_exhausted() -> None:
    gate = asyncio.Event()
    started: list[str] = []

    async def model(batch: list[str]) -> AsyncIterator[list[str]]:
        started.append(batch[0])
        yield list(batch)
        await gate.wait()
        yield list(batch)

    async with AdaptiveBatcher(model, max_batch_size=1, window_ms=0) as batcher:
        first = batcher.submit_stream("a")
        assert await first.__anext__() == "a"
        second = batcher.submit_stream("b")
        waiting = asyncio.ensure_future(second.__anext__())
        await asyncio.sleep(0.05)
        assert started == ["a"] and not waiting.done()  # one slot: "b" waits for "a"'s end
        gate.set()
        assert await first.__anext__() == "a"
        assert await asyncio.wait_for(waiting, timeout=5) == "b"
        assert await read(second) == ["b"]
    assert started == ["a", "b"]


async def test_closing_without_draining_fails_queued_streams() -> None:
    gate = asyncio.Event()

    async def model(batch: list[str]) -> AsyncIterator[list[str]]:
        yield list(batch)
        await gate.wait()
        yield list(batch)

    batcher = AdaptiveBatcher(model, max_batch_size=1, window_ms=0)
    running = batcher.submit_stream("a")
    assert await running.__anext__() == "a"
    queued = batcher.submit_stream("b")
    closing = asyncio.ensure_future(batcher.aclose(drain=False))
    seen, error = await read_until_error(queued)
    assert seen == [] and isinstance(error, BatcherClosedError)
    gate.set()  # the running batch finishes: its stream ends normally
    assert await read(running) == ["a"]
    await closing


async def test_a_close_that_times_out_ends_running_streams_with_a_typed_error() -> None:
    async def endless(batch: list[str]) -> AsyncIterator[list[str]]:
        yield list(batch)
        await asyncio.Event().wait()
        yield list(batch)  # pragma: no cover - never reached

    batcher = AdaptiveBatcher(endless, max_batch_size=1, window_ms=0)
    stream = batcher.submit_stream("a")
    assert await stream.__anext__() == "a"
    await batcher.aclose(timeout_s=0.01)
    with pytest.raises(BatcherClosedError):
        await stream.__anext__()
    # counted as completed at its first element, it moves to failed: counted once
    counts = batcher.stats().counts
    assert (counts.submitted, counts.completed, counts.failed) == (1, 0, 1)


async def test_a_stream_that_misses_its_deadline_fails_with_deadline_exceeded() -> None:
    gate = asyncio.Event()

    async def model(batch: list[str]) -> AsyncIterator[list[str]]:
        await gate.wait()
        yield list(batch)

    async with AdaptiveBatcher(model, max_batch_size=1, window_ms=0) as batcher:
        blocking = batcher.submit_stream("a")
        late = batcher.submit_stream("b", deadline_ms=10)
        seen, error = await read_until_error(late)
        assert seen == [] and isinstance(error, DeadlineExceededError)
        gate.set()
        assert await read(blocking) == ["a"]


async def test_submit_on_a_streaming_model_returns_all_elements_of_its_stream() -> None:
    async with AdaptiveBatcher(three_steps, max_batch_size=4, window_ms=10) as batcher:
        assert await batcher.submit_many(["a", "b"]) == [["a0", "a1", "a2"], ["b0", "b1", "b2"]]


async def test_padding_to_a_bucket_drops_the_padded_elements() -> None:
    sizes: list[int] = []

    async def model(batch: list[str]) -> AsyncIterator[list[str]]:
        sizes.append(len(batch))
        yield list(batch)

    async with AdaptiveBatcher(
        model, max_batch_size=4, window_ms=20, batch_sizes=[1, 4]
    ) as batcher:
        results = await asyncio.gather(*(read(batcher.submit_stream(x)) for x in "abc"))
    assert results == [["a"], ["b"], ["c"]]
    assert sizes == [4]


async def test_a_pad_fn_of_the_wrong_length_fails_the_streams_clearly() -> None:
    sizes: list[int] = []

    async def model(batch: list[str]) -> AsyncIterator[list[str]]:
        sizes.append(len(batch))
        yield list(batch)

    async with AdaptiveBatcher(
        model, max_batch_size=4, window_ms=20, batch_sizes=[4], pad_fn=lambda items, n: items
    ) as batcher:
        outcomes = await asyncio.gather(
            *(read_until_error(batcher.submit_stream(x)) for x in "abc")
        )
    assert all(type(error) is PaddingError for _, error in outcomes)
    assert str(outcomes[0][1]).startswith("pad_fn returned 3 items for a batch of 3 padded to 4")
    assert sizes == []


async def test_a_pad_fn_that_raises_fails_the_streams_with_padding_error() -> None:
    sizes: list[int] = []

    async def model(batch: list[str]) -> AsyncIterator[list[str]]:
        sizes.append(len(batch))
        yield list(batch)

    def failing_pad(items: list[str], target: int) -> list[str]:
        raise KeyError(target)

    async with AdaptiveBatcher(
        model, max_batch_size=4, window_ms=20, batch_sizes=[4], pad_fn=failing_pad
    ) as batcher:
        outcomes = await asyncio.gather(
            *(read_until_error(batcher.submit_stream(x)) for x in "abc")
        )
    assert all(type(error) is PaddingError for _, error in outcomes)
    assert str(outcomes[0][1]) == "pad_fn raised KeyError(4) padding a batch of 3 to 4"
    assert all(isinstance(error.__cause__, KeyError) for _, error in outcomes)
    assert sizes == []


async def test_streaming_options_that_cannot_apply_are_refused() -> None:
    with pytest.raises(TypeError, match="executor='thread' cannot run an async generator"):
        AdaptiveBatcher(three_steps, executor="thread")
    with pytest.raises(ValueError, match="bisect_on_error does not apply to a streaming model"):
        AdaptiveBatcher(three_steps, bisect_on_error=True)

    async def plain(batch: list[str]) -> list[str]:
        return batch

    async with AdaptiveBatcher(plain) as batcher:
        with pytest.raises(TypeError, match="submit_stream needs a streaming model"):
            batcher.submit_stream("a")


async def test_an_object_whose_call_is_an_async_generator_streams() -> None:
    class StreamingCallable:
        async def __call__(self, batch: list[str]) -> AsyncIterator[list[str]]:
            yield list(batch)

    async with AdaptiveBatcher(StreamingCallable(), max_batch_size=2, window_ms=10) as batcher:
        assert await read(batcher.submit_stream("a")) == ["a"]


async def test_a_streaming_model_behind_a_functools_wraps_decorator_still_streams() -> None:
    """A logging or tracing decorator made with ``functools.wraps`` returns the wrapped async
    generator's stream: the batcher sees through it (it used to take the model for a plain
    one and fail every request with ``ResultCountError``)."""
    calls: list[int] = []

    def traced(fn: Any) -> Any:
        @functools.wraps(fn)
        def wrapper(batch: list[str]) -> Any:
            calls.append(len(batch))
            return fn(batch)

        return wrapper

    async with AdaptiveBatcher(traced(three_steps), max_batch_size=4, window_ms=20) as batcher:
        assert await read(batcher.submit_stream("a")) == ["a0", "a1", "a2"]
    assert calls == [1]


async def test_what_a_model_returns_decides_if_it_streams_not_what_it_wraps() -> None:
    """A plain function annotated ``-> AsyncIterator[...]`` streams (as a type checker reads
    it, and its calls return a generator); an ``async def`` wrapper of a generator function,
    made with ``functools.wraps``, is a plain async model (its calls return a coroutine)."""

    def first_two(batch: list[str]) -> AsyncIterator[list[str]]:
        return three_steps(batch)

    @functools.wraps(three_steps)
    async def last_step(batch: list[str]) -> list[str]:
        last: list[str] = []
        async for step in three_steps(batch):
            last = step
        return last

    async with AdaptiveBatcher(first_two, window_ms=1) as streaming:
        assert await read(streaming.submit_stream("a")) == ["a0", "a1", "a2"]
    async with AdaptiveBatcher(last_step, window_ms=1) as whole:
        assert await whole.submit("b") == "b2"


async def test_a_plain_function_returning_an_async_generator_says_how_to_fix_it() -> None:
    """A model that cannot be seen to stream (a lambda around a generator function) fails its
    callers with a hint, as a plain function that returns a coroutine does."""
    async with AdaptiveBatcher(lambda batch: three_steps(batch), window_ms=1) as batcher:
        with pytest.raises(ResultCountError, match="returned an async generator"):
            await batcher.submit("a")


async def test_batched_close_with_a_timeout_ends_a_hung_streams_callers() -> None:
    """``aclose(timeout_s=...)`` on the decorated function, as on the batcher: a model that
    never yields again cannot hold the close, and its caller gets a typed error."""

    @batched(max_batch_size=2, window_ms=1)
    async def hangs(prompts: list[str]) -> AsyncIterator[list[str]]:
        yield list(prompts)
        await asyncio.Event().wait()
        yield list(prompts)

    stream = hangs("x")
    assert await anext(stream) == "x"  # the model now hangs before its second step
    reading = asyncio.ensure_future(read_until_error(stream))
    await asyncio.wait_for(hangs.aclose(timeout_s=0.05), timeout=5.0)
    seen, error = await reading
    assert seen == [] and isinstance(error, BatcherClosedError)


async def test_a_second_close_of_a_batched_function_waits_for_the_first() -> None:
    """Two tasks close the same ``@batched`` function at once: neither returns before its
    batcher is closed (the second used to find nothing to close and return at once, with
    the hung call still pending)."""
    release = asyncio.Event()

    @batched(max_batch_size=2, window_ms=1)
    async def hangs(xs: list[int]) -> list[int]:
        await release.wait()
        return xs

    call = asyncio.ensure_future(hangs(1))
    await asyncio.sleep(0.01)  # the call's batch is running
    first = asyncio.ensure_future(hangs.aclose(timeout_s=0.3))
    second = asyncio.ensure_future(hangs.aclose(timeout_s=0.3))
    await asyncio.sleep(0.05)
    assert not second.done() and not call.done()
    await asyncio.wait_for(asyncio.gather(first, second), timeout=5.0)
    with pytest.raises(BatcherClosedError):
        await call


async def test_batched_on_an_async_generator_gives_streams() -> None:
    @batched(max_batch_size=2, window_ms=20)
    async def generate(prompts: list[str]) -> AsyncIterator[list[str]]:
        for step in range(2):
            yield [f"{p}:{step}" for p in prompts]

    assert isinstance(generate, BatchedStream)
    results = await asyncio.gather(read(generate("x")), read(generate("y")))
    assert results == [["x:0", "x:1"], ["y:0", "y:1"]]
    await generate.aclose()


async def test_batched_stream_on_a_method_keeps_one_batcher_per_instance() -> None:
    class Generator:
        def __init__(self, tag: str) -> None:
            self.tag = tag
            self.batches: list[list[str]] = []

        @batched(max_batch_size=4, window_ms=20)
        async def generate(self, prompts: list[str]) -> AsyncIterator[list[str]]:
            self.batches.append(list(prompts))
            yield [f"{self.tag}:{p}" for p in prompts]

    one, two = Generator("1"), Generator("2")
    results = await asyncio.gather(read(one.generate("a")), read(two.generate("b")))
    assert results == [["1:a"], ["2:b"]]
    assert (one.batches, two.batches) == ([["a"]], [["b"]])
    await one.generate.aclose()
    await two.generate.aclose()


async def test_warmup_runs_a_streaming_model_to_the_end_at_each_size() -> None:
    steps: list[int] = []

    async def model(batch: list[int]) -> AsyncIterator[list[int]]:
        for _ in range(2):
            steps.append(len(batch))
            yield list(batch)

    async with AdaptiveBatcher(model, max_batch_size=4, batch_sizes=[2, 4]) as batcher:
        timings = await batcher.warmup(lambda: 1)
        assert sorted(timings) == [2, 4]
    assert steps == [2, 2, 4, 4]


async def test_a_second_task_reading_a_stream_gets_a_typed_error_and_the_first_reads_on() -> None:
    """Before: the second reader replaced the first's wake-up, and the first waited forever,
    even after the stream had ended."""
    gate = asyncio.Event()

    async def model(batch: list[str]) -> AsyncIterator[list[str]]:
        await gate.wait()
        for step in range(3):
            yield [f"{item}{step}" for item in batch]

    async with AdaptiveBatcher(model, max_batch_size=1, window_ms=0) as batcher:
        stream = batcher.submit_stream("a")
        first = asyncio.ensure_future(read(stream))
        await asyncio.sleep(0.01)  # the first reader waits for an element
        try:
            with pytest.raises(
                ConcurrentReadError,
                match=r"^another task is already waiting for this stream's next element; "
                r"a stream has one reader at a time$",
            ):
                await asyncio.wait_for(anext(stream), timeout=5)
        finally:
            gate.set()
        assert await asyncio.wait_for(first, timeout=5) == ["a0", "a1", "a2"]
        counts = batcher.stats().counts
    assert (counts.submitted, counts.completed) == (1, 1)


async def test_tasks_may_take_turns_reading_a_stream() -> None:
    async with AdaptiveBatcher(three_steps, max_batch_size=1, window_ms=0) as batcher:
        stream = batcher.submit_stream("a")
        assert await asyncio.ensure_future(anext(stream)) == "a0"
        assert await asyncio.ensure_future(anext(stream)) == "a1"
        assert await asyncio.wait_for(read(stream), timeout=5) == ["a2"]


async def ten_steps(batch: list[str]) -> AsyncIterator[list[str]]:
    for step in range(10):
        await asyncio.sleep(0)
        yield [f"{item}{step}" for item in batch]


async def test_a_reader_that_falls_behind_its_bound_fails_with_buffer_full() -> None:
    """stream_overflow="fail": the slow stream ends after its buffered elements with a typed
    error; its batchmate reads every element (before, buffers grew without limit)."""
    async with AdaptiveBatcher(
        ten_steps, max_batch_size=2, window_ms=0, max_buffered_elements=3
    ) as batcher:
        slow = batcher.submit_stream("s")
        fast = asyncio.ensure_future(read(batcher.submit_stream("f")))
        assert await fast == [f"f{i}" for i in range(10)]
        seen, error = await read_until_error(slow)
        counts = batcher.stats().counts
    assert seen == ["s0", "s1", "s2"]
    assert isinstance(error, StreamBufferFullError)
    assert str(error) == (
        "the reader fell behind: 3 elements were waiting unread (max_buffered_elements) when "
        "the model produced another"
    )
    assert (counts.submitted, counts.completed, counts.failed) == (2, 1, 1)


async def test_hold_makes_the_model_wait_for_the_slowest_reader_and_drops_nothing() -> None:
    produced: list[int] = []

    async def model(batch: list[str]) -> AsyncIterator[list[str]]:
        for step in range(10):
            produced.append(step)
            yield [f"{item}{step}" for item in batch]

    async with AdaptiveBatcher(
        model, max_batch_size=2, window_ms=0, max_buffered_elements=2, stream_overflow="hold"
    ) as batcher:
        slow = batcher.submit_stream("s")
        fast = asyncio.ensure_future(read(batcher.submit_stream("f")))
        await asyncio.sleep(0.05)
        assert len(produced) == 2  # held: the slow reader has read nothing, its buffer is full
        assert not fast.done()
        seen = []
        async for element in slow:
            seen.append(element)
            assert len(produced) - len(seen) <= 2  # never more than the bound ahead of it
            await asyncio.sleep(0)
        assert await fast == [f"f{i}" for i in range(10)]
        counts = batcher.stats().counts
    assert seen == [f"s{i}" for i in range(10)]
    assert (counts.completed, counts.failed) == (2, 0)


async def test_a_held_batch_goes_on_when_the_full_stream_is_closed() -> None:
    async with AdaptiveBatcher(
        ten_steps, max_batch_size=2, window_ms=0, max_buffered_elements=1, stream_overflow="hold"
    ) as batcher:
        stuck = batcher.submit_stream("s")
        fast = asyncio.ensure_future(read(batcher.submit_stream("f")))
        await asyncio.sleep(0.02)
        assert not fast.done()
        await stuck.aclose()  # withdrawn after its first element: the hold is released
        assert await asyncio.wait_for(fast, timeout=5) == [f"f{i}" for i in range(10)]
        counts = batcher.stats().counts
    assert (counts.completed, counts.cancelled) == (2, 0)


async def test_stream_buffer_options_are_checked() -> None:
    with pytest.raises(ValueError, match=r"^stream_overflow must be one of 'fail', 'hold', "):
        AdaptiveBatcher(three_steps, stream_overflow="drop")
    with pytest.raises(ValueError, match=r"^max_buffered_elements must be >= 1, got 0$"):
        AdaptiveBatcher(three_steps, max_buffered_elements=0)
    with pytest.raises(
        ValueError,
        match=r"^max_buffered_elements bounds the elements a stream buffers: it needs a "
        r"streaming model \(an async generator function\)$",
    ):
        AdaptiveBatcher(lambda b: b, max_buffered_elements=4)


async def test_a_reader_cancelled_as_its_stream_fails_marks_the_error_read_at_once() -> None:
    """Before: the error was marked read only when the stream object was collected; in a
    reference cycle the future could be finalized first and log 'Future exception was never
    retrieved' (found by the chaos run: a reader cancelled as its request expired)."""
    gate = asyncio.Event()

    async def busy(batch: list[int]) -> AsyncIterator[list[int]]:
        await gate.wait()
        yield batch

    batcher = AdaptiveBatcher(busy, max_batch_size=1, window_ms=0)
    first = batcher.submit_stream(0)  # holds the only slot
    stream = batcher.submit_stream(1, deadline_ms=5)  # expires while the slot is busy
    reader = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0)
    handle = stream._request.handle  # type: ignore[attr-defined]
    handle.add_done_callback(lambda _: reader.cancel())  # cancelled in the expiry's turn
    with pytest.raises(asyncio.CancelledError):
        await reader
    assert handle.done()
    assert handle._log_traceback is False  # read: nothing will be logged when it is collected
    assert isinstance(handle.exception(), DeadlineExceededError)
    gate.set()
    assert await read(first) == [0]
    await batcher.aclose()


def test_shedding_counts_a_streams_time_to_its_first_element() -> None:
    """A stream's latency ends at its first element: a request that starts its batch by the
    SLO less that first step's time is in time. Ten steps of 4 ms on 2 slots, SLO 102 ms,
    622 req/s: the deadlines left the whole stream's time (40 ms and more), and 9 % of the
    requests were shed that would have met the SLO (virtual time: exact)."""

    async def model(batch: list[int]) -> AsyncIterator[list[int]]:
        for _ in range(10):
            await asyncio.sleep(0.004 + 0.0001 * len(batch))
            yield list(batch)

    async def main() -> tuple[int, int, int]:
        batcher = AdaptiveBatcher(
            model, slo=SLO(latency_ms=102), shed_late=True, max_concurrent_batches=2
        )
        rng = random.Random(1)

        async def one(item: int) -> None:
            with contextlib.suppress(DeadlineExceededError):
                await read(batcher.submit_stream(item))

        tasks = []
        for item in range(3110):  # 5 s of Poisson arrivals at 622 req/s
            tasks.append(asyncio.ensure_future(one(item)))
            await asyncio.sleep(rng.expovariate(622.0))
        await asyncio.gather(*tasks)
        counts = batcher.stats().counts
        await batcher.aclose()
        return counts.expired, counts.completed, counts.within_slo

    expired, completed, within = run_in_virtual_time(main())
    assert expired == 0
    assert completed == within == 3110


async def test_a_stream_that_runs_out_of_memory_before_its_first_step_is_split() -> None:
    """Before: a streaming batch that ran out of memory failed whole, where a batch answered at
    once is re-run in halves (a fresh user's finding, 2026-12-06): nothing had been delivered,
    so nothing stood in the way. ``submit`` callers of a streaming model are split alike."""
    sizes: list[int] = []

    async def model(batch: list[str]) -> AsyncIterator[list[str]]:
        sizes.append(len(batch))
        if len(batch) > 2:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        async for step in three_steps(batch):
            yield step

    async with AdaptiveBatcher(model, max_batch_size=8, window_ms=50) as batcher:
        streams = [batcher.submit_stream(x) for x in "abcdef"]
        collected = batcher.submit("g"), batcher.submit("h")
        results = await asyncio.gather(*(read(s) for s in streams), *collected)
    assert results == [[f"{x}{k}" for k in range(3)] for x in "abcdefgh"]
    assert sizes == [8, 4, 2, 2, 4, 2, 2]
    counts = batcher.stats().counts
    assert (counts.oom_errors, counts.completed, counts.failed) == (3, 8, 0)


async def test_a_stream_that_runs_out_of_memory_after_answering_fails_its_callers() -> None:
    """Once a step is delivered a stream cannot be re-run: its callers have elements."""
    sizes: list[int] = []

    async def model(batch: list[str]) -> AsyncIterator[list[str]]:
        sizes.append(len(batch))
        yield [f"{item}0" for item in batch]
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")

    async with AdaptiveBatcher(model, max_batch_size=4, window_ms=50) as batcher:
        outcomes = await asyncio.gather(*(read_until_error(batcher.submit_stream(x)) for x in "ab"))
    assert sizes == [2]
    assert [seen for seen, _ in outcomes] == [["a0"], ["b0"]]
    assert all(isinstance(error, BatchFailedError) for _, error in outcomes)
    assert batcher.stats().counts.oom_errors == 1

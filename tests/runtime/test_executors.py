"""Executors: where the model runs, and the CUDA "split" mode with a fake event (no GPU)."""

from __future__ import annotations

import asyncio
import itertools
import sqlite3
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from structlog.testing import capture_logs

from adaptive_batcher import AdaptiveBatcher, BatcherClosedError
from adaptive_batcher.runtime.executors import (
    INLINE_LEAVE_CALLS,
    INLINE_LEAVE_S,
    INLINE_STALL_S,
    INLINE_TRIES,
)
from adaptive_batcher.testing import FakeCudaEvent


def recording_model(threads: list[str]) -> Any:
    def model(batch: list[int]) -> list[int]:
        threads.append(threading.current_thread().name)
        return [i * 2 for i in batch]

    return model


@pytest.mark.parametrize(
    ("executor", "on_loop_thread"), [("inline", True), ("thread", False), ("auto", False)]
)
async def test_sync_executors_run_where_they_say(executor: str, on_loop_thread: bool) -> None:
    threads: list[str] = []
    async with AdaptiveBatcher(
        recording_model(threads), max_batch_size=4, window_ms=1, executor=executor
    ) as batcher:
        assert await batcher.submit_many([1, 2, 3]) == [2, 4, 6]
    loop_thread = threading.current_thread().name
    assert all((name == loop_thread) is on_loop_thread for name in threads)
    if not on_loop_thread:
        assert all(name.startswith("adaptive-batcher-model") for name in threads)


async def test_cuda_executor_launches_on_loop_and_waits_in_a_thread() -> None:
    FakeCudaEvent.reset()
    gate = threading.Event()
    threads: list[str] = []
    batcher = AdaptiveBatcher(
        recording_model(threads),
        max_batch_size=4,
        window_ms=0,
        executor="cuda",
        cuda_event_factory=lambda: FakeCudaEvent(gate),
    )
    pending = asyncio.create_task(batcher.submit_many([1, 2]))
    await asyncio.sleep(0.020)
    # the "GPU" is still busy, yet the loop runs other work and the request is not done
    assert not pending.done()
    assert threads == [threading.current_thread().name]
    gate.set()
    assert await pending == [2, 4]
    await batcher.aclose()
    assert FakeCudaEvent.created == 1
    assert FakeCudaEvent.synchronized_threads[0].startswith("adaptive-batcher-cuda-wait")


def test_cuda_executor_without_gpu_is_refused_at_construction() -> None:
    import torch

    if torch.cuda.is_available():  # pragma: no cover - GPU machines run tests/gpu instead
        pytest.skip("a CUDA device is present")
    with pytest.raises(
        RuntimeError, match=r"needs a CUDA device \(torch.cuda.is_available\(\) is False\)"
    ):
        AdaptiveBatcher(lambda batch: batch, executor="cuda")


async def test_two_slots_run_batches_concurrently() -> None:
    running = 0
    peak = 0

    async def model(batch: list[int]) -> list[int]:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.020)
        running -= 1
        return batch

    async with AdaptiveBatcher(
        model, max_batch_size=2, window_ms=0, max_concurrent_batches=2
    ) as batcher:
        assert await batcher.submit_many(range(8)) == list(range(8))
    assert peak == 2


@pytest.mark.parametrize(
    ("model", "executor", "error", "message"),
    [
        (lambda b: b, "async", TypeError, "executor='async' needs an async def model"),
        (None, "inline", TypeError, "executor='inline' needs a sync model"),
        (
            lambda b: b,
            "gpu",
            ValueError,
            "executor must be one of auto, async, inline, thread, adaptive",
        ),
        (
            lambda b: b,
            None,
            TypeError,
            "^executor must be a str, one of auto, async, inline, thread, adaptive, cuda; "
            "got NoneType$",
        ),
    ],
)
def test_executor_mismatch_is_a_clear_error(
    model: Any, executor: str, error: type[Exception], message: str
) -> None:
    async def async_model(batch: list[int]) -> list[int]:
        return batch

    with pytest.raises(error, match=message):
        AdaptiveBatcher(model or async_model, executor=executor)


def _block_loop(seconds: float) -> None:
    """A blocking call: the event loop that makes it stands still for ``seconds``."""
    time.sleep(seconds)


async def _stall_loop_once(started: threading.Event, seconds: float) -> None:
    """Block the event loop for ``seconds`` once ``started`` is set (a model call began)."""
    assert await asyncio.to_thread(started.wait, 5.0)
    _block_loop(seconds)  # the call's end is noticed late


async def test_a_thread_models_time_is_measured_in_its_thread() -> None:
    """A call of 10 ms whose end the stalled loop noticed 150 ms late took 10 ms: the service
    time and the device time are the model's, not the loop's lateness (the README's FastAPI
    app read a batch of 4 at 3.4 ms from the loop, 0.34 ms in its thread)."""
    started = threading.Event()

    def model(batch: list[int]) -> list[int]:
        started.set()
        time.sleep(0.010)
        return batch

    async with AdaptiveBatcher(model, max_batch_size=4, executor="thread") as batcher:
        pending = asyncio.create_task(batcher.submit(1))
        await _stall_loop_once(started, 0.150)
        assert await pending == 1
        (run,) = batcher._core.recorder.batches
        busy_s = batcher.stats().counts.device_busy_s
    assert 0.010 <= run.service_s < 0.100
    assert 0.010 <= busy_s < 0.100


async def test_a_cuda_calls_time_ends_when_its_event_completes() -> None:
    """The split executor's call runs from the launch to the event's completion in the waiter
    thread, not to the loop noticing it 150 ms later."""
    FakeCudaEvent.reset()
    gate, launched = threading.Event(), threading.Event()

    def model(batch: list[int]) -> list[int]:
        launched.set()
        threading.Timer(0.010, gate.set).start()  # the "GPU" finishes 10 ms after the launch
        return batch

    batcher = AdaptiveBatcher(
        model, max_batch_size=4, executor="cuda", cuda_event_factory=lambda: FakeCudaEvent(gate)
    )
    async with batcher:
        pending = asyncio.create_task(batcher.submit(1))
        await _stall_loop_once(launched, 0.150)
        assert await pending == 1
        (run,) = batcher._core.recorder.batches
    assert 0.010 <= run.service_s < 0.100


def threaded_model(threads: list[str], delay_s: list[float]) -> Any:
    """A sync model that notes its thread and sleeps ``delay_s[0]`` per call."""

    def model(batch: list[int]) -> list[int]:
        threads.append(threading.current_thread().name)
        time.sleep(delay_s[0])
        return batch

    return model


@pytest.mark.parametrize("executor", ["adaptive", "auto"])
async def test_adaptive_runs_a_short_model_on_the_loop_after_warmup(executor: str) -> None:
    """A call of the largest batch within ``INLINE_MAX_S``: ``"adaptive"`` moves the model from
    its thread to the loop (a 0.1 ms model in a thread fought the loop for the GIL); ``"auto"``
    keeps it in the thread, where a hung call cannot hold the loop."""
    threads: list[str] = []
    loop_thread = threading.current_thread().name
    model = threaded_model(threads, [0.0])
    with capture_logs() as logs:
        async with AdaptiveBatcher(model, max_batch_size=8, executor=executor) as batcher:
            assert await batcher.submit(1) == 1
            assert threads[-1] != loop_thread  # before warm-up: the thread
            await batcher.warmup(lambda: 0)
            threads.clear()
            assert await batcher.submit_many([1, 2, 3]) == [1, 2, 3]
            where = batcher.stats().executor
    chosen = [(e["kind"], e["reason"]) for e in logs if e["event"] == "batcher.executor_chosen"]
    if executor == "adaptive":
        assert threads and set(threads) == {loop_thread}
        assert (chosen, where) == ([("inline", "warmup")], "inline")
    else:
        assert threads and loop_thread not in threads
        assert (chosen, where) == ([], "thread")


@pytest.mark.parametrize(("delay_s", "slots"), [(0.003, 1), (0.0, 2)])
async def test_adaptive_keeps_a_slow_model_or_several_slots_in_threads(
    delay_s: float, slots: int
) -> None:
    threads: list[str] = []
    model = threaded_model(threads, [delay_s])
    async with AdaptiveBatcher(
        model, max_batch_size=8, max_concurrent_batches=slots, executor="adaptive"
    ) as batcher:
        await batcher.warmup(lambda: 0)
        threads.clear()
        assert await batcher.submit_many([1, 2]) == [1, 2]
    assert threads and all(name.startswith("adaptive-batcher-model") for name in threads)


async def test_adaptive_keeps_a_model_that_fails_on_the_loop_in_its_thread() -> None:
    """A short model bound to its thread (a sqlite connection opened on its first call) works
    there and fails on the loop: warm-up's call there fails, and it stays in the thread
    (before, every request after warm-up failed)."""
    connection: list[sqlite3.Connection] = []

    def model(batch: list[int]) -> list[int]:
        if not connection:
            connection.append(sqlite3.connect(":memory:"))
        return [connection[0].execute("select ? * 2", (item,)).fetchone()[0] for item in batch]

    with capture_logs() as logs:
        async with AdaptiveBatcher(model, max_batch_size=4, executor="adaptive") as batcher:
            await batcher.warmup(lambda: 0)
            assert await batcher.submit_many([1, 2, 3]) == [2, 4, 6]
    chosen = [(e["kind"], e["reason"]) for e in logs if e["event"] == "batcher.executor_chosen"]
    assert chosen == [("inline", "warmup"), ("thread", "inline_failed")]


@pytest.mark.parametrize(
    ("delays_s", "reason"),
    [
        ([INLINE_LEAVE_S * 1.5] * INLINE_LEAVE_CALLS, "long_calls"),
        ([INLINE_STALL_S * 1.2], "stalled_loop"),
    ],
)
async def test_adaptive_sends_a_model_whose_calls_grow_long_back_to_its_thread(
    delays_s: list[float], reason: str
) -> None:
    """Three inline calls over ``INLINE_LEAVE_S`` among the last 16, or one over
    ``INLINE_STALL_S``: the loop is blocked past what warm-up promised, and the model goes
    back to its thread for good (a later warm-up included)."""
    threads: list[str] = []
    delay = [0.0]
    loop_thread = threading.current_thread().name
    model = threaded_model(threads, delay)
    with capture_logs() as logs:
        async with AdaptiveBatcher(model, max_batch_size=8, executor="adaptive") as batcher:
            await batcher.warmup(lambda: 0)
            for item, delay_s in enumerate(delays_s):
                delay[0] = delay_s
                assert await batcher.submit(item) == item
            assert set(threads[-len(delays_s) :]) == {loop_thread}
            delay[0] = 0.0
            await batcher.warmup(lambda: 0)  # short again: the loop is left for good all the same
            threads.clear()
            for item in range(4):
                assert await batcher.submit(item) == item
            where = batcher.stats().executor
    assert threads and loop_thread not in threads
    chosen = [(e["kind"], e["reason"]) for e in logs if e["event"] == "batcher.executor_chosen"]
    # the second warm-up says why the model stays in its thread
    expected = [("inline", "warmup"), ("thread", reason), ("thread", "left_loop")]
    assert (chosen, where) == (expected, "thread")


async def _twice(batch: list[int]) -> list[int]:
    return [2 * item for item in batch]


async def _stream_twice(batch: list[int]) -> AsyncIterator[list[int]]:
    yield [2 * item for item in batch]


@pytest.mark.parametrize(
    ("model", "executor", "where"),
    [
        (lambda batch: batch, "auto", "thread"),
        (lambda batch: batch, "inline", "inline"),
        (lambda batch: batch, "adaptive", "thread"),
        (_twice, "auto", "async"),
        (_stream_twice, "auto", "stream"),
    ],
)
async def test_stats_say_where_the_model_runs(model: Any, executor: str, where: str) -> None:
    async with AdaptiveBatcher(model, max_batch_size=4, executor=executor) as batcher:
        assert batcher.stats().executor == where


def _block(seconds: float) -> None:
    """A blocking call in the app's code: the event loop stands still."""
    time.sleep(seconds)


async def test_a_loop_stall_that_an_inline_model_call_caused_says_so() -> None:
    """``batcher.loop_stalled`` told an app's author nothing when the stall was the batcher's
    own model call on the loop (``executor="adaptive"``): they looked for it in their code.
    It now carries the call's length; a stall of the app's own (a blocking call in a handler)
    does not."""
    delay = [0.0]
    model = threaded_model([], delay)
    with capture_logs() as logs:
        async with AdaptiveBatcher(
            model, window_ms=20.0, max_batch_size=8, executor="adaptive"
        ) as batcher:
            await batcher.warmup(lambda: 0)
            pending = asyncio.ensure_future(batcher.submit(1))
            await asyncio.sleep(0.005)  # queued, its window's timer set
            _block(0.2)  # the app's own stall, a request waiting in the window
            assert await pending == 1
            delay[0] = 0.2
            assert await batcher.submit(2) == 2  # the model's: 200 ms on the loop
    stalls = [e for e in logs if e["event"] == "batcher.loop_stalled"]
    assert len(stalls) == 2, stalls
    assert "inline_call_ms" not in stalls[0]
    assert stalls[1]["inline_call_ms"] >= 200.0


async def test_adaptive_looks_past_a_few_slow_calls_of_the_largest_batch() -> None:
    """A fresh user's starts of the README app on a busy two-core machine: both calls of the
    batch of 64 that warm-up timed read 7.5 ms in 2 of 6 starts (the model takes 0.1 ms), and
    it stayed in its thread. The fastest of a few more calls decides."""
    slow_calls = [0.008, 0.008]  # the largest batch's first two calls: hiccups

    def model(batch: list[int]) -> list[int]:
        if len(batch) == 8 and slow_calls:
            time.sleep(slow_calls.pop())
        return batch

    with capture_logs() as logs:
        async with AdaptiveBatcher(model, max_batch_size=8, executor="adaptive") as batcher:
            await batcher.warmup(lambda: 0)
            where = batcher.stats().executor
    chosen = [(e["kind"], e["reason"]) for e in logs if e["event"] == "batcher.executor_chosen"]
    assert (chosen, where) == ([("inline", "warmup")], "inline")


@pytest.mark.parametrize(("in_thread_s", "where"), [(0.008, "inline"), (0.025, "thread")])
async def test_adaptive_times_its_tries_on_the_loop(in_thread_s: float, where: str) -> None:
    """A fresh user's starts of the README app on a busy two-core machine: all six calls of the
    batch of 64 read 7-11 ms in its thread (the model takes 0.1 ms on the loop), in 2 of 8
    starts, and it stayed in its thread. The tries run on the loop, where the model would run;
    none where the call in the thread took over ``INLINE_TRY_LIMIT_S`` (a try would hold the
    loop as long)."""
    on_loop: list[int] = []

    def model(batch: list[int]) -> list[int]:
        if threading.current_thread() is threading.main_thread():
            on_loop.append(len(batch))
        elif len(batch) == 8:
            time.sleep(in_thread_s)  # the thread's wake-up on a busy machine
        return batch

    with capture_logs() as logs:
        async with AdaptiveBatcher(model, max_batch_size=8, executor="adaptive") as batcher:
            await batcher.warmup(lambda: 0)
            where_now = batcher.stats().executor
    chosen = [(e["kind"], e["reason"]) for e in logs if e["event"] == "batcher.executor_chosen"]
    assert (chosen, where_now) == ([(where, "warmup")], where)
    assert bool(on_loop) is (where == "inline")


async def test_adaptive_looks_again_at_a_first_call_that_waited_for_a_core() -> None:
    """Beside four busy loops on two cores, the first call of the README app's 0.06 ms model
    took 34-50 ms in its thread in 4 of 12 starts, past the 20 ms under which tries on the
    loop begin, and it stayed in its thread. A second look in the thread decides."""
    slow_first = [0.03]

    def model(batch: list[int]) -> list[int]:
        if (
            len(batch) == 8
            and slow_first
            and threading.current_thread() is not threading.main_thread()
        ):
            time.sleep(slow_first.pop())
        return batch

    with capture_logs() as logs:
        async with AdaptiveBatcher(model, max_batch_size=8, executor="adaptive") as batcher:
            await batcher.warmup(lambda: 0)
            where = batcher.stats().executor
    chosen = [(e["kind"], e["reason"]) for e in logs if e["event"] == "batcher.executor_chosen"]
    assert (chosen, where) == ([("inline", "warmup")], "inline")


@pytest.mark.parametrize(("call_s", "most_tries"), [(0.011, 1), (0.003, INLINE_TRIES)])
async def test_adaptive_tries_hold_the_loop_one_call_at_a_time(
    call_s: float, most_tries: int
) -> None:
    """A fresh user's 15 ms model held the loop 77 ms during warm-up: five tries back to back.
    The loop runs between tries, and their total stays within ``INLINE_TRY_LIMIT_S``."""
    seen: list[str] = []

    def model(batch: list[int]) -> list[int]:
        if threading.current_thread() is threading.main_thread():
            seen.append("try")
        if len(batch) == 8:
            time.sleep(call_s)
        return batch

    async def ticks() -> None:
        while True:
            seen.append("tick")
            await asyncio.sleep(0)

    async with AdaptiveBatcher(model, max_batch_size=8, executor="adaptive") as batcher:
        ticking = asyncio.create_task(ticks())
        await batcher.warmup(lambda: 0)
        ticking.cancel()
        where = batcher.stats().executor
    tries = [k for k, what in enumerate(seen) if what == "try"]
    assert where == "thread" and 1 <= len(tries) <= most_tries
    assert all(later - earlier > 1 for earlier, later in itertools.pairwise(tries))


async def test_a_close_between_tries_on_the_loop_ends_the_warmup() -> None:
    """The loop runs between warm-up's tries; a close that it runs there stops them, as it
    stops warm-up's calls in the thread."""
    closing: list[asyncio.Task[None]] = []

    def model(batch: list[int]) -> list[int]:
        if threading.current_thread() is threading.main_thread() and not closing:
            closing.append(asyncio.get_running_loop().create_task(batcher.aclose()))
        time.sleep(0.002)  # over INLINE_MAX_S: the tries go on
        return batch

    batcher = AdaptiveBatcher(model, max_batch_size=4, executor="adaptive")
    with pytest.raises(BatcherClosedError, match="during warm-up"):
        await batcher.warmup(lambda: 0)
    await closing[0]
    assert batcher.closed


async def test_adaptive_keeps_a_model_whose_try_on_the_loop_fails_in_its_thread() -> None:
    """A model slow in its thread and bound to it: the first try on the loop fails, and it
    stays in the thread for good, saying why."""

    def model(batch: list[int]) -> list[int]:
        if threading.current_thread() is threading.main_thread():
            raise RuntimeError("bound to its thread")
        time.sleep(0.003)
        return batch

    with capture_logs() as logs:
        async with AdaptiveBatcher(model, max_batch_size=4, executor="adaptive") as batcher:
            await batcher.warmup(lambda: 0)
            assert await batcher.submit_many([1, 2]) == [1, 2]
            where = batcher.stats().executor
    chosen = [(e["kind"], e["reason"]) for e in logs if e["event"] == "batcher.executor_chosen"]
    assert (chosen, where) == ([("thread", "inline_failed")], "thread")


async def test_adaptive_says_why_a_model_stays_in_its_thread() -> None:
    """A model over ``INLINE_MAX_S`` stayed in its thread with no event to say so: only a
    change was logged."""

    def model(batch: list[int]) -> list[int]:
        time.sleep(0.003)
        return batch

    with capture_logs() as logs:
        async with AdaptiveBatcher(model, max_batch_size=4, executor="adaptive") as batcher:
            await batcher.warmup(lambda: 0)
            where = batcher.stats().executor
    chosen = [e for e in logs if e["event"] == "batcher.executor_chosen"]
    assert [(e["kind"], e["reason"]) for e in chosen] == [("thread", "warmup")]
    assert chosen[0]["call_ms"] >= 3.0 and where == "thread"

"""What the runtime keeps and counts: nothing held after a request ends, counts that add up,
timers that survive nested pumps, clocks taken from the loop."""

from __future__ import annotations

import asyncio
import gc
import subprocess
import sys
import time
import weakref
from collections.abc import Coroutine
from typing import Any

from adaptive_batcher import AdaptiveBatcher, BatcherClosedError, BatcherError
from adaptive_batcher.metrics.recorder import Counts


class Blob:
    """An item or result that can be tracked with a weak reference."""


def ended_total(counts: Counts) -> int:
    return counts.completed + counts.failed + counts.rejected + counts.expired + counts.cancelled


async def test_nothing_is_held_after_requests_end() -> None:
    async def model(batch: list[Blob]) -> list[Blob]:
        return [Blob() for _ in batch]

    inputs: list[weakref.ref[Blob]] = []
    outputs: list[weakref.ref[Blob]] = []
    async with AdaptiveBatcher(model, max_batch_size=8, window_ms=0) as batcher:
        for _ in range(300):
            item = Blob()
            inputs.append(weakref.ref(item))
            outputs.append(weakref.ref(await batcher.submit(item)))
        del item
        await asyncio.sleep(0)  # the last batch's task finishes its bookkeeping
        gc.collect()
        assert sum(ref() is not None for ref in inputs + outputs) == 0


async def test_callers_cancelled_behind_a_waiting_head_are_not_kept() -> None:
    gate = asyncio.Event()

    async def model(batch: list[Any]) -> list[Any]:
        await gate.wait()
        return batch

    cancelled: list[weakref.ref[Blob]] = []
    async with AdaptiveBatcher(model, max_batch_size=1, window_ms=0) as batcher:
        running = asyncio.ensure_future(batcher.submit(Blob()))
        await asyncio.sleep(0.01)
        waiting = asyncio.ensure_future(batcher.submit(Blob()))  # the head, for the whole test
        for _ in range(2000):
            item = Blob()
            cancelled.append(weakref.ref(item))
            task = asyncio.ensure_future(batcher.submit(item))
            await asyncio.sleep(0)
            task.cancel()
            await asyncio.sleep(0)
        del item, task
        gc.collect()
        alive = sum(ref() is not None for ref in cancelled)
        gate.set()
        await asyncio.gather(running, waiting)
        counts = batcher.stats().counts
    assert alive <= 65  # a bounded few, not 2000
    assert counts.cancelled == 2000
    assert ended_total(counts) == counts.submitted == 2002


async def test_counts_add_up_when_callers_cancel_during_a_batch() -> None:
    gate = asyncio.Event()

    async def model(batch: list[int]) -> list[int]:
        await gate.wait()
        return batch

    async with AdaptiveBatcher(model, max_batch_size=1000, window_ms=0) as batcher:
        tasks = [asyncio.ensure_future(batcher.submit(i)) for i in range(1000)]
        await asyncio.sleep(0.01)  # one batch of 1000 is running
        for task in tasks[::2]:
            task.cancel()
        await asyncio.sleep(0.01)
        gate.set()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        counts = batcher.stats().counts
    assert results[1::2] == list(range(1, 1000, 2))
    assert (counts.completed, counts.cancelled) == (500, 500)
    assert ended_total(counts) == counts.submitted == 1000
    assert batcher.stats().latency.count == 500  # only the answered ones are latency samples


async def test_counts_add_up_after_a_close_without_draining() -> None:
    async def model(batch: list[int]) -> list[int]:
        await asyncio.sleep(0.05)
        return batch

    batcher = AdaptiveBatcher(model, max_batch_size=1, window_ms=0)
    tasks = [asyncio.ensure_future(batcher.submit(i)) for i in range(5)]
    await asyncio.sleep(0.01)
    await batcher.aclose(drain=False)
    results = await asyncio.gather(*tasks, return_exceptions=True)
    counts = batcher.stats().counts
    assert results[0] == 0
    assert all(isinstance(r, BatcherClosedError) for r in results[1:])
    assert (counts.completed, counts.rejected) == (1, 4)
    assert ended_total(counts) == counts.submitted == 5


async def test_counts_add_up_when_a_time_limited_close_gives_up() -> None:
    async def hung(batch: list[int]) -> list[int]:
        await asyncio.sleep(60)
        return batch

    batcher = AdaptiveBatcher(hung, max_batch_size=2, window_ms=0)
    tasks = [asyncio.ensure_future(batcher.submit(i)) for i in range(5)]
    await asyncio.sleep(0.01)
    await batcher.aclose(timeout_s=0.05)
    results = await asyncio.gather(*tasks, return_exceptions=True)
    counts = batcher.stats().counts
    assert all(isinstance(r, BatcherClosedError) for r in results)
    assert (counts.failed, counts.rejected) == (2, 3)  # two were running, three queued
    assert ended_total(counts) == counts.submitted == 5


async def test_a_time_limited_close_ends_batches_whose_task_never_started() -> None:
    """A batch dispatched just before the close times out has a task that is cancelled before
    it runs: its caller must still get an error, and its slot must be given back."""
    batcher = AdaptiveBatcher(lambda b: b, max_batch_size=1, window_ms=1.0, executor="inline")
    tasks = [asyncio.ensure_future(batcher.submit(i)) for i in range(10)]
    await asyncio.sleep(0)  # all queued
    await batcher.aclose(timeout_s=0)
    done, pending = await asyncio.wait(tasks, timeout=2.0)
    assert not pending
    results = [t.result() if t.exception() is None else t.exception() for t in done]
    assert any(isinstance(r, BatcherClosedError) for r in results)
    counts = batcher.stats().counts
    assert ended_total(counts) == counts.submitted == 10
    assert counts.failed == 0  # none reached the model: the ones not served were refused
    assert counts.rejected == 10 - counts.completed
    assert batcher.stats().in_flight_batches == 0


async def test_a_close_out_of_time_starts_no_more_inline_batches() -> None:
    """With an inline model every batch runs inside one loop turn: a close whose time is up
    must not let queued batches start while it winds down."""

    def model(batch: list[int]) -> list[int]:
        time.sleep(0.005)
        return batch

    batcher = AdaptiveBatcher(model, max_batch_size=8, window_ms=3, executor="inline")
    tasks = [asyncio.ensure_future(batcher.submit(i)) for i in range(100)]
    await asyncio.sleep(0.02)
    served_before = batcher.stats().counts.completed
    assert batcher.stats().queue_depth > 0
    await batcher.aclose(timeout_s=0)
    results = await asyncio.gather(*tasks, return_exceptions=True)
    closed = [r for r in results if isinstance(r, BatcherClosedError)]
    assert len(results) - len(closed) == served_before
    counts = batcher.stats().counts
    assert counts.completed == served_before
    assert ended_total(counts) == counts.submitted == 100


async def test_a_time_limited_close_does_not_wait_for_a_slow_cancellation() -> None:
    release = asyncio.Event()

    async def model(batch: list[int]) -> list[int]:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            await release.wait()  # a clean-up that takes its time
            raise
        return batch

    batcher = AdaptiveBatcher(model, max_batch_size=2, window_ms=0)
    tasks = [asyncio.ensure_future(batcher.submit(i)) for i in range(2)]
    await asyncio.sleep(0.01)
    started = time.monotonic()
    await asyncio.wait_for(batcher.aclose(timeout_s=0.05), 2.0)
    assert time.monotonic() - started < 1.0
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(isinstance(r, BatcherClosedError) for r in results)
    counts = batcher.stats().counts
    assert counts.failed == counts.submitted == 2
    release.set()  # let the model's clean-up end before the loop closes
    await asyncio.wait(asyncio.all_tasks() - {asyncio.current_task()}, timeout=1.0)


async def test_a_batch_task_cancelled_from_outside_before_it_runs_fails_its_callers() -> None:
    """Whatever cancels a batch's task before it runs (here: the application cancelling every
    task), its callers get a typed error and the batcher goes on serving."""
    batcher = AdaptiveBatcher(lambda b: b, max_batch_size=2, window_ms=0, executor="inline")
    first = [asyncio.ensure_future(batcher.submit(i)) for i in range(2)]
    await asyncio.sleep(0)  # the submits ran
    await asyncio.sleep(0)  # the pump ran: the batch's task is created, not yet run
    others = asyncio.all_tasks() - {*first, asyncio.current_task()}
    assert len(others) == 1
    others.pop().cancel()
    results = await asyncio.wait_for(asyncio.gather(*first, return_exceptions=True), 2.0)
    assert all(type(r) is BatcherError for r in results)
    assert "cancelled before it ran" in str(results[0])
    assert await batcher.submit(7) == 7  # the slot was given back
    counts = batcher.stats().counts
    assert (counts.failed, counts.completed) == (2, 1)
    assert ended_total(counts) == counts.submitted == 3


def _eager_task_factory(
    loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any]
) -> asyncio.Future[Any]:
    """Python 3.12's eager tasks, enough for coroutines that never suspend: the coroutine runs to
    its end inside create_task (the batcher's batches, with an inline model)."""
    done = loop.create_future()
    try:
        coro.send(None)
    except StopIteration as stop:
        done.set_result(stop.value)
        return done
    raise AssertionError("this factory only runs coroutines that finish without suspending")


def test_leftovers_are_served_when_batches_finish_inside_create_task() -> None:
    """A batch that ends inside create_task pumps again from within the pump; the outer pump's
    older timer setting must not cancel the window timer for the requests left over."""

    async def main() -> list[int]:
        loop = asyncio.get_running_loop()
        batcher = AdaptiveBatcher(lambda b: b, max_batch_size=4, window_ms=5, executor="inline")
        submitters = [asyncio.ensure_future(batcher.submit(i)) for i in range(6)]
        loop.set_task_factory(_eager_task_factory)  # type: ignore[arg-type]
        try:
            return await asyncio.wait_for(asyncio.gather(*submitters), 2.0)
        finally:
            loop.set_task_factory(None)

    assert asyncio.run(main()) == list(range(6))


def test_batches_ending_inside_create_task_do_not_nest_one_pump_per_batch() -> None:
    """With eager tasks, each batch that ends inside create_task used to pump again from within
    the pump: one level of recursion per batch, until RecursionError stranded callers."""

    async def main() -> list[int]:
        loop = asyncio.get_running_loop()
        batcher = AdaptiveBatcher(lambda b: b, max_batch_size=1, window_ms=0, executor="inline")
        submitters = [asyncio.ensure_future(batcher.submit(i)) for i in range(600)]
        loop.set_task_factory(_eager_task_factory)  # type: ignore[arg-type]
        try:
            return await asyncio.wait_for(asyncio.gather(*submitters), 5.0)
        finally:
            loop.set_task_factory(None)

    assert asyncio.run(main()) == list(range(600))


def test_a_clock_replaced_on_the_loop_instance_is_the_one_used() -> None:
    async def main() -> float:
        loop = asyncio.get_running_loop()
        loop.time = lambda: time.monotonic() - 1000.0  # type: ignore[method-assign]
        async with AdaptiveBatcher(lambda b: b, max_batch_size=8, window_ms=20.0) as batcher:
            started = time.monotonic()
            assert await asyncio.wait_for(batcher.submit(1), 2.0) == 1
            return time.monotonic() - started

    waited_s = asyncio.run(main())
    assert 0.015 <= waited_s < 1.0  # the 20 ms window, on the loop's own clock


def test_a_controller_imports_nothing_slow_on_the_loop() -> None:
    """The service-time fit is pure Python: no import (scikit-learn takes ~1 s) can stall the
    event loop in the first controller tick."""
    script = (
        "import asyncio, sys\n"
        "from adaptive_batcher import SLO, AdaptiveBatcher\n"
        "async def main():\n"
        "    async with AdaptiveBatcher(lambda b: b, slo=SLO(latency_ms=50),\n"
        "                               control_interval_ms=1, window_ms=0) as b:\n"
        "        for _ in range(300):\n"
        "            await b.submit(1)\n"
        "        assert b.stats().decisions > 0\n"
        "asyncio.run(main())\n"
        "print('sklearn' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"

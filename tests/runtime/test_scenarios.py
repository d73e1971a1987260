"""The eight scenarios of the batching semantics, on the real asyncio runtime (times scaled)."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from adaptive_batcher import (
    AdaptiveBatcher,
    DeadlineExceededError,
    QueueFullError,
    concat_rows,
    row_count,
)
from adaptive_batcher.testing import EchoModel, run_in_virtual_time


def now() -> float:
    return asyncio.get_running_loop().time()


async def test_1_full_batches_then_leftovers_without_new_arrival() -> None:
    """cap 4, window 100 ms, 10 requests at once, model 10 ms: batches 4, 4, 2."""
    model = EchoModel(delay_s=0.010)
    async with AdaptiveBatcher(model, max_batch_size=4, window_ms=100) as batcher:
        t0 = now()
        results = await asyncio.wait_for(batcher.submit_many(range(10)), timeout=2.0)
    assert results == list(range(10))
    assert model.sizes == [4, 4, 2]
    starts = [t - t0 for t in model.start_times]
    assert starts[1] < 0.060  # the second full batch went as soon as the slot was free
    assert 0.090 <= starts[2] < 0.200  # the leftovers went at their own window, from arrival


async def test_2_cancelled_requests_never_reach_the_model() -> None:
    """cap 8, window 2 ms, 16 requests, every second cancelled 0.5 ms after submit.

    A 20 ms batch holds the only slot first, so all 16 are still queued when half are cancelled
    (16 requests at once would otherwise fill a batch of 8 before any cancel could happen).
    """
    model = EchoModel(delay_s=0.020)
    batcher = AdaptiveBatcher(model, max_batch_size=8, window_ms=2)
    tasks_before = asyncio.all_tasks()
    blocker = asyncio.create_task(batcher.submit(-1))
    await asyncio.sleep(0.005)  # past the 2 ms window: the blocker is running
    tasks = [asyncio.create_task(batcher.submit(i)) for i in range(16)]
    await asyncio.sleep(0.0005)
    for task in tasks[1::2]:
        task.cancel()
    done = await asyncio.gather(*tasks, return_exceptions=True)
    assert await blocker == -1
    await batcher.aclose()
    assert all(isinstance(r, asyncio.CancelledError) for r in done[1::2])
    assert done[0::2] == list(range(0, 16, 2))
    assert model.seen == [-1, *range(0, 16, 2)]
    assert model.sizes == [1, 8]
    assert batcher.stats().counts.cancelled == 8
    assert asyncio.all_tasks() - tasks_before - {blocker, *tasks} == set()  # no task leaks


async def test_3_window_zero_natural_batching() -> None:
    """One slot, model 50 ms, window 0, requests at 0..4 ms: a batch of 1, then one of 4."""
    model = EchoModel(delay_s=0.050)
    async with AdaptiveBatcher(model, max_batch_size=64, window_ms=0) as batcher:
        tasks = []
        for i in range(5):
            tasks.append(asyncio.create_task(batcher.submit(i)))
            await asyncio.sleep(0.001)
        assert await asyncio.gather(*tasks) == list(range(5))
    assert model.sizes == [1, 4]


@pytest.mark.parametrize("n", [20, 40, 80])
async def test_4_simultaneous_requests_form_one_batch(n: int) -> None:
    """cap 400, window 1 s (scaled to 200 ms), N simultaneous requests: one batch of N."""
    model = EchoModel()
    async with AdaptiveBatcher(model, max_batch_size=400, window_ms=200) as batcher:
        assert await batcher.submit_many(range(n)) == list(range(n))
    assert model.sizes == [n]


async def test_5_queue_limit_and_deadlines_on_timer() -> None:
    """Queue 2, model 200 ms, deadline 100 ms, 6 requests 10 ms apart.

    1 runs, 2 queue, 3 are rejected at once; the queued ones fail at their deadlines (110 and
    120 ms), not when the running batch ends (200 ms).
    """
    model = EchoModel(delay_s=0.200)
    outcomes: dict[int, tuple[str, float]] = {}

    async def client(i: int, t0: float) -> None:
        sent = now()
        try:
            await batcher.submit(i, deadline_ms=100)
            outcomes[i] = ("ok", now() - t0)
        except QueueFullError:
            outcomes[i] = ("full", now() - sent)
        except DeadlineExceededError:
            outcomes[i] = ("deadline", now() - t0)

    async with AdaptiveBatcher(model, max_batch_size=8, window_ms=0, max_queue_size=2) as batcher:
        t0 = now()
        tasks = []
        for i in range(6):
            tasks.append(asyncio.create_task(client(i, t0)))
            await asyncio.sleep(0.010)
        await asyncio.gather(*tasks)
    kinds = {i: kind for i, (kind, _) in outcomes.items()}
    assert kinds == {0: "ok", 1: "deadline", 2: "deadline", 3: "full", 4: "full", 5: "full"}
    assert all(outcomes[i][1] < 0.005 for i in (3, 4, 5))  # rejected at once
    assert 0.105 <= outcomes[1][1] < 0.170  # deadline 10 + 100 ms, well before 200 ms
    assert 0.115 <= outcomes[2][1] < 0.180
    assert outcomes[0][1] >= 0.200
    assert model.seen == [0]


async def test_6_row_cap_never_exceeded_and_rows_returned() -> None:
    """Cap 32 rows; 10 requests of 32 rows and 3 of 7 rows at once."""
    batch_rows: list[int] = []

    def double(x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        batch_rows.append(x.shape[0])
        return x * 2.0

    rng = np.random.default_rng(0)
    inputs = [rng.normal(size=(32, 3)) for _ in range(10)] + [
        rng.normal(size=(7, 3)) for _ in range(3)
    ]
    async with AdaptiveBatcher(
        concat_rows(double), max_batch_size=32, window_ms=5, size_fn=row_count, executor="inline"
    ) as batcher:
        outputs = await batcher.submit_many(inputs)
    assert max(batch_rows) <= 32
    assert sum(batch_rows) == 10 * 32 + 3 * 7
    for x, y in zip(inputs, outputs, strict=True):
        np.testing.assert_array_equal(y, x * 2.0)


async def test_7_first_batch_closes_at_window_from_first_arrival() -> None:
    """Window 100 ms, cap 100, one request every 20 ms: first batch at ~100 ms with 5-6 items."""
    model = EchoModel()
    async with AdaptiveBatcher(model, max_batch_size=100, window_ms=100) as batcher:
        t0 = now()
        tasks = []
        for i in range(8):
            tasks.append(asyncio.create_task(batcher.submit(i)))
            await asyncio.sleep(0.020)
        await asyncio.gather(*tasks)
    assert 5 <= model.sizes[0] <= 6
    assert 0.095 <= model.start_times[0] - t0 < 0.150


async def test_8_each_caller_gets_exactly_its_rows() -> None:
    """3 concurrent requests with inputs of 1 and 2 rows."""
    inputs = [
        np.arange(1 * 4).reshape(1, 4),
        np.arange(8).reshape(2, 4) + 100,
        np.arange(4).reshape(1, 4) + 200,
    ]
    async with AdaptiveBatcher(
        concat_rows(lambda x: x + 0.5), max_batch_size=8, window_ms=5, size_fn=row_count
    ) as batcher:
        outputs = await batcher.submit_many(inputs)
    assert [o.shape[0] for o in outputs] == [1, 2, 1]
    for x, y in zip(inputs, outputs, strict=True):
        np.testing.assert_array_equal(y, x + 0.5)


def test_a_full_queue_does_not_refuse_what_an_idle_model_takes() -> None:
    """Cap 1, window 0, one slot, max_queue_size 2, nothing running: three requests submitted
    in one loop iteration are all served (the idle model takes the first, two wait); a fourth
    in the same iteration is the first refused."""

    async def model(batch: list[int]) -> list[int]:
        await asyncio.sleep(0.010)
        return batch

    async def main() -> list[object]:
        async with AdaptiveBatcher(
            model, max_batch_size=1, window_ms=0, max_queue_size=2, executor="async"
        ) as batcher:
            submits = [asyncio.ensure_future(batcher.submit(i)) for i in range(4)]
            return await asyncio.gather(*submits, return_exceptions=True)

    outcomes = run_in_virtual_time(main())
    assert outcomes[:3] == [0, 1, 2]
    assert isinstance(outcomes[3], QueueFullError)

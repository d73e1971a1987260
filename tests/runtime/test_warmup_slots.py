"""Warm-up with several execution slots: every slot runs the model once, all at once, never
more than ``max_concurrent_batches`` together (before: one call at a time, so a thread executor
started one worker thread of N and the first burst that filled the slots ran on cold threads)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from structlog.testing import capture_logs

from adaptive_batcher import AdaptiveBatcher
from adaptive_batcher.testing import run_in_virtual_time


class Concurrency:
    """Counts the model calls running together, and the threads they ran on."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.running = 0
        self.most = 0
        self.threads: set[int] = set()
        self.sizes: list[int] = []

    def enter(self, size: int) -> None:
        with self._lock:
            self.running += 1
            self.most = max(self.most, self.running)
            self.threads.add(threading.get_ident())
            self.sizes.append(size)

    def leave(self) -> None:
        with self._lock:
            self.running -= 1


def test_a_thread_executor_starts_and_runs_every_worker_thread() -> None:
    seen = Concurrency()

    def model(batch: list[Any]) -> list[Any]:
        seen.enter(len(batch))
        time.sleep(0.05)  # long enough for the calls of one round to overlap
        seen.leave()
        return batch

    async def warm() -> dict[int, float]:
        async with AdaptiveBatcher(
            model, max_batch_size=4, max_concurrent_batches=3, executor="thread"
        ) as batcher:
            with capture_logs() as logs:
                timings = await batcher.warmup(lambda: 0)
        [event] = [e for e in logs if e["event"] == "batcher.warmed_up"]
        assert event["slots"] == 3
        return timings

    timings = asyncio.run(warm())
    assert sorted(timings) == [1, 2, 4]  # the sizes' timings, as before
    assert seen.sizes == [1, 2, 4, 1, 1, 1]  # each size once, then the smallest on each slot
    assert len(seen.threads) == 3
    assert seen.most == 3  # the slots' calls ran together, never more than the slots


def test_an_async_model_sees_at_most_the_slots_and_one_slot_adds_no_call() -> None:
    def counting(slots: int) -> Concurrency:
        seen = Concurrency()

        async def model(batch: list[Any]) -> list[Any]:
            seen.enter(len(batch))
            await asyncio.sleep(0.01)
            seen.leave()
            return batch

        async def warm() -> None:
            async with AdaptiveBatcher(
                model, max_batch_size=8, max_concurrent_batches=slots
            ) as batcher:
                await batcher.warmup(lambda: 0)

        run_in_virtual_time(warm())
        return seen

    four = counting(4)
    assert four.sizes == [1, 2, 4, 8, 1, 1, 1, 1]
    assert four.most == 4
    one = counting(1)
    assert one.sizes == [1, 2, 4, 8]  # with one slot the sizes' calls ran on it
    assert one.most == 1

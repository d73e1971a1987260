"""Memory of streams under a slow reader: the stream buffer bound (issue 22, item 9).

A streaming model of ``STEPS`` steps that yields at once (a fast generator: a token each loop
turn, 1 KiB per element) serves a batch of ``READERS`` streams: one reader takes an element per
millisecond (a slow network client), the others read as fast as the loop lets them. On a
virtual clock, so the figures are exact and the same on every run: the peak of bytes traced by
``tracemalloc`` while the batch runs, beyond what is allocated before it, and the most elements
any stream held unread.

* ``unbounded`` (``max_buffered_elements=None``, the default): the slow stream buffers nearly
  every element the model produces;
* ``fail`` (bound 64): the slow stream ends with ``StreamBufferFullError`` once 64 elements wait
  unread; its batchmates read everything;
* ``hold`` (bound 64): the model's next step waits for room, so nothing is dropped and the batch
  runs at the slow reader's pace (its duration in virtual seconds is reported too).

Run: ``python -m pytest benchmarks/test_stream_memory.py``.
"""

from __future__ import annotations

import asyncio
import tracemalloc
from collections.abc import AsyncIterator
from typing import Any

import pytest

from adaptive_batcher import AdaptiveBatcher, StreamBufferFullError
from adaptive_batcher.testing import run_in_virtual_time
from benchmarks.conftest import report

STEPS = 4000
READERS = 4
ELEMENT_BYTES = 1024
BOUND = 64
SLOW_READ_S = 0.001


async def fast_model(batch: list[int]) -> AsyncIterator[list[bytes]]:
    for _ in range(STEPS):
        await asyncio.sleep(0)
        yield [bytes(ELEMENT_BYTES) for _ in batch]


async def one_batch(bound: int | None, overflow: str) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    batcher = AdaptiveBatcher(
        fast_model,
        max_batch_size=READERS,
        window_ms=0,
        max_buffered_elements=bound,
        stream_overflow=overflow,
    )
    backlog = [0]

    async def read(slow: bool) -> tuple[int, bool]:
        stream = batcher.submit_stream(0)
        count = 0
        try:
            async for _ in stream:
                count += 1
                backlog[0] = max(backlog[0], len(stream._request.elements))
                if slow:
                    await asyncio.sleep(SLOW_READ_S)
        except StreamBufferFullError:
            return count, True
        return count, False

    started = loop.time()
    tracemalloc.start()
    base, _ = tracemalloc.get_traced_memory()
    results = await asyncio.gather(read(True), *(read(False) for _ in range(READERS - 1)))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    await batcher.aclose()
    (slow_read, slow_failed), *fast = results
    return {
        "peak_bytes": peak - base,
        "most_unread": backlog[0],
        "slow_read": slow_read,
        "slow_failed": slow_failed,
        "fast_read": [n for n, _ in fast],
        "batch_s": loop.time() - started,
    }


@pytest.mark.parametrize(
    ("bound", "overflow"), [(None, "fail"), (BOUND, "fail"), (BOUND, "hold")], ids=str
)
def test_stream_memory_under_a_slow_reader(
    benchmark: Any, bound: int | None, overflow: str
) -> None:
    label = "unbounded" if bound is None else f"{overflow} at {bound}"
    figures: list[dict[str, Any]] = []
    benchmark.pedantic(
        lambda: figures.append(run_in_virtual_time(one_batch(bound, overflow))),
        rounds=1,
        iterations=1,
    )
    (result,) = figures
    benchmark.extra_info.update({k: v for k, v in result.items() if k != "fast_read"})
    report("stream_peak_kib_slow_reader", label, result["peak_bytes"] / 1024, "KiB")
    report("stream_most_unread_elements", label, result["most_unread"], "elements")
    assert result["fast_read"] == [STEPS] * (READERS - 1)  # the fast readers miss nothing
    if bound is None:
        assert result["most_unread"] > STEPS // 2  # nearly the whole stream waits unread
        assert result["slow_read"] == STEPS
    else:
        assert result["most_unread"] <= bound
        assert result["peak_bytes"] < 4 * READERS * bound * ELEMENT_BYTES
    if overflow == "fail" and bound is not None:
        assert result["slow_failed"] and result["slow_read"] <= bound + 1
    if overflow == "hold":
        assert result["slow_read"] == STEPS and not result["slow_failed"]
        assert result["batch_s"] >= STEPS * SLOW_READ_S * 0.99  # the slow reader's pace

"""Shared by the exporter tests: a deterministic workload that ends requests in every way."""

from __future__ import annotations

import asyncio
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from adaptive_batcher import AdaptiveBatcher, DeadlineExceededError, QueueFullError

SERVICE_S = 0.004


async def model(batch: list[float]) -> list[Any]:
    """Doubles each item after ``SERVICE_S`` seconds; a negative item gets its own error."""
    await asyncio.sleep(SERVICE_S)
    return [ValueError("negative") if x < 0 else 2 * x for x in batch]


async def mixed_traffic(batcher: AdaptiveBatcher[float, Any]) -> None:
    """Completed, failed (a per-item error), expired (deadline), cancelled and rejected (queue
    full) requests, in batches of several sizes, for a batcher with a 2 ms window, a cap of 4
    and a queue of 4. Run on a virtual clock."""
    for size in (1, 3, 4):
        assert await batcher.submit_many([1.0] * size) == [2.0] * size
        await asyncio.sleep(0.05)
    running = asyncio.ensure_future(batcher.submit_many([1.0, -1.0, 2.0], return_exceptions=True))
    await asyncio.sleep(0.003)  # its window (2 ms) is over: its batch holds the slot to 6 ms
    # a 1 ms deadline passes while the only slot is busy (with one free, it would start)
    late = await asyncio.gather(batcher.submit(1.0, deadline_ms=1.0), return_exceptions=True)
    assert isinstance(late[0], DeadlineExceededError)
    results = await running
    assert isinstance(results[1], ValueError)
    await asyncio.sleep(0.05)
    waiting = asyncio.ensure_future(batcher.submit(5.0))
    await asyncio.sleep(0)
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    await asyncio.sleep(0.05)
    # the idle model takes a full batch of 4, the queue holds 4 more: 2 of 10 are refused
    burst = [asyncio.ensure_future(batcher.submit(1.0)) for _ in range(10)]
    outcomes = await asyncio.gather(*burst, return_exceptions=True)
    assert sum(isinstance(o, QueueFullError) for o in outcomes) == 2
    await asyncio.sleep(0.05)


def parse(text: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """Prometheus exposition text -> {sample name: {sorted labels: value}}."""
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = tuple(sorted(sample.labels.items()))
            samples.setdefault(sample.name, {})[labels] = sample.value
    return samples


def value(
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]], name: str, **labels: str
) -> float:
    """The value of one sample, by name and its labels (all of them)."""
    return samples[name][tuple(sorted(labels.items()))]

"""Moving the hard cap at run time: AdaptiveBatcher.set_hard_cap and BatchedFunction.set_limits."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from adaptive_batcher import SLO, AdaptiveBatcher, Bounds, ItemTooLargeError, batched


def recording_model(batches: list[list[Any]]) -> Any:
    async def model(batch: list[Any]) -> list[Any]:
        batches.append(list(batch))
        return batch

    return model


async def test_raising_the_hard_cap_lets_the_cap_go_above_the_one_configured() -> None:
    batches: list[list[Any]] = []
    async with AdaptiveBatcher(
        recording_model(batches), max_batch_size=2, window_ms=60_000
    ) as batcher:
        with pytest.raises(ValueError, match="exceeds the hard cap 2"):
            batcher.set_limits(max_batch_size=4)
        batcher.set_hard_cap(4)
        batcher.set_limits(max_batch_size=4)
        results = await asyncio.wait_for(batcher.submit_many(range(4)), timeout=5)
        assert batcher.stats().max_batch_size == 4
    assert results == [0, 1, 2, 3]
    assert batches == [[0, 1, 2, 3]]  # one full batch of the new cap, not the window


async def test_the_hard_cap_bounds_the_size_of_a_request() -> None:
    async with AdaptiveBatcher(
        recording_model([]), max_batch_size=4, window_ms=0, size_fn=len
    ) as batcher:
        assert await batcher.submit("abc") == "abc"
        batcher.set_hard_cap(2)
        assert batcher.stats().max_batch_size == 2  # the cap in force follows it down
        with pytest.raises(ItemTooLargeError, match=r"outside 1\.\.2"):
            await batcher.submit("abc")
        batcher.set_hard_cap(8)
        assert await batcher.submit("abcdef") == "abcdef"


async def test_the_controller_bound_follows_the_hard_cap() -> None:
    async with AdaptiveBatcher(
        recording_model([]), max_batch_size=8, window_ms=1, slo=SLO(latency_ms=50)
    ) as batcher:
        batcher.set_hard_cap(32)
        assert batcher._core.bounds.max_batch_size == 32
        controller = batcher._core.controller
        assert controller is not None and controller.bounds.max_batch_size == 32
        batcher.set_hard_cap(4)
        assert controller.bounds.max_batch_size == 4


async def test_explicit_bounds_below_the_hard_cap_stay_where_they_are() -> None:
    async with AdaptiveBatcher(
        recording_model([]),
        max_batch_size=16,
        window_ms=1,
        slo=SLO(latency_ms=50),
        bounds=Bounds(0.0, 10.0, 1, 8),
    ) as batcher:
        batcher.set_hard_cap(64)
        assert batcher._core.bounds.max_batch_size == 8
        batcher.set_hard_cap(4)
        assert batcher._core.bounds.max_batch_size == 4


def test_set_hard_cap_checks_its_argument_and_buckets() -> None:
    batcher = AdaptiveBatcher(recording_model([]), max_batch_size=4, batch_sizes=[2, 4])
    with pytest.raises(ValueError, match="max_batch_size: the hard cap of a batcher with"):
        batcher.set_hard_cap(8)
    plain = AdaptiveBatcher(recording_model([]), max_batch_size=4)
    with pytest.raises(ValueError, match="max_batch_size must be >= 1, got 0"):
        plain.set_hard_cap(0)
    with pytest.raises(TypeError, match="max_batch_size must be an int, got float"):
        plain.set_hard_cap(2.5)  # type: ignore[arg-type]


async def test_batched_set_limits_reaches_live_and_future_batchers_above_the_cap() -> None:
    batches: list[list[Any]] = []

    @batched(max_batch_size=2, window_ms=60_000)
    async def model(batch: list[int]) -> list[int]:
        batches.append(list(batch))
        return batch

    assert await asyncio.wait_for(asyncio.gather(model(1), model(2)), timeout=5) == [1, 2]
    model.set_limits(max_batch_size=3)
    assert await asyncio.wait_for(asyncio.gather(*map(model, (3, 4, 5))), timeout=5) == [3, 4, 5]
    await model.aclose()
    # a new batcher (after closing) starts from the changed settings
    assert await asyncio.wait_for(asyncio.gather(*map(model, (6, 7, 8))), timeout=5) == [6, 7, 8]
    await model.aclose()
    assert batches == [[1, 2], [3, 4, 5], [6, 7, 8]]


def test_batched_set_limits_refuses_bad_settings_and_changes_nothing() -> None:
    @batched(max_batch_size=2, window_ms=5)
    async def model(batch: list[int]) -> list[int]:
        return batch

    with pytest.raises(ValueError, match="window_ms must be a finite number >= 0"):
        model.set_limits(max_batch_size=8, window_ms=-1)
    assert model._options == {"max_batch_size": 2, "window_ms": 5}

"""Warm-up starts the controller's service-time model: a cold burst on a slow model is shed
from the first tick, instead of after the first 8 batches (virtual time)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from adaptive_batcher import SLO, AdaptiveBatcher, DeadlineExceededError
from adaptive_batcher.testing import run_in_virtual_time

SLO_300 = SLO(latency_ms=300.0)
BATCH_S = 0.040  # a slow model (an LLM prefill): 6 batches before the first tick at 0.25 s


async def model(batch: list[Any]) -> list[Any]:
    await asyncio.sleep(BATCH_S)
    return batch


async def cold_burst(warm_up: bool) -> list[tuple[float, bool]]:
    """(answered at s, within the SLO) for each of 2000 requests sent at once at start."""
    loop = asyncio.get_running_loop()
    async with AdaptiveBatcher(
        model, max_batch_size=16, window_ms=0.0, slo=SLO_300, shed_late=True
    ) as batcher:
        if warm_up:
            await batcher.warmup(lambda: 0)
        start = loop.time()

        async def one() -> tuple[float, bool]:
            try:
                await batcher.submit(0)
            except DeadlineExceededError:
                return loop.time() - start, True  # shed: not a late answer
            answered = loop.time() - start
            return answered, answered <= SLO_300.latency_ms / 1e3

        return await asyncio.gather(*(one() for _ in range(2000)))


@pytest.mark.parametrize("warm_up", [True, False])
def test_after_warm_up_shedding_starts_at_the_first_tick(warm_up: bool) -> None:
    outcomes = run_in_virtual_time(cold_burst(warm_up))
    # the first tick is at 0.25 s; the requests queued then expire by 0.26 s, so every batch
    # that starts after that ends within the SLO
    late_after_first_tick = [t for t, ok in outcomes if t > 0.26 + BATCH_S and not ok]
    if warm_up:
        assert late_after_first_tick == []
    else:  # without a warm-up the plan waits for 8 batches: the next tick, at 0.5 s
        assert late_after_first_tick
        assert max(late_after_first_tick) <= 0.5 + 2 * BATCH_S


def test_warm_up_runs_each_size_once_more_warm_only_for_a_controller_with_an_slo() -> None:
    calls: list[int] = []

    async def counting(batch: list[Any]) -> list[Any]:
        calls.append(len(batch))
        return batch

    async def warm(**kwargs: Any) -> None:
        async with AdaptiveBatcher(counting, max_batch_size=4, **kwargs) as batcher:
            await batcher.warmup(lambda: 0)

    run_in_virtual_time(warm(slo=SLO_300))
    assert calls == [1, 2, 4, 1, 2, 4]  # cold, then warm: the model's start
    calls.clear()
    run_in_virtual_time(warm())
    assert calls == [1, 2, 4]
    calls.clear()
    run_in_virtual_time(warm(slo=SLO_300, service_profile=[(1, 1.0), (4, 2.0)]))
    assert calls == [1, 2, 4]  # the profile given is the start

"""A busy event loop spends part of the SLO before a request reaches ``submit()``: the asyncio
shell's heartbeat measures that lag, and the controller aims the tail it measures lower by it.

On a virtual clock (deterministic): Poisson 1000 req/s against a model of 1 ms + 0.02 ms per
item, SLO p99 20 ms (aim 16 ms). In one run, a handler on the same loop blocks it for 4 ms
every 10 ms or so (short of a stall, 50 ms): the heartbeat fires up to 4 ms late, so the
controller sets about 4 ms aside and aims at about 12 ms. On a quiet loop it sets nothing aside.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest
from structlog.testing import capture_logs

from adaptive_batcher import SLO, AdaptiveBatcher
from adaptive_batcher.testing import VirtualClockLoop, run_in_virtual_time
from tests.runtime.test_stall import decision_events, poisson_load

RATE_RPS = 1000.0
RUN_S = 4.0
BLOCK_S = 0.004
BLOCK_EVERY_S = 0.01


async def model(batch: list[Any]) -> list[Any]:
    await asyncio.sleep(0.001 + 0.00002 * len(batch))
    return batch


async def _block_now_and_then(loop: VirtualClockLoop) -> None:
    rng = random.Random(1)
    while True:
        loop.stall(BLOCK_S)  # a handler that holds the loop, short of a stall
        await asyncio.sleep(rng.uniform(0.5, 1.5) * BLOCK_EVERY_S)


async def serve(busy: bool) -> float:
    """The run; what ``stats()`` said of the lag at its end."""
    loop = asyncio.get_running_loop()
    assert isinstance(loop, VirtualClockLoop)
    batcher = AdaptiveBatcher(model, max_batch_size=64, window_ms=5.0, slo=SLO(latency_ms=20.0))
    async with batcher:
        blocker = loop.create_task(_block_now_and_then(loop)) if busy else None
        await poisson_load(batcher, RATE_RPS, loop.time() + RUN_S, seed=0)
        if blocker is not None:
            blocker.cancel()
        return batcher.stats().loop_lag_ms


@pytest.mark.parametrize("busy", [False, True])
def test_a_busy_loops_lag_is_set_aside_from_the_slo(busy: bool) -> None:
    with capture_logs(processors=[decision_events]) as logs:
        in_stats = run_in_virtual_time(serve(busy))
    assert not [e for e in logs if e["event"] == "batcher.loop_stalled"]  # lag, no stall
    decisions = [e for e in logs if e["event"] == "controller.decision"]
    late = decisions[len(decisions) // 2 :]  # once the heartbeats have been read
    assert late
    lags = {e["loop_lag_ms"] for e in late}
    if busy:
        assert all(3.5 <= lag <= 4.5 for lag in lags), lags
        assert 3.5 <= in_stats <= 4.5  # and stats() says so
        assert all(e["target_ms"] <= 16.0 - 3.5 for e in late)
    else:
        assert lags == {0.0} and in_stats == 0.0
        assert all(e["target_ms"] >= 16.0 for e in late)

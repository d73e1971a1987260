"""The controller inside the asyncio runtime: memory pressure, a bad static window, switching."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import pytest

from adaptive_batcher import SLO, AdaptiveBatcher
from adaptive_batcher.policies import PID, Static
from adaptive_batcher.profile.format import write_profile
from adaptive_batcher.profile.result import ProfileResult, ProfileRow
from adaptive_batcher.telemetry.base import TelemetrySample
from adaptive_batcher.testing import FakeTelemetry, run_in_virtual_time


async def open_loop(
    batcher: AdaptiveBatcher[Any, Any], rate_rps: float, seconds: float, item: Any = 0
) -> list[float]:
    """Poisson arrivals; returns each request's latency in ms (all must complete)."""
    loop = asyncio.get_running_loop()
    latencies: list[float] = []

    async def one() -> None:
        started = loop.time()
        await batcher.submit(item)
        latencies.append((loop.time() - started) * 1e3)

    tasks = []
    end = loop.time() + seconds
    while loop.time() < end:
        tasks.append(asyncio.create_task(one()))
        await asyncio.sleep(random.expovariate(rate_rps))
    await asyncio.gather(*tasks)
    assert len(latencies) == len(tasks)
    return latencies


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[int(0.99 * (len(ordered) - 1))]


async def test_cap_shrinks_under_memory_pressure_and_nothing_is_lost() -> None:
    squeezed = False

    def reading(call: int) -> TelemetrySample:
        free = 5 if squeezed else 80
        return TelemetrySample(mem_total_bytes=100, mem_free_bytes=free, source="fake")

    async def model(batch: list[int]) -> list[int]:
        await asyncio.sleep(0.002 + 0.00005 * len(batch))
        return batch

    batcher = AdaptiveBatcher(
        model,
        max_batch_size=64,
        window_ms=2,
        slo=SLO(latency_ms=200),
        telemetry=FakeTelemetry(reading),
        telemetry_hz=100,
        control_interval_ms=50,
    )
    async with batcher:
        await open_loop(batcher, 800, 0.5)
        before = batcher.stats().max_batch_size
        squeezed = True
        await open_loop(batcher, 800, 1.0)
        after = batcher.stats().max_batch_size
    stats = batcher.stats()
    assert after < before
    assert after <= 0.75 * 64
    assert stats.counts.completed == stats.counts.submitted
    assert stats.counts.failed == stats.counts.expired == stats.counts.rejected == 0


def test_the_pid_meets_the_slo_where_a_bad_static_window_does_not() -> None:
    """SLO p99 100 ms at 60 req/s: a static 250 ms window cannot meet it; the PID can. On the
    virtual clock, with a model that takes what the example MLP takes on a CPU (1 ms + 0.02 ms
    per item): before, on the real clock, it failed on a machine busy enough to slow the
    worker thread."""

    async def model(batch: list[int]) -> list[int]:
        await asyncio.sleep(0.001 + 0.00002 * len(batch))
        return batch

    async def serve() -> tuple[float, float, float]:
        random.seed(0)
        static = AdaptiveBatcher(model, max_batch_size=64, window_ms=250)
        async with static:
            static_p99 = p99(await open_loop(static, 60, 3.0))
        adaptive = AdaptiveBatcher(
            model,
            max_batch_size=64,
            window_ms=250,
            slo=SLO(latency_ms=100),
            control_interval_ms=100,
        )
        async with adaptive:
            await open_loop(adaptive, 60, 2.0)  # the controller settles
            settled = p99(await open_loop(adaptive, 60, 3.0))
        return static_p99, settled, adaptive.stats().window_ms

    static_p99, settled, window_ms = run_in_virtual_time(serve())
    assert static_p99 > 100
    assert settled < 100
    assert window_ms < 100


async def test_failing_policy_never_stops_serving() -> None:
    class Broken(Static):
        def decide(self, observation: Any) -> Any:
            raise ZeroDivisionError("bug in a policy")

    async def model(batch: list[int]) -> list[int]:
        return batch

    async with AdaptiveBatcher(model, window_ms=1, policy=Broken(), control_interval_ms=1) as b:
        for _ in range(5):
            assert await b.submit_many(range(20)) == list(range(20))
            await asyncio.sleep(0.005)
    assert b.stats().decisions == 0
    assert b._core.controller is not None
    assert b._core.controller.failures >= 1


async def test_slo_and_policy_can_change_at_run_time() -> None:
    async def model(batch: list[int]) -> list[int]:
        await asyncio.sleep(0.001)
        return batch

    batcher = AdaptiveBatcher(model, max_batch_size=32, window_ms=20)
    assert batcher.stats().policy is None
    async with batcher:
        await batcher.submit_many(range(10))
        batcher.set_policy(PID())
        batcher.set_slo(SLO(latency_ms=30))
        await open_loop(batcher, 300, 1.0)
        stats = batcher.stats()
    assert stats.policy is not None
    assert "pid" in stats.policy
    assert stats.slo == SLO(latency_ms=30)
    assert stats.decisions > 0
    with pytest.raises(TypeError, match="slo must be an SLO or None, got int"):
        batcher.set_slo(30)  # type: ignore[arg-type]


@pytest.mark.parametrize("bound", [True, False])
def test_an_slo_set_on_a_batcher_without_a_controller_starts_the_default_one(bound: bool) -> None:
    """As if the batcher had been made with that SLO: the default PID controller starts then
    (before: the SLO was stored, stats().policy stayed None and nothing was tuned)."""

    async def model(batch: list[int]) -> list[int]:
        await asyncio.sleep(0.001)
        return batch

    async def serve() -> Any:
        batcher = AdaptiveBatcher(model, max_batch_size=32, window_ms=20)
        if bound:
            await batcher.submit(0)  # bound to the loop: the controller starts at once
        batcher.set_slo(SLO(latency_ms=30))
        async with batcher:
            assert batcher.stats().policy is not None
            await open_loop(batcher, 300, 1.0)
            return batcher.stats()

    stats = run_in_virtual_time(serve())
    assert stats.policy is not None and "pid" in stats.policy
    assert stats.slo == SLO(latency_ms=30)
    assert stats.decisions > 0


async def test_an_slo_set_after_the_controller_was_stopped_does_not_restart_it() -> None:
    batcher = AdaptiveBatcher(lambda b: b, max_batch_size=8, slo=SLO(latency_ms=50))
    async with batcher:
        batcher.set_policy(None)
        batcher.set_slo(SLO(latency_ms=30))
        assert batcher.stats().policy is None  # set_policy(None) stopped it; it stays stopped
        batcher.set_policy(PID())
        assert batcher.stats().policy is not None


def test_service_profile_seeds_the_controller(tmp_path: Path) -> None:
    rows = (ProfileRow(1, 2.0, 2.5, 500.0, None), ProfileRow(64, 6.0, 7.0, 10666.7, None))
    path = tmp_path / "profile.json"
    write_profile(path, ProfileResult(rows, None, "cpu", "mlp", 5))
    from_file = AdaptiveBatcher(lambda b: b, slo=SLO(latency_ms=50), service_profile=path)
    from_rows = AdaptiveBatcher(lambda b: b, slo=SLO(latency_ms=50), service_profile=[(1, 2.0)])
    assert from_file._core.controller is not None
    assert from_file._core.controller.service_estimator.median_ms(64) == pytest.approx(6.0)
    assert from_rows._core.controller is not None
    assert from_rows._core.controller.service_estimator.median_ms(1) == pytest.approx(2.0)
    with pytest.raises(ValueError, match=r"service_profile rows must be \(batch_size: int >= 1"):
        AdaptiveBatcher(lambda b: b, slo=SLO(latency_ms=50), service_profile=[(0, 2.0)])

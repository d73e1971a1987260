"""Start, shutdown, loops and tasks: no request is ever left unresolved."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from structlog.testing import capture_logs

from adaptive_batcher import SLO, AdaptiveBatcher, BatcherClosedError, BatcherError, EventLoopError
from adaptive_batcher.policies import PID
from adaptive_batcher.testing import EchoModel


def test_constructor_starts_nothing_and_needs_no_loop() -> None:
    batcher = AdaptiveBatcher(EchoModel(), max_batch_size=4)
    assert batcher.closed is False
    assert batcher.stats().queue_depth == 0


async def test_constructor_starts_no_task() -> None:
    before = asyncio.all_tasks()
    AdaptiveBatcher(EchoModel(), max_batch_size=4, window_ms=1)
    assert asyncio.all_tasks() == before


async def test_close_drains_queued_requests_without_waiting_for_window() -> None:
    model = EchoModel(delay_s=0.010)
    batcher = AdaptiveBatcher(model, max_batch_size=4, window_ms=10_000)
    tasks = [asyncio.create_task(batcher.submit(i)) for i in range(6)]
    await asyncio.sleep(0.001)
    t0 = asyncio.get_running_loop().time()
    await batcher.aclose()
    assert asyncio.get_running_loop().time() - t0 < 1.0
    assert [t.result() for t in tasks] == list(range(6))
    assert model.sizes == [4, 2]


async def test_close_without_drain_rejects_queued_and_finishes_running() -> None:
    model = EchoModel(delay_s=0.030)
    batcher = AdaptiveBatcher(model, max_batch_size=2, window_ms=0)
    tasks = [asyncio.create_task(batcher.submit(i)) for i in range(5)]
    await asyncio.sleep(0.005)  # batch [0, 1] is running, 2..4 are queued
    await batcher.aclose(drain=False)
    outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    assert outcomes[:2] == [0, 1]
    assert all(isinstance(o, BatcherClosedError) for o in outcomes[2:])
    assert str(outcomes[2]) == "batcher closed before this ran"
    assert model.seen == [0, 1]


async def test_submit_after_close_is_rejected() -> None:
    batcher = AdaptiveBatcher(EchoModel(), max_batch_size=2)
    await batcher.aclose()
    with capture_logs() as logs, pytest.raises(BatcherClosedError, match="batcher is closed"):
        await batcher.submit(1)
    assert [e["reason"] for e in logs if e["event"] == "request.rejected"] == ["BatcherClosedError"]
    assert batcher.stats().counts.rejected == 1


@pytest.mark.parametrize(
    "change",
    [
        lambda b: b.set_limits(window_ms=1.0),
        lambda b: b.set_limits(max_batch_size=1),
        lambda b: b.set_hard_cap(2),
        lambda b: b.set_slo(SLO(latency_ms=50.0)),
        lambda b: b.set_slo(None),
        lambda b: b.set_policy(PID()),
    ],
    ids=["set_limits-window", "set_limits-cap", "set_hard_cap", "set_slo", "set_slo-None",
         "set_policy"],
)  # fmt: skip
async def test_settings_cannot_change_after_close(change: Any) -> None:
    """Like ``submit``, a change of settings on a closed batcher raises BatcherClosedError and
    changes nothing (it was accepted silently)."""
    batcher = AdaptiveBatcher(EchoModel(), max_batch_size=4, window_ms=5.0, slo=SLO(100.0))
    await batcher.submit(1)
    await batcher.aclose()
    before = batcher.stats()
    with pytest.raises(BatcherClosedError, match=r"^batcher is closed$"):
        change(batcher)
    after = batcher.stats()
    assert (after.window_ms, after.max_batch_size, after.slo, after.policy) == (
        before.window_ms, before.max_batch_size, before.slo, before.policy
    )  # fmt: skip


async def test_context_exit_drains_and_aclose_is_idempotent() -> None:
    async with AdaptiveBatcher(EchoModel(delay_s=0.005), window_ms=50) as batcher:
        pending = [asyncio.create_task(batcher.submit(i)) for i in range(3)]
        await asyncio.sleep(0)
    assert [p.result() for p in pending] == [0, 1, 2]
    await batcher.aclose()
    assert batcher.closed


async def test_deadline_during_drain_still_fires() -> None:
    model = EchoModel(delay_s=0.100)
    batcher = AdaptiveBatcher(model, max_batch_size=1, window_ms=0)
    first = asyncio.create_task(batcher.submit("slow"))
    await asyncio.sleep(0.005)
    late = asyncio.create_task(batcher.submit("late", deadline_ms=20))
    await asyncio.sleep(0)  # let it queue behind the running batch
    await batcher.aclose()
    assert first.result() == "slow"
    assert isinstance(late.exception(), TimeoutError)


def test_batcher_is_bound_to_one_event_loop() -> None:
    batcher = AdaptiveBatcher(EchoModel(), max_batch_size=2, window_ms=0)
    assert asyncio.run(batcher.submit(1)) == 1
    with pytest.raises(EventLoopError, match="bound to another event loop") as raised:
        asyncio.run(batcher.submit(2))
    assert isinstance(raised.value, RuntimeError) and isinstance(raised.value, BatcherError)


async def test_many_concurrent_submitters_all_resolve_exactly_once() -> None:
    model = EchoModel()
    async with AdaptiveBatcher(model, max_batch_size=64, window_ms=1) as batcher:
        results = await asyncio.gather(*(batcher.submit(i) for i in range(5000)))
    assert results == list(range(5000))
    assert sorted(model.seen) == list(range(5000))
    assert max(model.sizes) <= 64
    stats = batcher.stats()
    assert stats.counts.completed == 5000
    assert stats.latency.count == 5000
    assert stats.queue_depth == 0 and stats.in_flight_batches == 0


async def test_close_refuses_a_drain_that_is_not_a_bool() -> None:
    batcher = AdaptiveBatcher(EchoModel(), max_batch_size=4)
    with pytest.raises(TypeError, match="drain"):
        await batcher.aclose(drain="no")  # type: ignore[arg-type]
    assert batcher.closed is False  # refused before closing anything
    await batcher.aclose()

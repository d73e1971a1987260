"""Batch listeners and the statistics exporters read: one record per batch that ran, with the
loop's times; decisions by reason; SLO attainment over the latency window. On a virtual clock,
so every time is exact."""

from __future__ import annotations

import asyncio
import math

import pytest
from structlog.testing import capture_logs

from adaptive_batcher import SLO, AdaptiveBatcher
from adaptive_batcher.policies import PID, Static
from adaptive_batcher.runtime.batcher import BatchRecord
from adaptive_batcher.testing import run_in_virtual_time


def sleeping_model(service_s: float) -> object:
    async def model(batch: list[float]) -> list[float]:
        await asyncio.sleep(service_s)
        return [x * 2 for x in batch]

    return model


def test_a_listener_gets_one_record_per_batch_with_its_times() -> None:
    records: list[BatchRecord] = []

    async def main() -> None:
        batcher = AdaptiveBatcher(sleeping_model(0.005), window_ms=10.0, max_batch_size=4)
        batcher.add_batch_listener(records.append)
        async with batcher:
            first = [batcher.submit(float(i)) for i in range(3)]
            assert await asyncio.gather(*first) == [0.0, 2.0, 4.0]
            await asyncio.sleep(0.1)  # t = 0.115
            assert await batcher.submit_many([1.0] * 6) == [2.0] * 6

    run_in_virtual_time(main())
    assert [r.items for r in records] == [3, 4, 2]
    first, full, rest = records
    assert (first.first_arrival_s, first.start_s, first.end_s) == (0.0, 0.01, pytest.approx(0.015))
    assert first.queue_wait_s == 0.01 and first.execution_s == pytest.approx(0.005)
    assert full.queue_wait_s == 0.0  # a full batch leaves at once
    assert full.end_s == pytest.approx(0.120)
    assert rest.start_s == pytest.approx(0.125)  # its window ran out after the slot freed
    assert rest.queue_wait_s == pytest.approx(0.010)
    assert rest.units == 2 and rest.batch_id == full.batch_id + 1


def test_a_failing_listener_is_logged_and_changes_nothing() -> None:
    calls: list[int] = []

    def broken(record: BatchRecord) -> None:
        raise RuntimeError("exporter bug")

    async def main() -> list[float]:
        async with AdaptiveBatcher(sleeping_model(0.001), window_ms=1.0) as batcher:
            batcher.add_batch_listener(broken)
            batcher.add_batch_listener(lambda record: calls.append(record.items))
            return await batcher.submit_many([1.0, 2.0])

    with capture_logs() as logs:
        assert run_in_virtual_time(main()) == [2.0, 4.0]
    assert calls == [2]
    failures = [e for e in logs if e["event"] == "batch_listener.failed"]
    assert len(failures) == 1 and "exporter bug" in failures[0]["error"]


def test_removed_listeners_are_not_called_and_bad_ones_are_refused() -> None:
    calls: list[int] = []

    def listener(record: BatchRecord) -> None:
        calls.append(record.items)

    async def main() -> None:
        async with AdaptiveBatcher(sleeping_model(0.001), window_ms=1.0) as batcher:
            batcher.add_batch_listener(listener)
            await batcher.submit(1.0)
            batcher.remove_batch_listener(listener)
            await batcher.submit(1.0)
            with pytest.raises(ValueError, match="listener was not added"):
                batcher.remove_batch_listener(listener)
            with pytest.raises(TypeError, match="listener must be callable, got int"):
                batcher.add_batch_listener(3)  # type: ignore[arg-type]

    run_in_virtual_time(main())
    assert calls == [1]


def test_stats_count_decisions_by_reason() -> None:
    async def main() -> None:
        batcher = AdaptiveBatcher(
            sleeping_model(0.002), slo=SLO(latency_ms=20.0), policy=PID(), control_interval_ms=50.0
        )
        async with batcher:
            for _ in range(40):
                await batcher.submit_many([1.0] * 3)
                await asyncio.sleep(0.02)
            stats = batcher.stats()
        assert stats.decisions > 5
        assert sum(stats.decision_reasons.values()) == stats.decisions
        assert all(reason for reason in stats.decision_reasons)

    run_in_virtual_time(main())


def test_stats_without_a_controller_have_no_decisions() -> None:
    batcher = AdaptiveBatcher(sleeping_model(0.001))
    assert batcher.stats().decisions == 0 and dict(batcher.stats().decision_reasons) == {}
    assert math.isnan(batcher.stats().slo_attainment)  # no SLO


def test_slo_attainment_agrees_with_the_count_within_the_slo_near_the_slo() -> None:
    """Answers 0.3 ms inside a 50 ms SLO share a bucket reported above it: the attainment
    still counts them in time, as ``counts.within_slo`` does (and so do the exporters)."""

    async def main() -> None:
        batcher = AdaptiveBatcher(
            sleeping_model(0.0497), slo=SLO(latency_ms=50.0), policy=Static(), window_ms=0.0
        )
        async with batcher:
            for _ in range(20):
                await batcher.submit(1.0)
            stats = batcher.stats()
        assert stats.counts.within_slo == stats.counts.completed == 20
        assert stats.slo_attainment == 1.0
        assert stats.latency.max_ms <= 50.0

    run_in_virtual_time(main())


def test_slo_attainment_is_the_share_of_the_window_within_the_slo() -> None:
    async def main() -> None:
        # a static policy keeps the 4 ms window: latency = 4 ms wait + service
        batcher = AdaptiveBatcher(
            sleeping_model(0.010), slo=SLO(latency_ms=12.0), policy=Static(), window_ms=4.0
        )
        async with batcher:
            assert math.isnan(batcher.stats().slo_attainment)  # nothing answered yet
            await batcher.submit_many([1.0] * 3)  # 14 ms: late
            await asyncio.sleep(0.05)
            batcher.set_limits(window_ms=0.0)
            await batcher.submit(1.0)  # 10 ms: in time
            assert batcher.stats().slo_attainment == 0.25
            await asyncio.sleep(30.0)  # every answer has left the 10 s window
            assert math.isnan(batcher.stats().slo_attainment)

    run_in_virtual_time(main())


class Halt(BaseException):
    """A BaseException that is not an Exception (nor KeyboardInterrupt or SystemExit)."""


async def test_a_listener_raising_a_base_exception_is_logged_and_the_queue_still_runs() -> None:
    """Before: the exception left the batch's bookkeeping before its pump, so the requests
    queued behind the batch sat until another arrival or a close."""

    def halting(record: BatchRecord) -> None:
        raise Halt("listener stalled")

    async def model(batch: list[int]) -> list[int]:
        await asyncio.sleep(0.001)
        return batch

    batcher = AdaptiveBatcher(model, max_batch_size=1, window_ms=0)
    batcher.add_batch_listener(halting)
    with capture_logs() as logs:
        results = await asyncio.wait_for(
            asyncio.gather(*(batcher.submit(i) for i in range(3))), timeout=5
        )
    await batcher.aclose()
    assert results == [0, 1, 2]
    failed = [e for e in logs if e["event"] == "batch_listener.failed"]
    assert len(failed) == 3
    assert failed[0]["error"] == "Halt('listener stalled')"


def test_a_listener_raising_keyboard_interrupt_stops_the_program_after_its_batch() -> None:
    """The batch's callers have their results first; then asyncio.run raises the interrupt."""
    results: list[int] = []

    def interrupting(record: BatchRecord) -> None:
        raise KeyboardInterrupt

    async def main() -> None:
        batcher = AdaptiveBatcher(lambda b: b, max_batch_size=2, window_ms=0, executor="inline")
        batcher.add_batch_listener(interrupting)

        async def call(x: int) -> None:
            results.append(await batcher.submit(x))

        await asyncio.gather(call(1), call(2))
        await asyncio.sleep(1)  # the interrupt comes before this ends

    with pytest.raises(KeyboardInterrupt):
        asyncio.run(main())
    assert results == [1, 2]

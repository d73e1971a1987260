"""What the gate measures (TTFT, TPOT, queue wait), what it tells the controller, and the
engine telemetry it reads in the background."""

from __future__ import annotations

import math
from typing import Any

import pytest
from structlog.testing import capture_logs

from adaptive_batcher.gateway import Chunk, LLMGate, Usage
from adaptive_batcher.gateway.stats import TimeQuantiles, tpot_s
from adaptive_batcher.llm import EngineMetrics
from adaptive_batcher.llm.gate import GateLimits
from adaptive_batcher.metrics.histogram import Quantiles
from tests.gateway.fakes import (
    END,
    SLO,
    Clock,
    FakeEngine,
    FedTelemetry,
    FixedController,
    fixed,
    make_gate,
    read_all,
    request,
)

REL = 0.011  # the sliding histogram's resolution


async def test_stats_hold_ttft_tpot_and_queue_wait_quantiles() -> None:
    clock = Clock(100.0)
    fake = FakeEngine()
    async with make_gate(fake, limit=1, clock=clock) as gate:
        empty = gate.stats()
        assert empty.ttft.count == 0 and math.isnan(empty.ttft.p50_s)
        first = gate.submit(request("a"))
        second = gate.submit(request("b"))
        await fake.started("a")
        for step, item in [(0.2, "x"), (0.1, "y"), (0.1, Chunk("zz", tokens=2))]:
            clock.advance(step)
            fake.feed("a", item)
            await first.__anext__()
        fake.feed("a", END)
        assert await read_all(first) == []
        await second.admitted()  # at 100.4: it waited 0.4 s
        clock.advance(0.05)
        fake.feed("b", "w", END)
        assert await read_all(second) == ["w"]
        stats = gate.stats()
    assert stats.ttft.count == 2
    assert stats.ttft.p50_s == pytest.approx(0.2, rel=REL)
    assert stats.ttft.p99_s == pytest.approx(0.45, rel=REL)
    assert stats.tpot.count == 2
    assert stats.tpot.p99_s == pytest.approx(0.2 / 3, rel=REL)  # 4 tokens in 0.2 s
    assert stats.tpot.p50_s < 1e-5  # the one-token answer: 0
    assert stats.queue_wait.count == 2
    assert stats.queue_wait.p99_s == pytest.approx(0.4, rel=REL)
    assert stats.ttft_histogram.count == 2
    assert stats.ttft_histogram.sum == pytest.approx(0.65)
    assert stats.queue_wait_histogram.sum == pytest.approx(0.4)
    assert stats.tpot_histogram.count == 2


async def test_the_usage_count_sets_the_tpot() -> None:
    clock = Clock()
    fake = FakeEngine()
    async with make_gate(fake, clock=clock) as gate:
        stream = gate.submit(request("a"))
        fake.feed("a", "x")
        await stream.__anext__()
        clock.advance(0.8)
        fake.feed("a", Chunk("rest", tokens=1, usage=Usage(10, 9)), END)
        await read_all(stream)
        assert gate.stats().tpot.p50_s == pytest.approx(0.8 / 8, rel=REL)


class Spy(FixedController):
    """Records what the gate tells the controller."""

    def __init__(self) -> None:
        super().__init__(GateLimits(2))
        self.calls: list[tuple[Any, ...]] = []

    def record_first_token(self, now: float, engine_ttft_s: float, prefill_tokens: int) -> None:
        self.calls.append(("first", engine_ttft_s))

    def record_gap(
        self, now: float, streams: int, gap_s: float, sequences: int, context_tokens: float
    ) -> None:
        self.calls.append(("gap", streams, round(gap_s, 9)))

    def record_finish(
        self,
        now: float,
        ttft_s: float,
        tpot_s: float,
        output_tokens: int,
        residence_s: float,
        in_flight: int,
    ) -> None:
        self.calls.append(("finish", output_tokens))


async def test_the_controller_hears_first_tokens_gaps_and_ends() -> None:
    clock = Clock()
    fake = FakeEngine()
    spy = Spy()
    async with LLMGate(fake.engine, SLO, controller=spy, clock=clock) as gate:
        stream = gate.submit(request("a"))
        clock.advance(0.3)
        fake.feed("a", Chunk("ab", tokens=2))
        await stream.__anext__()
        clock.advance(0.4)
        fake.feed("a", Chunk("cdef", tokens=4), Chunk("", tokens=0, usage=Usage(10, 6)), END)
        await read_all(stream)
    assert spy.calls == [
        ("first", pytest.approx(0.3)),
        ("gap", 1, 0.0),  # the first chunk's second token: no gap to learn from
        *[("gap", 1, 0.1)] * 4,  # 4 tokens in 0.4 s
        ("finish", 6),
    ]


async def test_telemetry_reaches_the_controller_and_survives_a_failing_source() -> None:
    fake = FakeEngine()
    telemetry = FedTelemetry()
    reading = EngineMetrics(running=3, waiting=1, kv_usage=0.5, preemptions=2)
    gate = LLMGate(fake.engine, SLO, controller=fixed(2), telemetry=telemetry)
    with capture_logs() as logs:
        async with gate:
            telemetry.items.put_nowait(RuntimeError("scrape failed"))
            telemetry.items.put_nowait("not a reading")  # type: ignore[arg-type]
            telemetry.items.put_nowait(None)
            telemetry.items.put_nowait(reading)
            stream = gate.submit(request("a"))
            fake.feed("a", "x", END)
            assert await read_all(stream) == ["x"]  # a request meanwhile is untouched
            await telemetry.entered_read(5)  # the fourth reading was recorded
            assert gate.stats().engine == reading
            assert gate.controller._engine == reading
    assert telemetry.closed
    failures = [e for e in logs if e["event"] == "llm_gate.telemetry_failed"]
    assert len(failures) == 2 and failures[0]["gate"] == "llm"


async def test_record_engine_metrics_takes_only_readings() -> None:
    gate = make_gate(FakeEngine())
    with pytest.raises(TypeError, match="metrics must be an EngineMetrics"):
        gate.record_engine_metrics({"running": 1})  # type: ignore[arg-type]
    reading = EngineMetrics(running=1, waiting=0, kv_usage=0.1, preemptions=0)
    gate.record_engine_metrics(reading)
    assert gate.stats().engine == reading
    await gate.aclose()


def test_time_quantiles_convert_milliseconds() -> None:
    q = TimeQuantiles.of(Quantiles(3, 100.0, 200.0, 250.0, 300.0, 400.0, 150.0))
    assert q == TimeQuantiles(3, 0.1, 0.2, 0.3, 0.15)


@pytest.mark.parametrize(
    ("first", "last", "tokens", "expected"),
    [(1.0, 2.0, 5, 0.25), (1.0, 1.0, 1, 0.0), (None, None, 0, 0.0), (None, None, 3, math.nan)],
)
def test_tpot_follows_the_slo_definition(
    first: float | None, last: float | None, tokens: int, expected: float
) -> None:
    value = tpot_s(first, last, tokens)
    assert value == pytest.approx(expected, nan_ok=True)


async def test_the_default_controller_ticks_on_what_the_shell_feeds_it() -> None:
    clock = Clock()
    fake = FakeEngine()
    reading = EngineMetrics(running=4, waiting=0, kv_usage=0.3, preemptions=0)
    async with LLMGate(fake.engine, SLO, max_in_flight=4, clock=clock) as gate:
        for wave in range(30):
            streams = [gate.submit(request((wave, i), prompt_tokens=50)) for i in range(4)]
            for i in range(4):
                await fake.started((wave, i))
            for _ in range(6):
                clock.advance(0.02)
                for i in range(4):
                    fake.feed((wave, i), "t")
                for stream in streams:
                    await stream.__anext__()
            for i in range(4):
                fake.feed((wave, i), END)
            for stream in streams:
                assert await read_all(stream) == []
            gate.record_engine_metrics(reading)
            clock.advance(0.2)
            gate.poll()  # ticks when an interval passed
        stats = gate.stats()
    assert stats.counts.completed == 120 and stats.counts.ended == stats.counts.submitted
    assert len(gate.controller.history) > 10  # it ticked
    assert 1 <= stats.limit <= 4
    assert stats.tpot.p50_s == pytest.approx(0.02, rel=REL)

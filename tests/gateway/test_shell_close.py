"""Closing an LLMGate: drained, cut off after a timeout, or at once; the engine and the
telemetry source are closed last."""

from __future__ import annotations

import asyncio

import pytest

from adaptive_batcher.errors import BatcherClosedError
from adaptive_batcher.gateway import LLMGate
from tests.gateway.fakes import END, SLO, FakeEngine, FedTelemetry, fixed, make_gate, request


async def test_a_draining_close_lets_the_running_finish_and_admits_the_waiting() -> None:
    fake = FakeEngine()
    gate = make_gate(fake, limit=1)
    running = gate.submit(request("a"))
    waiting = gate.submit(request("b"))
    closing = asyncio.ensure_future(gate.aclose())
    await fake.started("a")
    late = gate.submit(request("late"))
    with pytest.raises(BatcherClosedError):
        await late.admitted()
    fake.feed("a", "x", END)
    await fake.started("b")  # admitted as the slot freed, though the gate is closing
    assert not closing.done()
    fake.feed("b", "y", END)
    await closing
    assert [running.outcome, waiting.outcome] == ["completed", "completed"]
    assert [c.data async for c in running] == ["x"]  # read after the close: still there
    assert [c.data async for c in waiting] == ["y"]
    counts = gate.stats().counts
    assert (counts.completed, counts.rejected, counts.submitted) == (2, 1, 3)
    assert fake.engine.closed and fake.aborted == []


async def test_a_drain_that_runs_out_of_time_fails_what_is_left() -> None:
    fake = FakeEngine()
    gate = make_gate(fake, limit=1)
    running = gate.submit(request("a"))
    waiting = gate.submit(request("b"))
    await fake.started("a")
    await asyncio.wait_for(gate.aclose(timeout_s=0.01), 10.0)  # the engine never answers
    with pytest.raises(BatcherClosedError):
        await running.__anext__()
    with pytest.raises(BatcherClosedError):
        await waiting.admitted()
    assert (running.outcome, waiting.outcome) == ("failed", "rejected")
    assert fake.aborted == ["a"] and fake.inside == 0
    assert not fake.is_started("b")
    counts = gate.stats().counts
    assert (counts.failed, counts.rejected, counts.running, counts.waiting) == (1, 1, 0, 0)


async def test_a_close_without_drain_ends_everything_at_once() -> None:
    fake = FakeEngine()
    gate = make_gate(fake, limit=2)
    streams = [gate.submit(request(i)) for i in range(4)]
    await fake.started(0)
    await fake.started(1)
    fake.feed(0, "x")
    await gate.aclose(drain=False)
    assert [s.outcome for s in streams] == ["failed", "failed", "rejected", "rejected"]
    for stream in streams[2:]:
        with pytest.raises(BatcherClosedError):
            await stream.admitted()
    assert sorted(fake.aborted) == [0, 1]
    assert fake.inside == 0 and fake.engine.closed
    assert gate.stats().rejected_by_reason["closed"] == 2


async def test_a_close_without_drain_cuts_a_draining_one_short() -> None:
    fake = FakeEngine()
    gate = make_gate(fake, limit=1)
    running = gate.submit(request("a"))
    await fake.started("a")
    draining = asyncio.ensure_future(gate.aclose())
    await asyncio.sleep(0)
    assert not draining.done()
    await gate.aclose(drain=False)
    await asyncio.wait_for(draining, 10.0)
    assert running.outcome == "failed"
    assert fake.aborted == ["a"]


async def test_closing_an_unstarted_gate_closes_its_engine_and_telemetry() -> None:
    fake = FakeEngine()
    telemetry = FedTelemetry()
    gate = LLMGate(fake.engine, SLO, controller=fixed(1), telemetry=telemetry)
    await gate.aclose()
    await gate.aclose()  # idempotent
    assert gate.closed and fake.engine.closed and telemetry.closed


async def test_a_failing_engine_close_is_logged_not_raised() -> None:
    class BadClose:
        def stream(self, request: object) -> object:
            raise AssertionError("not called")

        async def aclose(self) -> None:
            raise OSError("socket gone")

    gate = LLMGate(BadClose(), SLO, controller=fixed(1))  # type: ignore[arg-type]
    await gate.aclose()
    assert gate.closed


async def test_the_context_manager_drains_on_exit() -> None:
    fake = FakeEngine()
    async with make_gate(fake, limit=1) as gate:
        stream = gate.submit(request("a"))
        fake.feed("a", "x", END)
    assert gate.closed and stream.outcome == "completed"

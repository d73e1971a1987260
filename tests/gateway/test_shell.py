"""LLMGate and GateStream: admission, refusals, deadlines, caller closes, engine failures."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from adaptive_batcher.errors import (
    BatcherClosedError,
    ConcurrentReadError,
    DeadlineExceededError,
    EventLoopError,
    StreamBufferFullError,
)
from adaptive_batcher.gateway import (
    Chunk,
    InProcessEngine,
    LLMGate,
    LLMRequest,
    UpstreamTimeoutError,
    Usage,
)
from adaptive_batcher.llm import (
    GateQueueFullError,
    ModelLimit,
    RequestFailedError,
    StaticLimit,
    TokenController,
    TokenSLO,
    TTFTUnreachableError,
)
from adaptive_batcher.llm.gate import TTFTForecast
from tests.gateway.fakes import (
    END,
    SLO,
    Clock,
    FakeEngine,
    fixed,
    make_gate,
    read_all,
    request,
    until,
)


async def test_the_token_count_is_the_usage_once_the_engine_sent_it() -> None:
    fake = FakeEngine()
    async with make_gate(fake) as gate:
        stream = gate.submit(request("a"))
        await stream.admitted()
        # two events of two tokens each, counted as one each: the usage at the end is exact
        fake.feed("a", "He", Chunk("llo", tokens=1, usage=Usage(10, 4)), END)
        await read_all(stream)
        assert stream.tokens == 4


async def test_a_request_streams_through_and_completes() -> None:
    fake = FakeEngine()
    async with make_gate(fake) as gate:
        stream = gate.submit(request("a"))
        await stream.admitted()
        fake.feed("a", "Hel", Chunk("lo", tokens=2, usage=Usage(10, 3)), END)
        assert await read_all(stream) == ["Hel", "lo"]
        assert stream.outcome == "completed"
        assert stream.usage == Usage(10, 3)
        assert stream.tokens == 3
        counts = gate.stats().counts
        assert (counts.submitted, counts.admitted, counts.completed) == (1, 1, 1)
        assert counts.ended == 1 and counts.running == counts.waiting == 0
    assert fake.aborted == []
    assert fake.engine.closed  # the gate closes its engine


async def test_admission_keeps_the_limit_and_arrival_order() -> None:
    fake = FakeEngine()
    async with make_gate(fake, limit=2) as gate:
        streams = [gate.submit(request(i)) for i in range(5)]
        stats = gate.stats()
        assert (stats.in_flight, stats.waiting, stats.limit) == (2, 3, 2)
        for i in range(5):
            await streams[i].admitted()
            assert fake.inside <= 2
            fake.feed(i, f"t{i}", END)
            assert await read_all(streams[i]) == [f"t{i}"]
        assert fake.order == [0, 1, 2, 3, 4]
        assert fake.peak == 2
        assert gate.stats().counts.completed == 5


async def test_a_request_that_would_miss_its_ttft_is_refused_at_once() -> None:
    fake = FakeEngine()
    forecast = TTFTForecast(departure_rps=1.0, engine_ttft_s=0.5)
    gate = LLMGate(fake.engine, SLO, controller=fixed(1, admit_ttft_s=0.3, forecast=forecast))
    first = gate.submit(request("first"))
    refused = gate.submit(request("second"))
    assert refused.outcome == "rejected"  # decided in submit, before any wait
    with pytest.raises(TTFTUnreachableError) as caught:
        await refused.admitted()
    assert caught.value.http_status == 503
    assert caught.value.retry_after_s == pytest.approx(1.5 - 0.3)
    with pytest.raises(TTFTUnreachableError):
        await refused.__anext__()
    assert await read_all(refused) == []  # raised once, then exhausted
    stats = gate.stats()
    assert stats.rejected_by_reason["ttft_unreachable"] == 1
    assert stats.counts.rejected == 1 and stats.counts.running == 1
    assert not fake.is_started("second")
    await first.aclose()
    await gate.aclose()


async def test_a_full_queue_refuses_with_429() -> None:
    fake = FakeEngine()
    async with make_gate(fake, limit=1, max_queue=1) as gate:
        running = gate.submit(request("a"))
        waiting = gate.submit(request("b"))
        refused = gate.submit(request("c"))
        with pytest.raises(GateQueueFullError) as caught:
            await refused.admitted()
        assert caught.value.http_status == 429
        assert caught.value.retry_after_s >= 0
        assert gate.stats().rejected_by_reason == {
            "ttft_unreachable": 0,
            "queue_full": 1,
            "closed": 0,
        }
        assert waiting.outcome is None and running.outcome is None
        for stream in (running, waiting):
            await stream.aclose()


async def test_a_deadline_expires_a_waiting_request() -> None:
    clock = Clock()
    fake = FakeEngine()
    async with make_gate(fake, limit=1, clock=clock) as gate:
        running = gate.submit(request("a"))
        waiting = gate.submit(request("b", timeout_s=5.0))
        clock.advance(4.0)
        gate.poll()
        assert waiting.outcome is None
        clock.advance(2.0)
        gate.poll()
        assert waiting.outcome == "expired"
        with pytest.raises(DeadlineExceededError):
            await waiting.admitted()
        assert gate.stats().counts.expired == 1
        await running.aclose()
    assert not fake.is_started("b")


async def test_the_timer_expires_a_waiting_request_by_itself() -> None:
    fake = FakeEngine()
    async with make_gate(fake, limit=1) as gate:  # the real clock and the loop's timer
        running = gate.submit(request("a"))
        waiting = gate.submit(request("b", timeout_s=0.01))
        with pytest.raises(DeadlineExceededError):
            await asyncio.wait_for(waiting.admitted(), 10.0)
        await running.aclose()


async def test_a_deadline_aborts_a_running_request() -> None:
    clock = Clock()
    fake = FakeEngine()
    async with make_gate(fake, limit=1, clock=clock) as gate:
        running = gate.submit(request("a", timeout_s=5.0))
        queued = gate.submit(request("b"))
        await fake.started("a")
        fake.feed("a", "x")
        assert await running.__anext__() == Chunk("x")
        fake.feed("a", "y")
        await until(lambda: len(running._chunks) == 1)  # "y" arrived, unread
        clock.advance(6.0)
        gate.poll()
        assert running.outcome == "expired"
        assert await running.__anext__() == Chunk("y")  # what came before the deadline
        with pytest.raises(DeadlineExceededError):
            await running.__anext__()
        await queued.admitted()  # the slot is free
        await until(lambda: fake.aborted == ["a"])
        await fake.started("b")
        await queued.aclose()
    assert fake.aborted == ["a", "b"]


@pytest.mark.parametrize("read_first", [False, True])
async def test_closing_a_waiting_stream_frees_its_place(read_first: bool) -> None:
    fake = FakeEngine()
    async with make_gate(fake, limit=1) as gate:
        running = gate.submit(request("a"))
        waiting = gate.submit(request("b"))
        if read_first:  # a reader waiting for it: ends with the close
            reader = asyncio.ensure_future(read_all(waiting))
            await until(lambda: waiting._waiter is not None)
        await waiting.aclose()
        assert waiting.outcome == "cancelled"
        if read_first:
            assert await reader == []
        with pytest.raises(BatcherClosedError):
            await waiting.admitted()
        stats = gate.stats()
        assert (stats.counts.cancelled, stats.waiting, stats.in_flight) == (1, 0, 1)
        fake.feed("a", END)
        assert await read_all(running) == []
    assert not fake.is_started("b")
    assert fake.aborted == []


async def test_closing_mid_stream_aborts_upstream_once_and_frees_the_slot() -> None:
    fake = FakeEngine()
    async with make_gate(fake, limit=1) as gate:
        running = gate.submit(request("a"))
        waiting = gate.submit(request("b"))
        await fake.started("a")
        fake.feed("a", "x", "y")
        assert (await running.__anext__()).data == "x"
        await running.aclose()
        assert fake.aborted == ["a"]
        assert "a" in fake.finalized  # the engine's generator was closed
        assert running.outcome == "cancelled"
        assert await read_all(running) == []  # unread chunks are dropped
        await waiting.admitted()
        await running.aclose()  # idempotent
        assert fake.aborted == ["a"]
        fake.feed("b", END)
        await read_all(waiting)
    assert gate.stats().counts.cancelled == 1
    assert fake.aborted == ["a"]


async def test_a_reader_that_stops_reading_fails_its_stream_and_frees_the_slot() -> None:
    fake = FakeEngine()
    gate = LLMGate(fake.engine, SLO, controller=fixed(1), max_buffered_chunks=3)
    async with gate:
        slow = gate.submit(request("slow"))
        waiting = gate.submit(request("next"))
        await fake.started("slow")
        fake.feed("slow", "a", "b", "c", "d", "e")  # never read while it streams
        await fake.started("next")  # the slot was freed
        assert fake.aborted == ["slow"] and slow.outcome == "failed"
        held = [(await anext(slow)).data for _ in range(4)]  # what it held, then the error
        assert held == ["a", "b", "c", "d"]
        with pytest.raises(StreamBufferFullError, match="4 chunks behind"):
            await anext(slow)
        fake.feed("next", END)
        await read_all(waiting)
        counts = gate.stats().counts
    assert (counts.failed, counts.completed) == (1, 1)


async def test_closing_after_the_end_aborts_nothing() -> None:
    fake = FakeEngine()
    async with make_gate(fake) as gate:
        async with gate.submit(request("a")) as stream:
            fake.feed("a", "x", END)
            assert await read_all(stream) == ["x"]
        assert stream.outcome == "completed"
    assert fake.aborted == []


async def test_a_cancelled_reader_cancels_its_request() -> None:
    fake = FakeEngine()
    async with make_gate(fake, limit=1) as gate:
        running = gate.submit(request("a"))
        await fake.started("a")
        reader = asyncio.ensure_future(running.__anext__())
        await until(lambda: running._waiter is not None)
        reader.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reader
        assert running.outcome == "cancelled"
        await until(lambda: fake.aborted == ["a"])
        assert gate.stats().in_flight == 0


async def test_an_engine_error_fails_the_request_with_its_cause() -> None:
    fake = FakeEngine()
    async with make_gate(fake) as gate:
        stream = gate.submit(request("a"))
        failure = UpstreamTimeoutError("no next chunk in time")
        fake.feed("a", "x", failure)
        assert (await stream.__anext__()).data == "x"
        with pytest.raises(RequestFailedError) as caught:
            await stream.__anext__()
        assert caught.value.cause is failure
        assert caught.value.__cause__ is failure
        assert await read_all(stream) == []
        assert stream.outcome == "failed"
        assert gate.stats().counts.failed == 1
    assert fake.aborted == []  # a failed request has nothing left to abort


@pytest.mark.parametrize("item", [42, Chunk("x", tokens=-1), Chunk("x", tokens=1.5)])
async def test_a_malformed_chunk_fails_the_request(item: Any) -> None:
    async def generate(request: LLMRequest) -> AsyncIterator[Any]:
        yield Chunk("ok")
        yield item

    async with LLMGate(InProcessEngine(generate), SLO, controller=fixed(1)) as gate:
        stream = gate.submit(request("a"))
        assert (await stream.__anext__()).data == "ok"
        with pytest.raises(RequestFailedError) as caught:
            await stream.__anext__()
        assert isinstance(caught.value.cause, TypeError | ValueError)
        assert gate.stats().counts.failed == 1


async def test_an_adapter_stuck_in_its_abort_does_not_hang_the_caller() -> None:
    release = asyncio.Event()
    opened = asyncio.Event()

    class Stuck:
        def __aiter__(self) -> Stuck:
            return self

        async def __anext__(self) -> Chunk:
            opened.set()
            await asyncio.Event().wait()  # never a chunk
            raise AssertionError("unreachable")

        async def aclose(self) -> None:
            await release.wait()  # stuck until the test lets it go

    class StuckEngine:
        def stream(self, request: LLMRequest) -> Stuck:
            return Stuck()

        async def aclose(self) -> None:
            pass

    gate = LLMGate(StuckEngine(), SLO, controller=fixed(1), abort_timeout_s=0.01)
    stream = gate.submit(request("a"))
    await opened.wait()
    await asyncio.wait_for(stream.aclose(), 10.0)  # returns after abort_timeout_s
    assert stream.outcome == "cancelled"
    assert gate.stats().in_flight == 0
    await asyncio.wait_for(gate.aclose(), 10.0)  # the stuck abort is cut off too
    release.set()


async def test_two_readers_at_once_are_refused() -> None:
    fake = FakeEngine()
    async with make_gate(fake) as gate:
        stream = gate.submit(request("a"))
        reader = asyncio.ensure_future(stream.__anext__())
        await until(lambda: stream._waiter is not None)
        with pytest.raises(ConcurrentReadError):
            await stream.__anext__()
        fake.feed("a", "x", END)
        assert (await reader).data == "x"
        assert await read_all(stream) == []


async def test_submit_after_close_is_refused_at_once() -> None:
    fake = FakeEngine()
    gate = make_gate(fake)
    await gate.aclose()
    stream = gate.submit(request("late"))
    with pytest.raises(BatcherClosedError):
        await stream.admitted()
    stats = gate.stats()
    assert stats.closed and stats.rejected_by_reason["closed"] == 1
    assert stats.counts.rejected == stats.counts.submitted == 1
    with pytest.raises(BatcherClosedError):
        await gate.start()


async def test_the_default_controller_is_ours_bounded_by_max_in_flight() -> None:
    fake = FakeEngine()
    gate = LLMGate(fake.engine, SLO, max_in_flight=8, max_queue=3, name="chat")
    assert isinstance(gate.controller.law, ModelLimit)
    assert gate.controller.max_limit == 8 and gate.controller.max_queue == 3
    assert gate.controller.pace_prefill  # prefill pacing on unless told otherwise
    assert gate.stats().limit == 8
    assert (gate.name, gate.slo) == ("chat", SLO)
    await gate.aclose()


async def test_the_default_controller_can_start_below_max_in_flight() -> None:
    """A trial's gateway admitted a start-up burst whole at the default limit (256): 66 in the
    engine at once, TPOT p99 94 ms against 50, then the limit cut to 2 for 10 s."""
    gate = LLMGate(FakeEngine().engine, SLO, max_in_flight=64, initial_limit=8)
    assert gate.stats().limit == 8 and gate.controller.max_limit == 64
    await gate.aclose()


async def test_the_default_controller_can_go_without_prefill_pacing() -> None:
    gate = LLMGate(FakeEngine().engine, SLO, pace_prefill=False)
    assert not gate.controller.pace_prefill and isinstance(gate.controller.law, ModelLimit)
    await gate.aclose()


async def test_a_gate_is_bound_to_one_loop() -> None:
    fake = FakeEngine()
    gate = make_gate(fake)
    await gate.start()
    await gate.start()  # idempotent

    def elsewhere() -> None:
        async def submit() -> None:
            gate.submit(request("x"))

        asyncio.run(submit())

    with pytest.raises(EventLoopError, match="another event loop"):
        await asyncio.get_running_loop().run_in_executor(None, elsewhere)
    await gate.aclose()


def test_submit_needs_a_running_loop() -> None:
    gate = make_gate(FakeEngine())
    with pytest.raises(RuntimeError):
        gate.submit(request("x"))


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"engine": object()}, TypeError, "engine must be an Engine"),
        ({"slo": 300}, TypeError, "slo must be a TokenSLO"),
        ({"controller": "ours"}, TypeError, "controller must be a TokenController"),
        ({"max_in_flight": 0}, ValueError, "max_in_flight must be >= 1"),
        ({"max_queue": -1}, ValueError, "max_queue must be >= 0"),
        ({"name": 3}, TypeError, "name must be a str"),
        ({"abort_timeout_s": 0}, ValueError, "abort_timeout_s must be"),
        ({"telemetry": object()}, TypeError, "telemetry must be an EngineTelemetry"),
        ({"max_buffered_chunks": 0}, ValueError, "max_buffered_chunks must be >= 1"),
        ({"initial_limit": 0}, ValueError, "initial_limit must be >= 1"),
        ({"initial_limit": 300}, ValueError, r"initial_limit must be at most max_in_flight"),
        (
            {"initial_limit": 4, "controller": TokenController(SLO, StaticLimit(4))},
            ValueError,
            "initial_limit is the default controller's",
        ),
        (
            {"pace_prefill": False, "controller": TokenController(SLO, StaticLimit(4))},
            ValueError,
            "pace_prefill is the default controller's",
        ),
        ({"pace_prefill": 0}, TypeError, "pace_prefill must be a bool"),
    ],
)
def test_bad_arguments_are_named(kwargs: dict[str, Any], error: type, match: str) -> None:
    arguments: dict[str, Any] = {"engine": FakeEngine().engine, "slo": SLO, **kwargs}
    engine, slo = arguments.pop("engine"), arguments.pop("slo")
    with pytest.raises(error, match=match):
        LLMGate(engine, slo, **arguments)


def test_a_controller_for_another_slo_is_refused() -> None:
    other = TokenSLO(ttft_ms=100.0, tpot_ms=20.0)
    controller = TokenController(other, StaticLimit(4))
    with pytest.raises(ValueError, match=r"controller\.slo must be slo"):
        LLMGate(FakeEngine().engine, SLO, controller=controller)


async def test_submit_takes_only_an_llm_request() -> None:
    async with make_gate(FakeEngine()) as gate:
        with pytest.raises(TypeError, match="request must be an LLMRequest"):
            gate.submit({"prompt": "hi"})  # type: ignore[arg-type]


async def test_bad_aclose_arguments_are_named() -> None:
    gate = make_gate(FakeEngine())
    with pytest.raises(TypeError, match="drain must be a bool"):
        await gate.aclose(drain=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout_s must be"):
        await gate.aclose(timeout_s=-1.0)
    assert not gate.closed
    await gate.aclose()


@pytest.mark.parametrize(
    ("fields", "error", "match"),
    [
        ({"prompt_tokens": -1}, ValueError, r"request\.prompt_tokens must be >= 0"),
        ({"prompt_tokens": 1.5}, TypeError, r"request\.prompt_tokens must be an int"),
        ({"max_tokens": 0}, ValueError, r"request\.max_tokens must be >= 1"),
        ({"timeout_s": 0.0}, ValueError, r"request\.timeout_s must be a finite number > 0"),
        ({"timeout_s": "1"}, TypeError, r"request\.timeout_s must be a number"),
    ],
)
async def test_a_malformed_request_is_refused_with_its_field_named(
    fields: dict[str, Any], error: type, match: str
) -> None:
    async with make_gate(FakeEngine()) as gate:
        with pytest.raises(error, match=match):
            gate.submit(LLMRequest("x", **fields))
        assert gate.stats().counts.submitted == 0

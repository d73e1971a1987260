"""Test doubles for the gate's shell: an engine whose streams the test drives through queues, a
controller with fixed knobs, a virtual clock, a telemetry source fed by the test."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

from adaptive_batcher.gateway import Chunk, InProcessEngine, LLMGate, LLMRequest
from adaptive_batcher.llm import EngineMetrics, StaticLimit, TokenController, TokenSLO
from adaptive_batcher.llm.controller import GateDecision
from adaptive_batcher.llm.gate import GateLimits, TTFTForecast

SLO = TokenSLO(ttft_ms=300.0, tpot_ms=50.0)

END = object()
"""Fed to a stream: the engine ends it normally."""


class Clock:
    """A virtual clock, seconds."""

    def __init__(self, t: float = 100.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


class FakeEngine:
    """An in-process engine (:class:`InProcessEngine`) whose streams the test drives.

    A request's key is its ``payload``. :meth:`feed` queues what its stream yields next: a
    ``Chunk`` or ``str``, an exception to raise, or :data:`END`. ``inside`` counts the streams
    running in the engine, ``peak`` the most at once; ``aborted`` lists the keys whose abort
    was called, ``order`` the keys in the order the engine started them.
    """

    def __init__(self, *, on_item: Callable[[Any], None] | None = None) -> None:
        self.queues: dict[Any, asyncio.Queue[Any]] = {}
        self._started: dict[Any, asyncio.Event] = {}
        self.order: list[Any] = []
        self.inside = 0
        self.peak = 0
        self.aborted: list[Any] = []
        self.finalized: list[Any] = []
        self.on_item = on_item
        self.engine = InProcessEngine(self._generate, abort=self._abort)

    def _queue(self, key: Any) -> asyncio.Queue[Any]:
        return self.queues.setdefault(key, asyncio.Queue())

    def _event(self, key: Any) -> asyncio.Event:
        return self._started.setdefault(key, asyncio.Event())

    async def _generate(self, request: LLMRequest) -> AsyncIterator[Chunk | str]:
        key = request.payload
        queue = self._queue(key)
        self.order.append(key)
        self.inside += 1
        self.peak = max(self.peak, self.inside)
        self._event(key).set()
        try:
            while True:
                item = await queue.get()
                if self.on_item is not None:
                    self.on_item(item)
                if item is END:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self.inside -= 1
            self.finalized.append(key)

    async def _abort(self, request: LLMRequest) -> None:
        self.aborted.append(request.payload)

    def feed(self, key: Any, *items: Any) -> None:
        queue = self._queue(key)
        for item in items:
            queue.put_nowait(item)

    def is_started(self, key: Any) -> bool:
        return self._event(key).is_set()

    async def started(self, key: Any) -> None:
        await self._event(key).wait()


class FixedController(TokenController):
    """A controller whose decision never changes (no ticks): the gate's knobs and forecast as
    the test sets them."""

    def __init__(
        self,
        limits: GateLimits,
        forecast: TTFTForecast | None = None,
        slo: TokenSLO = SLO,
    ) -> None:
        limit = limits.max_in_flight
        super().__init__(slo, StaticLimit(limit), initial_limit=limit, max_limit=limit)
        self._fixed = GateDecision(limits, forecast)

    @property
    def decision(self) -> GateDecision:
        return self._fixed

    def due(self, now: float) -> bool:
        return False


def fixed(
    limit: int,
    *,
    max_queue: int | None = None,
    admit_ttft_s: float | None = None,
    forecast: TTFTForecast | None = None,
    prefill_tokens_per_s: float | None = None,
) -> FixedController:
    burst = None if prefill_tokens_per_s is None else 1000.0
    limits = GateLimits(
        limit,
        max_queue=max_queue,
        admit_ttft_s=admit_ttft_s,
        prefill_tokens_per_s=prefill_tokens_per_s,
        prefill_burst_tokens=burst,
    )
    return FixedController(limits, forecast)


def request(key: Any, *, timeout_s: float | None = None, prompt_tokens: int = 10) -> LLMRequest:
    return LLMRequest(key, prompt_tokens=prompt_tokens, timeout_s=timeout_s)


def make_gate(
    fake: FakeEngine,
    limit: int = 2,
    *,
    clock: Clock | None = None,
    abort_timeout_s: float = 5.0,
    **knobs: Any,
) -> LLMGate:
    return LLMGate(
        fake.engine,
        SLO,
        controller=fixed(limit, **knobs),
        clock=clock,
        abort_timeout_s=abort_timeout_s,
    )


async def until(predicate: Callable[[], bool], turns: int = 1000) -> None:
    """Let the loop run until ``predicate()`` holds (at most ``turns`` turns, else fail)."""
    for _ in range(turns):
        if predicate():
            return
        await asyncio.sleep(0)
    raise AssertionError("the condition never held")


async def eventually(predicate: Callable[[], bool], bound_s: float, poll_s: float = 0.005) -> None:
    """Poll ``predicate()`` every ``poll_s`` until it holds; fail after ``bound_s`` seconds
    (for conditions that wait on real sockets, where loop turns alone bound nothing)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + bound_s
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"the condition did not hold within {bound_s} s")
        await asyncio.sleep(poll_s)


async def read_all(stream: Any) -> list[Any]:
    return [chunk.data async for chunk in stream]


class FedTelemetry:
    """An engine-metrics source whose readings the test hands over: each ``read()`` takes the
    next item of ``items`` (an ``EngineMetrics``, None, or an exception to raise)."""

    def __init__(self, interval_s: float = 1e-3) -> None:
        self.interval_s = interval_s
        self.items: asyncio.Queue[EngineMetrics | BaseException | None] = asyncio.Queue()
        self.reads = 0
        self.closed = False
        self._entered: dict[int, asyncio.Event] = {}
        self.entered = 0

    def _event(self, n: int) -> asyncio.Event:
        return self._entered.setdefault(n, asyncio.Event())

    async def entered_read(self, n: int) -> None:
        """Wait until ``read()`` has been called ``n`` times."""
        await self._event(n).wait()

    async def read(self) -> EngineMetrics | None:
        self.entered += 1
        self._event(self.entered).set()
        item = await self.items.get()
        self.reads += 1
        if isinstance(item, BaseException):
            raise item
        return item

    async def aclose(self) -> None:
        self.closed = True


async def every_ending(gate: LLMGate, fake: FakeEngine, clock: Clock) -> None:
    """Ends requests every way on a gate with limit 1, a queue of 1 and ``clock``: 2 completed,
    1 refused (queue full), 1 expired, 1 failed, 1 cancelled."""
    first = gate.submit(request("a"))
    expiring = gate.submit(request("b", timeout_s=1.0))
    refused = gate.submit(request("c"))
    assert refused.outcome == "rejected"
    clock.advance(0.25)
    fake.feed("a", "x")
    await first.__anext__()
    clock.advance(1.0)
    gate.poll()
    assert expiring.outcome == "expired"
    fake.feed("a", "y", END)
    assert await read_all(first) == ["y"]
    failing = gate.submit(request("d"))
    fake.feed("d", RuntimeError("engine fault"))
    assert await read_all_or_error(failing) is not None
    cancelled = gate.submit(request("e"))
    await fake.started("e")
    await cancelled.aclose()
    done = gate.submit(request("f"))
    clock.advance(0.5)
    fake.feed("f", "z", END)
    assert await read_all(done) == ["z"]


async def read_all_or_error(stream: Any) -> BaseException | None:
    try:
        await read_all(stream)
    except Exception as exc:
        return exc
    return None

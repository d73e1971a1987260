"""Chaos harness for the asyncio runtime: a fault-injecting model, a Poisson driver that also
changes settings at run time, and the invariants checked after every batcher lifetime.

A seeded run is a sequence of *segments*: each builds one :class:`AdaptiveBatcher` with a random
configuration (executor, cap, window, slots, queue bound, buckets, bisection, control law,
SLO-aware shedding, sized items, telemetry), drives it with Poisson arrivals, bursts,
cancellations and deadlines while a "monkey" changes limits, SLO, policy and the model's memory
limit, then closes it in a random way (with or without draining, with or without a time limit,
escalated) while arrivals go on for a moment.

Faults the model injects: an exception instance in one result slot (``slot`` items), a
poisoned item that makes the whole call raise (``poison``), a call that returns one result too
few (``short``), random whole-call failures, ``MemoryError`` for calls above a size limit that
changes over time (the batcher splits them), and hung calls (``hang`` items; only in segments
whose close has a time limit, and never with the inline executor, whose model runs on the loop).

Faults around the model (issue 22): a telemetry source whose ``sample()`` gets stuck for good
(the close must not wait for it: checked, the reading is released only after the close); a batch
listener that stalls the loop (a slow exporter) or raises a ``BaseException`` that is not an
``Exception``; a streaming model (``STREAM_STEPS`` elements per caller, failing mid-stream,
hanging, slot errors, wrong step lengths) whose streams a second task sometimes reads at the same
time (``ConcurrentReadError`` for the one that comes second while the other waits; the elements
both took are the stream's, in order). Each seed's segment ``i`` has at least the fault
``FORCED[i % 3]``, so every seed exercises all three.

Known faults fixed elsewhere are left out of the mix on purpose: a sync model raising
``StopIteration``, ``StopIteration`` returned in a result slot, a model awaiting
``batcher.aclose()``, and ``SystemExit``/``KeyboardInterrupt`` from the model.

After every segment: each caller ended exactly once, with its own result (the model echoes a
per-request token), its own slot exception, a typed error it could get (``DeadlineExceededError``
only with a deadline or shedding, ``QueueFullError`` only with a bounded queue,
``ItemTooLargeError`` only for an item larger than the cap, the model's exception as the
cause of ``BatchFailedError`` only for a call that held its token, and with bisection only for the
poisoned item itself), or ``CancelledError`` only if the harness cancelled it; the batcher's counts
add up to what was submitted and agree with what the callers saw; no task is left; the engine is
idle. After every seed: no thread is left beyond those before it, the loop reported no unhandled
error and the library logged no error.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import structlog

from adaptive_batcher import (
    SLO,
    AdaptiveBatcher,
    BatcherClosedError,
    BatchFailedError,
    ConcurrentReadError,
    DeadlineExceededError,
    ItemTooLargeError,
    QueueFullError,
    ResultCountError,
)
from adaptive_batcher.metrics.recorder import Counts
from adaptive_batcher.policies import AIMD, PID, DiscountedUCB, Static
from adaptive_batcher.telemetry.base import TelemetrySample
from adaptive_batcher.testing import FakeTelemetry

EXECUTORS = ("async", "thread", "inline")
CLOSES = ("drain", "nodrain", "drain_timeout", "nodrain_timeout", "zero_timeout", "escalate")
TIMED_CLOSES = ("drain_timeout", "nodrain_timeout", "zero_timeout", "escalate")
CONTROLS = ("static", "slo_pid", "aimd", "ucb", "static_policy")
LISTENERS = ("none", "none", "stall", "raise")
FORCED = ("stuck_telemetry", "streaming", "listener")  # segment i has FORCED[i % 3], at least
STREAM_STEPS = 3  # elements per caller of a streaming model
STUCK_SAFETY_S = 5.0  # a stuck telemetry reading is released then at the latest
EXPECTED_ERRORS = frozenset({"batch_listener.failed"})  # logged for the raising listener
CLOSE_OVERLAP_S = 0.05  # arrivals go on this long after the close begins
SETTLE_LIMIT_S = 10.0  # a caller not settled this long after the close is a violation
THREAD_EXIT_LIMIT_S = 10.0


# -- items, results, model errors ------------------------------------------------------------------


class Item:
    """One request: a unique token and what the model does with it."""

    __slots__ = ("kind", "size", "token")

    def __init__(self, token: int, kind: str, size: int = 1) -> None:
        self.token = token
        self.kind = kind  # "ok" | "slot" | "poison" | "short" | "hang"
        self.size = size  # units, for segments with a size function


class Echo:
    """The model's answer to an ``ok`` item: a new object carrying the item's token."""

    __slots__ = ("token",)

    def __init__(self, token: int) -> None:
        self.token = token

    def __repr__(self) -> str:
        return f"Echo({self.token})"


class SlotError(Exception):
    """Returned in the result slot of a ``slot`` item."""

    def __init__(self, token: int) -> None:
        super().__init__(f"slot error for {token}")
        self.token = token


class ChaosError(Exception):
    """A whole-call failure; ``tokens`` are the tokens of the call that raised it."""

    def __init__(self, tokens: tuple[int, ...]) -> None:
        super().__init__(f"{type(self).__name__} in a call of {len(tokens)}")
        self.tokens = frozenset(tokens)


class PoisonError(ChaosError):
    """A ``poison`` item was in the call."""


class TransientError(ChaosError):
    """A random failure of the whole call."""


# -- configuration ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class FaultMix:
    """Fault rates of one seed. Per request: ``slot``, ``poison``, ``short``, ``cancel``,
    ``deadline``; per model call: ``transient``; per second: ``bursts``, ``changes``; per
    segment: ``hang`` (the probability that a segment has one hung call)."""

    slot: float
    poison: float
    short: float
    transient: float
    cancel: float
    deadline: float
    bursts_per_s: float
    changes_per_s: float
    hang: float

    @classmethod
    def draw(cls, rng: random.Random) -> FaultMix:
        return cls(
            slot=rng.uniform(0.005, 0.03),
            poison=rng.uniform(0.001, 0.01),
            short=rng.uniform(0.0, 0.004),
            transient=rng.uniform(0.002, 0.02),
            cancel=rng.uniform(0.01, 0.05),
            deadline=rng.uniform(0.02, 0.1),
            bursts_per_s=rng.uniform(0.2, 1.0),
            changes_per_s=rng.uniform(2.0, 10.0),
            hang=rng.uniform(0.2, 0.5),
        )


@dataclass(frozen=True)
class Segment:
    """One batcher lifetime."""

    index: int
    executor: str
    duration_s: float
    rate_per_s: float
    max_batch_size: int
    window_ms: float
    slots: int
    max_queue_size: int | None
    bisect: bool
    buckets: tuple[int, ...] | None
    control: str
    telemetry: bool
    hang: bool
    close: str
    sized: bool  # items of 1-4 units (a size function), a few larger than the cap
    shed_late: bool  # SLO-aware shedding: any request may expire
    streaming: bool = False  # an async generator model; callers read streams
    stuck_telemetry: bool = False  # the telemetry source's sample() gets stuck for good
    listener: str = "none"  # a batch listener that stalls the loop, or raises a BaseException

    @classmethod
    def draw(
        cls,
        index: int,
        rng: random.Random,
        mix: FaultMix,
        duration_s: float,
        force: str | None = None,
    ) -> Segment:
        executor = rng.choice(EXECUTORS)
        streaming = force == "streaming" or (executor == "async" and rng.random() < 0.3)
        if streaming:
            executor = "async"  # a streaming model runs on the loop
        cap = rng.choice((4, 8, 16, 32, 64))
        hang = executor != "inline" and rng.random() < mix.hang
        sized = rng.random() < 0.3
        control = rng.choice(CONTROLS)
        telemetry = force == "stuck_telemetry" or rng.random() < 0.3
        stuck = telemetry and (force == "stuck_telemetry" or rng.random() < 0.4)
        listener = rng.choice(("stall", "raise")) if force == "listener" else rng.choice(LISTENERS)
        return cls(
            index=index,
            executor=executor,
            duration_s=duration_s,
            rate_per_s=rng.uniform(200.0, 1200.0 if executor != "thread" else 600.0),
            max_batch_size=cap,
            window_ms=rng.choice((0.0, 0.5, 2.0, 5.0)),
            slots=rng.randint(1, 3),
            max_queue_size=rng.choice((None, None, 32, 128, 512)),
            bisect=not streaming and rng.random() < 0.5,
            buckets=_powers_of_two(cap) if not sized and rng.random() < 0.3 else None,
            control=control,
            telemetry=telemetry,
            hang=hang,
            close=rng.choice(TIMED_CLOSES if hang else CLOSES),
            sized=sized,
            shed_late=control in ("slo_pid", "ucb") and rng.random() < 0.5,
            streaming=streaming,
            stuck_telemetry=stuck,
            listener=listener,
        )


def _size_of(item: Item) -> int:
    return item.size


def _powers_of_two(cap: int) -> tuple[int, ...]:
    sizes = [1]
    while sizes[-1] < cap:
        sizes.append(sizes[-1] * 2)
    return tuple(sizes)


def _random_policy(rng: random.Random) -> Any:
    return rng.choice((PID, AIMD, DiscountedUCB, Static))()


# -- the model -------------------------------------------------------------------------------------


class ChaosModel:
    """Echoes tokens, with the faults of :class:`FaultMix`. Thread-safe (thread executor)."""

    def __init__(self, rng: random.Random, transient: float, inline: bool) -> None:
        self._rng = rng
        self._transient = transient
        self._lock = threading.Lock()
        self._base_s, self._per_item_s = (0.0002, 0.000005) if inline else (0.001, 0.00005)
        self.oom_limit = 1 << 30  # calls above this many items raise MemoryError
        self.release = threading.Event()  # wakes hung calls in threads
        self.seen: set[int] = set()
        self.faults: Counter[str] = Counter()

    def _service_s(self, n: int) -> float:
        return self._base_s + self._per_item_s * n

    def _plan(self, batch: list[Item]) -> tuple[str, Any]:
        """What this call does: ("raise", exc), ("hang", None) or ("return", results)."""
        tokens = tuple(item.token for item in batch)
        kinds = {item.kind for item in batch}
        with self._lock:
            self.seen.update(tokens)
            self.faults["model_calls"] += 1
            if len(batch) > self.oom_limit:
                self.faults["oom_raised"] += 1
                return "raise", MemoryError(f"out of memory at {len(batch)} > {self.oom_limit}")
            if self._rng.random() < self._transient:
                self.faults["transient_raised"] += 1
                return "raise", TransientError(tokens)
            if "hang" in kinds:
                self.faults["hung_calls"] += 1
                return "hang", None
            if "poison" in kinds:
                self.faults["poison_raised"] += 1
                return "raise", PoisonError(tokens)
            results: list[Any] = [
                SlotError(item.token) if item.kind == "slot" else Echo(item.token) for item in batch
            ]
            slots = sum(item.kind == "slot" for item in batch)
            self.faults["slot_errors_returned"] += slots
            if "short" in kinds:
                self.faults["short_returned"] += 1
                return "return", results[:-1]
            return "return", results

    async def run_async(self, batch: list[Item]) -> list[Any]:
        await asyncio.sleep(self._service_s(len(batch)))
        action, value = self._plan(batch)
        if action == "raise":
            raise value
        if action == "hang":
            await asyncio.Event().wait()  # until a time-limited close cancels it
        result: list[Any] = value
        return result

    async def run_stream(self, batch: list[Item]) -> AsyncIterator[list[Any]]:
        """The streaming model: ``STREAM_STEPS`` steps of the same results; a failing call
        raises at a random step, after 0 to ``STREAM_STEPS - 1`` steps were handed out."""
        action, value = self._plan(batch)
        with self._lock:
            fail_at = self._rng.randrange(STREAM_STEPS)
        for step in range(STREAM_STEPS):
            await asyncio.sleep(self._service_s(len(batch)))
            if action == "raise" and step == fail_at:
                raise value
            if action == "hang":
                await asyncio.Event().wait()  # until a time-limited close cancels it
            yield value

    def run_sync(self, batch: list[Item]) -> list[Any]:
        time.sleep(self._service_s(len(batch)))
        action, value = self._plan(batch)
        if action == "raise":
            raise value
        if action == "hang":
            self.release.wait(60.0)  # set after the segment's close; then answers too late
            return [Echo(item.token) for item in batch]
        result: list[Any] = value
        return result


class StuckTelemetry:
    """A telemetry source whose ``sample()`` gets stuck after a few readings (a wedged NVML call),
    until :attr:`release` is set: after the segment's close, or after ``STUCK_SAFETY_S``."""

    name = "stuck"

    def __init__(self, good_readings: int) -> None:
        self._left = good_readings
        self.release = threading.Event()
        self.stuck = threading.Event()

    def sample(self) -> TelemetrySample:
        if self._left > 0:
            self._left -= 1
        else:
            self.stuck.set()
            self.release.wait()
        return TelemetrySample(time_s=time.monotonic(), gpu_util_pct=50.0, source=self.name)


class Halt(BaseException):
    """What the raising batch listener raises: not an ``Exception`` (nor an exit)."""


# -- callers ---------------------------------------------------------------------------------------


_UNSET: Any = object()


class StreamDone:
    """A stream's normal end, with the elements its readers took, in order."""

    __slots__ = ("elements",)

    def __init__(self, elements: list[Any]) -> None:
        self.elements = elements

    def __repr__(self) -> str:
        return f"StreamDone({self.elements!r})"


@dataclass(eq=False)
class Caller:
    """One submit as the harness sees it."""

    item: Item
    deadline_ms: float | None
    streams: bool = False  # reads a stream (submit_stream), with a second reader if ``peer``
    peer: bool = False
    elements: list[Any] = field(default_factory=list)  # a stream's, by any of its readers
    peer_error: Exception | None = None  # the stream's error, if the peer read it (once only)
    started: bool = False
    cancelled_by_harness: bool = False
    outcome: Any = _UNSET
    settlements: int = 0

    def settle(self, outcome: Any) -> None:
        self.settlements += 1
        self.outcome = outcome


# -- log and loop-error capture --------------------------------------------------------------------


class EventCounter:
    """A structlog processor that counts events by (level, name) and drops them."""

    def __init__(self) -> None:
        self.counts: Counter[tuple[str, str]] = Counter()

    def __call__(self, _: Any, method_name: str, event_dict: Any) -> Any:
        self.counts[(method_name, str(event_dict.get("event")))] += 1
        raise structlog.DropEvent

    def errors(self, allowed: frozenset[str] = frozenset()) -> list[str]:
        """The error events, but those named in ``allowed`` (expected from a fault)."""
        return [
            f"{name} x{n}"
            for (level, name), n in self.counts.items()
            if level == "error" and name not in allowed
        ]


@contextlib.contextmanager
def counting_events() -> Iterator[EventCounter]:
    """Count the library's log events (levels the configuration lets through) while inside."""
    counter = EventCounter()
    previous = structlog.get_config()
    structlog.configure(processors=[counter])
    try:
        yield counter
    finally:
        structlog.configure(**previous)


# -- one segment -----------------------------------------------------------------------------------


@dataclass
class SegmentReport:
    """What one segment did and what it broke."""

    segment: Segment
    outcomes: Counter[str] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)
    counts: Counts | None = None
    violations: list[str] = field(default_factory=list)


class SegmentRun:
    """Drives one batcher through one segment and checks it afterwards."""

    def __init__(self, segment: Segment, rng: random.Random, mix: FaultMix, tokens: Iterator[int]):
        self.segment = segment
        self.rng = rng
        self.mix = mix
        self.tokens = tokens
        self.model = ChaosModel(
            random.Random(rng.random()), mix.transient, segment.executor == "inline"
        )
        self.callers: list[Caller] = []
        self.tasks: list[asyncio.Task[None]] = []
        self.report = SegmentReport(segment)
        self.faults = self.report.faults
        self.hang_planted = False
        self.stuck = StuckTelemetry(rng.randint(0, 5)) if segment.stuck_telemetry else None
        self.batcher = self._build()

    def _build(self) -> AdaptiveBatcher[Item, Any]:
        seg = self.segment
        model: Any = self.model.run_async if seg.executor == "async" else self.model.run_sync
        if seg.streaming:
            model = self.model.run_stream
        kwargs: dict[str, Any] = {}
        if seg.control == "slo_pid":
            kwargs["slo"] = SLO(latency_ms=self.rng.choice((10.0, 25.0, 50.0)))
        elif seg.control == "aimd":
            kwargs["policy"] = AIMD()
        elif seg.control == "ucb":
            kwargs["policy"] = DiscountedUCB()
            kwargs["slo"] = SLO(latency_ms=30.0)
        elif seg.control == "static_policy":
            kwargs["policy"] = Static()
        if seg.stuck_telemetry:
            assert self.stuck is not None
            kwargs["telemetry"] = self.stuck
            kwargs["telemetry_hz"] = 50.0
        elif seg.telemetry:
            total = 80 << 30
            kwargs["telemetry"] = FakeTelemetry(
                lambda i: TelemetrySample(
                    time_s=float(i),
                    gpu_util_pct=float(i * 7 % 100),
                    mem_total_bytes=total,
                    mem_used_bytes=total // 2 + (i % 10) * (total // 25),
                    source="fake",
                )
            )
            kwargs["telemetry_hz"] = 50.0
        if seg.sized:
            kwargs["size_fn"] = _size_of
        batcher: AdaptiveBatcher[Item, Any] = AdaptiveBatcher(
            model,
            shed_late=seg.shed_late,
            max_batch_size=seg.max_batch_size,
            window_ms=seg.window_ms,
            max_concurrent_batches=seg.slots,
            max_queue_size=seg.max_queue_size,
            batch_sizes=seg.buckets,
            executor=seg.executor,
            bisect_on_error=seg.bisect,
            control_interval_ms=50.0,
            name=f"chaos-{seg.index}",
            **kwargs,
        )
        if seg.listener == "stall":
            batcher.add_batch_listener(self._stalling_listener)
        elif seg.listener == "raise":
            batcher.add_batch_listener(self._raising_listener)
        return batcher

    def _stalling_listener(self, record: Any) -> None:
        """A slow exporter: blocks the loop 0.5-3 ms per batch."""
        self.faults["listener_stalls"] += 1
        time.sleep(self.rng.uniform(0.0005, 0.003))

    def _raising_listener(self, record: Any) -> None:
        """A broken exporter: raises a BaseException that is not an Exception, now and then."""
        if self.rng.random() < 0.2:
            self.faults["listener_raised"] += 1
            raise Halt("the exporter stalled")

    # -- load ------------------------------------------------------------------------------------

    def _new_caller(self) -> None:
        rng, mix = self.rng, self.mix
        draw = rng.random()
        kind = "ok"
        for name, p in (("slot", mix.slot), ("poison", mix.poison), ("short", mix.short)):
            if draw < p:
                kind = name
                break
            draw -= p
        deadline = rng.choice((0.5, 1.0, 3.0, 10.0)) if rng.random() < mix.deadline else None
        size = 1
        if self.segment.sized:  # now and then one larger than the cap: refused at submit
            size = self.segment.max_batch_size + 1 if rng.random() < 0.005 else rng.randint(1, 4)
        self._spawn(Item(next(self.tokens), kind, size), deadline)

    def _spawn(self, item: Item, deadline_ms: float | None) -> None:
        streams = self.segment.streaming and self.rng.random() < 0.8  # else submit()
        peer = streams and self.rng.random() < 0.2
        caller = Caller(item, deadline_ms, streams=streams, peer=peer)
        self.callers.append(caller)
        call = self._call_stream(caller) if streams else self._call(caller)
        task = asyncio.get_running_loop().create_task(call)
        self.tasks.append(task)
        self.faults[f"items_{item.kind}"] += 1
        if deadline_ms is not None:
            self.faults["deadlines_set"] += 1
        if self.rng.random() < self.mix.cancel:
            delay = self.rng.choice((0.0, 0.0005, 0.002, 0.005, 0.02))
            asyncio.get_running_loop().call_later(delay, self._cancel, caller, task)

    async def _call(self, caller: Caller) -> None:
        caller.started = True
        try:
            result = await self.batcher.submit(caller.item, deadline_ms=caller.deadline_ms)
        except asyncio.CancelledError as exc:
            caller.settle(exc)
            raise
        except Exception as exc:
            caller.settle(exc)
        else:
            caller.settle(result)

    async def _call_stream(self, caller: Caller) -> None:
        """Read the caller's stream to its end; with ``peer``, a second task reads it too."""
        caller.started = True
        try:
            stream = self.batcher.submit_stream(caller.item, deadline_ms=caller.deadline_ms)
        except Exception as exc:
            caller.settle(exc)
            return
        if caller.peer:
            peer = asyncio.get_running_loop().create_task(self._peer_read(caller, stream))
            self.tasks.append(peer)
        try:
            while True:
                try:
                    element = await anext(stream)
                except ConcurrentReadError:  # the peer is waiting: take turns
                    self.faults["concurrent_reads_refused_main"] += 1
                    await asyncio.sleep(0)
                    continue
                except StopAsyncIteration:
                    break
                caller.elements.append(element)
        except asyncio.CancelledError as exc:
            caller.settle(exc)
            raise
        except Exception as exc:
            caller.settle(exc)
        else:  # a stream raises its error once, then ends: the peer may have read it
            caller.settle(caller.peer_error or StreamDone(caller.elements))

    async def _peer_read(self, caller: Caller, stream: AsyncIterator[Any]) -> None:
        """A second task reading the same stream once, soon after it was made."""
        await asyncio.sleep(self.rng.choice((0.0, 0.0002, 0.001, 0.003)))
        self.faults["concurrent_readers"] += 1
        try:
            element = await anext(stream)
        except ConcurrentReadError:
            self.faults["concurrent_reads_refused"] += 1
        except StopAsyncIteration:
            self.faults["concurrent_reads_at_end"] += 1
        except Exception as exc:  # the stream's error, raised once: to this reader
            self.faults["concurrent_reads_of_an_error"] += 1
            caller.peer_error = exc
        else:
            self.faults["concurrent_reads_took_an_element"] += 1
            caller.elements.append(element)

    def _cancel(self, caller: Caller, task: asyncio.Task[None]) -> None:
        if task.done():
            self.faults["cancels_too_late"] += 1
            return
        dispatched = caller.item.token in self.model.seen
        self.faults["cancels_after_dispatch" if dispatched else "cancels_while_queued"] += 1
        caller.cancelled_by_harness = True
        task.cancel()

    async def _load(self, until: float) -> None:
        loop = asyncio.get_running_loop()
        seg, rng = self.segment, self.rng
        next_at = loop.time()
        next_burst = next_at + rng.expovariate(self.mix.bursts_per_s)
        hang_at = next_at + rng.uniform(0.3, 0.8) * seg.duration_s if seg.hang else None
        while True:
            now = loop.time()
            if now >= until:
                return
            while next_at <= now:
                self._new_caller()
                next_at += rng.expovariate(seg.rate_per_s)
            if next_burst <= now:
                self._burst()
                next_burst = now + rng.expovariate(self.mix.bursts_per_s)
            if hang_at is not None and hang_at <= now:
                self._spawn(Item(next(self.tokens), "hang"), None)
                self.hang_planted = True
                hang_at = None
            await asyncio.sleep(max(0.0, min(next_at, until) - loop.time()))

    def _burst(self) -> None:
        bound = self.segment.max_queue_size or 64
        size = bound + self.rng.randint(8, 96)
        self.faults["bursts"] += 1
        self.faults["burst_requests"] += size
        for _ in range(size):
            self._new_caller()

    # -- run-time changes ------------------------------------------------------------------------

    async def _monkey(self, until: float) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.rng.expovariate(self.mix.changes_per_s))
            if loop.time() >= until or self.batcher.closed:
                return
            self._change()

    def _change(self) -> None:
        rng, seg, batcher = self.rng, self.segment, self.batcher
        what = rng.choice(("limits", "limits", "slo", "policy", "oom", "oom"))
        self.faults[f"changes_{what}"] += 1
        if what == "limits":
            change: dict[str, Any] = {}
            if rng.random() < 0.6:
                change["window_ms"] = rng.choice((0.0, 0.5, 1.0, 3.0, 8.0))
            if rng.random() < 0.6:
                change["max_batch_size"] = rng.randint(1, seg.max_batch_size)
            if rng.random() < 0.4:
                change["max_concurrent_batches"] = rng.randint(1, 4)
            batcher.set_limits(**change)
        elif what == "slo":
            keep = rng.random() < 0.8 or seg.shed_late  # shedding needs an SLO (None refused)
            batcher.set_slo(SLO(latency_ms=rng.choice((5.0, 20.0, 80.0))) if keep else None)
        elif what == "policy":
            batcher.set_policy(_random_policy(rng) if rng.random() < 0.8 else None)
        elif not seg.streaming:  # free memory changes: calls above the limit raise MemoryError
            self.model.oom_limit = (
                rng.randint(1, max(1, seg.max_batch_size // 2)) if rng.random() < 0.7 else 1 << 30
            )

    # -- close -----------------------------------------------------------------------------------

    async def _close(self) -> None:
        mode, batcher, rng = self.segment.close, self.batcher, self.rng
        self.faults[f"close_{mode}"] += 1
        if mode == "drain":
            await batcher.aclose()
        elif mode == "nodrain":
            await batcher.aclose(drain=False)
        elif mode == "drain_timeout":
            await batcher.aclose(timeout_s=rng.uniform(0.02, 0.3))
        elif mode == "nodrain_timeout":
            await batcher.aclose(drain=False, timeout_s=rng.uniform(0.02, 0.3))
        elif mode == "zero_timeout":
            await batcher.aclose(timeout_s=0)
        else:  # escalate: a draining close, then one that drops the queue and has a time limit
            first = asyncio.ensure_future(batcher.aclose(timeout_s=5.0))
            await asyncio.sleep(rng.uniform(0.0, 0.02))
            await batcher.aclose(drain=False, timeout_s=rng.uniform(0.02, 0.2))
            await first

    # -- the segment -------------------------------------------------------------------------------

    async def run(self) -> SegmentReport:
        loop = asyncio.get_running_loop()
        end = loop.time() + self.segment.duration_s
        load = asyncio.ensure_future(self._load(end + CLOSE_OVERLAP_S))
        monkey = asyncio.ensure_future(self._monkey(end))
        await asyncio.sleep(self.segment.duration_s)
        safety = None
        if self.stuck is not None:  # with the old close (a join), the loop would freeze for good
            safety = threading.Timer(STUCK_SAFETY_S, self.stuck.release.set)
            safety.start()
        await self._close()
        if self.stuck is not None and safety is not None:
            safety.cancel()
            if self.stuck.stuck.is_set():
                self.faults["closes_with_stuck_telemetry"] += 1
            if self.stuck.release.is_set():
                self._violation("the close waited for the stuck telemetry reading")
            self.stuck.release.set()
        await asyncio.gather(load, monkey)
        self.model.release.set()
        if self.tasks:
            await asyncio.wait(self.tasks, timeout=SETTLE_LIMIT_S)
        await self._wind_down()
        self._check()
        for task in self.tasks:  # only after a violation: do not leak it into the next segment
            task.cancel()
        self.faults.update(self.model.faults)
        return self.report

    async def _wind_down(self) -> None:
        """Give cancelled batch tasks a few loop turns (aclose returns without waiting)."""
        me = asyncio.current_task()
        for _ in range(100):
            if not [t for t in asyncio.all_tasks() if t is not me]:
                return
            await asyncio.sleep(0.01)

    # -- checks ----------------------------------------------------------------------------------

    def _violation(self, text: str) -> None:
        self.report.violations.append(f"segment {self.segment.index} ({self.segment}): {text}")

    def _check(self) -> None:
        tally: Counter[str] = self.report.outcomes
        for caller in self.callers:
            tally[self._classify(caller)] += 1
        stats = self.batcher.stats()
        counts = self.report.counts = stats.counts
        self._check_counts(counts, tally)
        if stats.queue_depth or stats.in_flight_batches:
            self._violation(
                f"engine not idle: queue {stats.queue_depth}, in flight {stats.in_flight_batches}"
            )
        me = asyncio.current_task()
        left = [t for t in asyncio.all_tasks() if t is not me]
        if left:
            self._violation(f"{len(left)} tasks left: {[t.get_coro() for t in left][:5]}")

    def _check_counts(self, counts: Counts, tally: Counter[str]) -> None:
        started = sum(caller.started for caller in self.callers)
        ended = (
            counts.completed + counts.failed + counts.rejected + counts.expired + counts.cancelled
        )
        if not counts.submitted == ended == started:
            self._violation(f"counts do not add up: started {started}, {counts}")
        cancelled_seen = tally["cancelled"]
        slack = {
            "completed": counts.completed - tally["ok"],
            "failed": counts.failed
            - tally["slot_error"]
            - tally["batch_failed_poison"]
            - tally["batch_failed_transient"]
            - tally["result_count"]
            - tally["closed_while_running"],
            "rejected": counts.rejected
            - tally["queue_full"]
            - tally["too_large"]
            - tally["closed_at_submit"]
            - tally["closed_before_running"],
            "expired": counts.expired - tally["expired"],
        }
        # a cancelled caller is counted where its request ended: cancelled, or (cancelled after
        # its answer was set) under that answer's count
        if min(slack.values()) < 0 or sum(slack.values()) + counts.cancelled != cancelled_seen:
            self._violation(
                f"counts disagree with the callers: slack {slack}, cancelled {counts.cancelled}, "
                f"callers cancelled {cancelled_seen}, tally {dict(tally)}"
            )

    def _classify(self, caller: Caller) -> str:
        """The outcome's category; a violation is recorded for an outcome the caller cannot get."""
        item, outcome = caller.item, caller.outcome
        if not caller.started:
            self._violation(f"caller {item.token} never started")
            return "never_started"
        if caller.settlements != 1:
            self._violation(f"caller {item.token} settled {caller.settlements} times")
        category, allowed = self._category(caller, outcome)
        if not allowed:
            self._violation(
                f"caller {item.token} ({item.kind}, deadline {caller.deadline_ms}, cancelled "
                f"{caller.cancelled_by_harness}) got {outcome!r} ({category})"
            )
        return category

    def _category(self, caller: Caller, outcome: Any) -> tuple[str, bool]:
        item, seg = caller.item, self.segment
        if outcome is _UNSET:
            return "unsettled", False
        if caller.streams and not self._stream_prefix(caller, isinstance(outcome, StreamDone)):
            return "stream_elements_wrong", False
        if isinstance(outcome, StreamDone):
            return "ok", item.kind == "ok"
        if isinstance(outcome, Echo):
            return "ok", item.kind == "ok" and outcome.token == item.token
        if isinstance(outcome, list):  # submit() on a streaming model: all its elements
            own = [e for e in outcome if isinstance(e, Echo) and e.token == item.token]
            return "ok", item.kind == "ok" and len(own) == len(outcome) == STREAM_STEPS
        if isinstance(outcome, SlotError):
            return "slot_error", item.kind == "slot" and outcome.token == item.token
        if isinstance(outcome, asyncio.CancelledError):
            return "cancelled", caller.cancelled_by_harness
        if isinstance(outcome, BatchFailedError):
            return self._batch_failure(item, outcome.cause)
        if isinstance(outcome, ResultCountError):
            return "result_count", item.kind == "short" or not seg.bisect
        if isinstance(outcome, DeadlineExceededError):
            return "expired", caller.deadline_ms is not None or seg.shed_late
        if isinstance(outcome, ItemTooLargeError):
            return "too_large", seg.sized and item.size > seg.max_batch_size
        if isinstance(outcome, QueueFullError):
            return "queue_full", seg.max_queue_size is not None
        if isinstance(outcome, BatcherClosedError):
            return _closed_category(str(outcome))
        return f"unexpected_{type(outcome).__name__}", False

    def _stream_prefix(self, caller: Caller, ended: bool) -> bool:
        """True when the stream's readers took its own elements, in order: all
        ``STREAM_STEPS`` at a normal end, a prefix of them before an error or a
        cancellation."""
        elements = caller.elements
        own = all(isinstance(e, Echo) and e.token == caller.item.token for e in elements)
        return own and (len(elements) == STREAM_STEPS if ended else len(elements) <= STREAM_STEPS)

    def _batch_failure(self, item: Item, cause: BaseException) -> tuple[str, bool]:
        if isinstance(cause, PoisonError):
            isolated = item.kind == "poison" or not self.segment.bisect
            return "batch_failed_poison", item.token in cause.tokens and isolated
        if isinstance(cause, TransientError):
            return "batch_failed_transient", item.token in cause.tokens
        return f"batch_failed_{type(cause).__name__}", False


def _closed_category(message: str) -> tuple[str, bool]:
    known = {
        "batcher is closed": "closed_at_submit",
        "batcher closed before this ran": "closed_before_running",
        "batcher closed while this ran": "closed_while_running",
    }
    category = known.get(message)
    return (category, True) if category else (f"closed_other: {message}", False)


# -- a seeded run ----------------------------------------------------------------------------------


@dataclass
class ChaosReport:
    """Everything one seed did, summed over its segments."""

    seed: int
    mix: FaultMix
    segments: list[SegmentReport] = field(default_factory=list)
    outcomes: Counter[str] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)
    configs: Counter[str] = field(default_factory=Counter)
    events: Counter[str] = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)

    @property
    def submitted(self) -> int:
        return sum(r.counts.submitted for r in self.segments if r.counts is not None)

    @property
    def lost(self) -> int:
        """Callers that never got an outcome, or got one they could not get."""
        bad = ("unsettled", "never_started", "stream_elements_wrong")
        return sum(self.outcomes[name] for name in bad) + sum(
            n
            for name, n in self.outcomes.items()
            if name.startswith(("unexpected_", "closed_other"))
        )

    def add(self, segment_report: SegmentReport) -> None:
        self.segments.append(segment_report)
        self.outcomes.update(segment_report.outcomes)
        self.faults.update(segment_report.faults)
        seg = segment_report.segment
        self.configs.update(
            {
                f"executor_{seg.executor}": 1,
                f"control_{seg.control}": 1,
                f"bisect_{seg.bisect}": 1,
                f"buckets_{seg.buckets is not None}": 1,
                f"bounded_queue_{seg.max_queue_size is not None}": 1,
                f"telemetry_{seg.telemetry}": 1,
                f"sized_{seg.sized}": 1,
                f"shed_late_{seg.shed_late}": 1,
                f"hang_segment_{seg.hang}": 1,
                f"streaming_{seg.streaming}": 1,
                f"stuck_telemetry_{seg.stuck_telemetry}": 1,
                f"listener_{seg.listener}": 1,
            }
        )
        self.violations.extend(segment_report.violations)


def run_chaos(
    seed: int, total_s: float, segment_s: tuple[float, float] = (2.0, 5.0)
) -> ChaosReport:
    """Run segments for ``total_s`` seconds of real time on a new event loop."""
    rng = random.Random(seed)
    mix = FaultMix.draw(rng)
    report = ChaosReport(seed, mix)
    threads_before = set(threading.enumerate())
    loop_errors: list[dict[str, Any]] = []
    loop = asyncio.new_event_loop()
    loop.set_exception_handler(lambda _, context: loop_errors.append(context))
    tokens = iter(range(1, 1 << 62))
    try:
        with counting_events() as events:
            left, index = total_s, 0
            while left > 0.5:
                duration = min(left, rng.uniform(*segment_s))
                segment = Segment.draw(index, rng, mix, duration, FORCED[index % len(FORCED)])
                run = SegmentRun(segment, rng, mix, tokens)
                report.add(loop.run_until_complete(run.run()))
                left -= duration
                index += 1
            report.events.update({f"{lvl}:{name}": n for (lvl, name), n in events.counts.items()})
            report.violations.extend(
                f"error event {e}" for e in events.errors(allowed=EXPECTED_ERRORS)
            )
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
    report.violations.extend(f"loop error: {_describe_context(c)}" for c in loop_errors)
    left_threads = _threads_left(threads_before, THREAD_EXIT_LIMIT_S)
    if left_threads:
        report.violations.append(f"threads left: {[t.name for t in left_threads]}")
    return report


def _describe_context(context: dict[str, Any]) -> str:
    return f"{context.get('message')}: {context.get('exception')!r}"


def _threads_left(before: set[threading.Thread], limit_s: float) -> list[threading.Thread]:
    deadline = time.monotonic() + limit_s
    while True:
        left = [t for t in threading.enumerate() if t not in before and t.is_alive()]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.02)


def table(rows: list[tuple[str, Any]], header: tuple[str, str]) -> list[str]:
    """A two-column markdown table."""
    lines = [f"| {header[0]} | {header[1]} |", "|---|---|"]
    lines += [f"| {name} | {value} |" for name, value in rows]
    return lines


def summary_lines(report: ChaosReport) -> list[str]:
    """The seed's fault mix, configurations, faults injected and outcomes, as markdown tables."""
    mix = [(k, f"{v:.4g}") for k, v in vars(report.mix).items()]
    lines = [f"### chaos seed {report.seed}: {len(report.segments)} segments", ""]
    sections = [
        (mix, ("fault rate", "value")),
        (sorted(report.configs.items()), ("segments by setting", "count")),
        (sorted(report.faults.items()), ("fault or event injected", "count")),
        (sorted(report.outcomes.items()), ("caller outcome", "count")),
        (sorted(report.events.items()), ("library log event", "count")),
    ]
    for rows, header in sections:
        lines += [*table(rows, header), ""]
    lines.append(f"lost requests: {report.lost} of {report.submitted}")
    lines.append(f"violations: {len(report.violations)}")
    return lines


def flat_info(report: ChaosReport) -> dict[str, Any]:
    """``extra_info`` for pytest-benchmark: flat name -> number."""
    info: dict[str, Any] = {"seed": report.seed, "segments": len(report.segments)}
    info["submitted"] = report.submitted
    info.update({f"mix_{k}": v for k, v in vars(report.mix).items()})
    info.update({f"config_{k}": v for k, v in report.configs.items()})
    info.update({f"fault_{k}": v for k, v in report.faults.items()})
    info.update({f"outcome_{k}": v for k, v in report.outcomes.items()})
    info["lost"] = report.lost
    info["violations"] = len(report.violations)
    return info

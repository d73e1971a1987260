"""The admission gate in front of a real engine: an asyncio shell over
:class:`~adaptive_batcher.llm.core.GateCore`.

:meth:`LLMGate.submit` registers a request's arrival and returns its :class:`GateStream`; the
stream waits in the gate's queue, is forwarded to the engine when the gate admits it, and
hands the engine's chunks to its caller unchanged. What the shell sees of each stream feeds
the controller: the first chunk with tokens (``first_token``), every later token (``tokens``,
a chunk of ``n`` tokens counting as ``n`` tokens ``gap / n`` apart), the end (``finish`` with
the usage's completion tokens, else the tokens counted), an engine error (``fail``) and the
caller going away (``cancel``, which also aborts the request upstream).

Per admitted request one task iterates the engine's stream (so the gate times the engine, not
the reader, and can abort it at any moment by cancelling that task and closing the iterator);
one loop timer carries out the core's :class:`~adaptive_batcher.core.engine.SetTimer` and, while
requests are in the gate, polls it every controller interval so that the controller ticks. The
clock is ``time.monotonic`` (not ``loop.time()``: uvloop's is quantized to milliseconds).

Every request ends exactly once, and its caller learns how: its chunks then the end, or one
typed error (:mod:`adaptive_batcher.llm.errors`: a refusal at once, ``RequestFailedError``;
``DeadlineExceededError``; ``BatcherClosedError``). ``stats().counts`` add up at every moment.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Final, cast

from adaptive_batcher._log import get_logger
from adaptive_batcher._validate import (
    check_bool,
    check_callable,
    check_int,
    check_number,
    check_optional_int,
    check_real,
    check_str,
)
from adaptive_batcher.core.engine import SetTimer
from adaptive_batcher.errors import (
    BatcherClosedError,
    BatcherError,
    DeadlineExceededError,
    EventLoopError,
    StreamBufferFullError,
    describe,
)
from adaptive_batcher.gateway.stats import GateTimings, LLMGateStats, tpot_s
from adaptive_batcher.gateway.stream import OUTCOMES, GateStream
from adaptive_batcher.gateway.types import Chunk, Engine, EngineTelemetry, LLMRequest
from adaptive_batcher.llm.controller import TokenController
from adaptive_batcher.llm.core import GateCore
from adaptive_batcher.llm.errors import (
    GateQueueFullError,
    RequestFailedError,
    TTFTUnreachableError,
)
from adaptive_batcher.llm.gate import (
    Abort,
    Admit,
    Expire,
    GateAction,
    Reject,
    RequestState,
)
from adaptive_batcher.llm.laws import ModelLimit
from adaptive_batcher.llm.signals import EngineMetrics
from adaptive_batcher.llm.slo import TokenSLO

__all__ = ["OUTCOMES", "GateStream", "LLMGate"]

_log = get_logger()

_OUTCOME_OF_STATE: Final = {
    RequestState.COMPLETED: "completed",
    RequestState.REJECTED: "rejected",
    RequestState.EXPIRED: "expired",
    RequestState.FAILED: "failed",
    RequestState.CANCELLED: "cancelled",
}

_EARLY_S: Final = 1e-3
"""A timer that fires at most this early counts as on time (uvloop rounds to milliseconds)."""


def _reason(error: BatcherError) -> str:
    if isinstance(error, TTFTUnreachableError):
        return "ttft_unreachable"
    if isinstance(error, GateQueueFullError):
        return "queue_full"
    return "closed"


def _check_request(request: object) -> None:
    if not isinstance(request, LLMRequest):
        raise TypeError(f"request must be an LLMRequest, got {type(request).__name__}")
    if type(request.prompt_tokens) is not int or request.prompt_tokens < 0:
        check_int("request.prompt_tokens", request.prompt_tokens, 0)
    if request.max_tokens is not None:
        check_int("request.max_tokens", request.max_tokens, 1)
    if request.timeout_s is not None:
        check_number("request.timeout_s", request.timeout_s, 0.0, strict=True)


class LLMGate:
    """Admission control in front of a continuous-batching engine, on the running event loop.

    Args:
        engine: where admitted requests go (an :class:`~adaptive_batcher.gateway.types.Engine`:
            the HTTP adapter, :class:`~adaptive_batcher.gateway.in_process.InProcessEngine`).
            The gate closes it in :meth:`aclose`.
        slo: the objective (TTFT counts from :meth:`submit`).
        controller: the controller (its ``slo`` must be ``slo``); None: ours,
            ``TokenController(slo, ModelLimit(slo, maximum=max_in_flight),
            initial_limit=initial_limit or max_in_flight, max_limit=max_in_flight,
            max_queue=max_queue, pace_prefill=pace_prefill)``.
        telemetry: a source of the engine's metrics, read every ``telemetry.interval_s`` in a
            background task (its failures are logged and never reach a request), or None.
            The gate closes it in :meth:`aclose`.
        max_in_flight: the highest in-flight limit of the default controller (>= 1).
        initial_limit: the default controller's limit before its first decisions (>= 1,
            at most ``max_in_flight``), or None: ``max_in_flight``. A lower start keeps a
            burst at start-up from flooding the engine before the first requests finish (the
            controller then raises it as it learns); refused with a ``controller`` of your own.
        max_queue: the default controller's bounded queue (>= 0), or None: unbounded.
        pace_prefill: the default controller's prefill pacing (False: admit into free slots
            at once); refused False with a ``controller`` of your own.
        name: the gate's name in logs and metrics.
        abort_timeout_s: the longest wait for an adapter to abort a request or to close
            (> 0), seconds: a stuck adapter cannot hang a caller or :meth:`aclose`.
        max_buffered_chunks: the most chunks a stream may hold unread (>= 1), or None: no
            bound. One more fails the stream with
            :class:`~adaptive_batcher.errors.StreamBufferFullError` (its caller reads the
            chunks it holds first), aborts it upstream and frees its slot: a reader that stopped
            reading neither grows the gate's memory nor keeps an engine slot.
        clock: the clock, seconds (default ``time.monotonic``; a virtual clock for tests).

    Raises:
        TypeError, ValueError: an argument of the wrong type or out of range (named).
    """

    def __init__(
        self,
        engine: Engine,
        slo: TokenSLO,
        *,
        controller: TokenController | None = None,
        telemetry: EngineTelemetry | None = None,
        max_in_flight: int = 256,
        initial_limit: int | None = None,
        max_queue: int | None = None,
        pace_prefill: bool = True,
        name: str = "llm",
        abort_timeout_s: float = 5.0,
        max_buffered_chunks: int | None = 8192,
        clock: Callable[[], float] | None = None,
    ) -> None:
        if not isinstance(engine, Engine):
            raise TypeError(
                f"engine must be an Engine (stream(request), aclose()), got {type(engine).__name__}"
            )
        if not isinstance(slo, TokenSLO):
            raise TypeError(f"slo must be a TokenSLO, got {type(slo).__name__}")
        if telemetry is not None:
            if not isinstance(telemetry, EngineTelemetry):
                raise TypeError(
                    "telemetry must be an EngineTelemetry (interval_s, read(), aclose()) or "
                    f"None, got {type(telemetry).__name__}"
                )
            check_number("telemetry.interval_s", telemetry.interval_s, 0.0, strict=True)
        max_in_flight = check_int("max_in_flight", max_in_flight, 1)
        initial_limit = check_optional_int("initial_limit", initial_limit, 1)
        if initial_limit is not None and initial_limit > max_in_flight:
            raise ValueError(
                f"initial_limit must be at most max_in_flight ({max_in_flight}), got "
                f"{initial_limit}"
            )
        max_queue = check_optional_int("max_queue", max_queue, 0)
        self.max_buffered_chunks = check_optional_int("max_buffered_chunks", max_buffered_chunks, 1)
        if controller is None:
            controller = TokenController(
                slo,
                ModelLimit(slo, maximum=max_in_flight),
                initial_limit=initial_limit or max_in_flight,
                max_limit=max_in_flight,
                max_queue=max_queue,
                pace_prefill=check_bool("pace_prefill", pace_prefill),
            )
        elif initial_limit is not None:
            raise ValueError("initial_limit is the default controller's: give it to yours")
        elif pace_prefill is not True:
            raise ValueError("pace_prefill is the default controller's: give it to yours")
        elif not isinstance(controller, TokenController):
            raise TypeError(
                f"controller must be a TokenController or None, got {type(controller).__name__}"
            )
        elif controller.slo != slo:
            raise ValueError(f"controller.slo must be slo, got {controller.slo!r}")
        self._name = check_str("name", name)
        self.abort_timeout_s = check_number("abort_timeout_s", abort_timeout_s, 0.0, strict=True)
        self._clock: Callable[[], float] = (
            time.monotonic if clock is None else check_callable("clock", clock)
        )
        self._engine = engine
        self._slo = slo
        self._controller = controller
        self._telemetry = telemetry
        self._core: GateCore[GateStream] = GateCore(controller)
        self._timings = GateTimings()
        self._engine_metrics: EngineMetrics | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        self._running: dict[GateStream, None] = {}  # admitted, not ended (insertion order)
        self._tasks: set[asyncio.Task[None]] = set()  # engine streams (and stuck aborts)
        self._telemetry_task: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._next_poll_s = -math.inf
        self._depth = 0  # nesting of _carry_out (the timer is set by the outermost)
        self._idle: asyncio.Future[None] | None = None  # a close waiting for the gate to empty
        self._release: asyncio.Task[None] | None = None

    # -- read-only settings ----------------------------------------------------------------

    @property
    def name(self) -> str:
        """The gate's name (log field and exporter label ``gate``)."""
        return self._name

    @property
    def slo(self) -> TokenSLO:
        """The objective."""
        return self._slo

    @property
    def controller(self) -> TokenController:
        """The controller."""
        return self._controller

    @property
    def closed(self) -> bool:
        """True once :meth:`aclose` began."""
        return self._closed

    # -- life cycle ------------------------------------------------------------------------

    async def start(self) -> None:
        """Bind the running event loop and start the telemetry task. Idempotent; the first
        :meth:`submit` does it too.

        Raises:
            BatcherClosedError: the gate is closed.
            EventLoopError: the gate runs on another event loop (a ``RuntimeError``).
        """
        if self._closed:
            raise BatcherClosedError("the gate is closed")
        self._bind()

    async def aclose(self, *, drain: bool = True, timeout_s: float | None = None) -> None:
        """Stop taking requests, end every pending one, then close the telemetry source and
        the engine.

        Args:
            drain: True: waiting requests are still admitted as slots free and running ones
                stream on, for at most ``timeout_s``; then the waiting are refused and the
                running fail, both with ``BatcherClosedError``, and are aborted upstream.
                False: at once.
            timeout_s: the longest drain, seconds (>= 0; None or ``math.inf``: no limit).

        A later call with ``drain=False`` cuts short a draining one. Requests submitted after
        the close began are refused with ``BatcherClosedError``.

        Raises:
            TypeError: ``drain`` not a bool, ``timeout_s`` not a number.
            ValueError: a negative or NaN ``timeout_s``.
        """
        drain = check_bool("drain", drain)
        if timeout_s is not None and check_real("timeout_s", timeout_s) == math.inf:
            timeout_s = None
        if timeout_s is not None:
            timeout_s = check_number("timeout_s", timeout_s, 0.0)
        first = not self._closed
        self._closed = True
        now = self._clock()
        core = self._core
        if first or not drain:
            gate = core.gate
            _log.info(
                "llm_gate.closing",
                gate=self._name,
                drain=drain,
                waiting=gate.waiting,
                in_flight=gate.in_flight,
            )
        self._carry_out(core.close(now, drain=drain), now)
        if not drain or not await self._empties_within(timeout_s):
            self._cut_off()
        if self._release is None:
            self._release = asyncio.ensure_future(self._release_all())
        await asyncio.wait({self._release})

    async def __aenter__(self) -> LLMGate:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose(drain=True)

    # -- requests --------------------------------------------------------------------------

    def submit(self, request: LLMRequest) -> GateStream:
        """Register ``request``'s arrival now (its TTFT counts from here) and return its stream.

        A refusal is decided here: the stream's :meth:`~GateStream.admitted` (and first
        :meth:`~GateStream.__anext__`) raise it without waiting. Call it from the event loop
        the gate runs on (the first call binds it).

        Raises:
            TypeError, ValueError: ``request`` is not an
                :class:`~adaptive_batcher.gateway.types.LLMRequest`, or a field of it is out of
                range (named: ``request.prompt_tokens`` >= 0, ``request.max_tokens`` >= 1 or
                None, ``request.timeout_s`` > 0 or None).
            RuntimeError: no running event loop, or another loop than the gate's.
        """
        _check_request(request)
        if not self._closed:
            self._bind()
        stream = GateStream(self, request)
        now = self._clock()
        deadline = None if request.timeout_s is None else now + request.timeout_s
        handle, actions = self._core.arrive(
            stream,
            now,
            request.prompt_tokens,
            max_tokens=request.max_tokens,
            deadline_s=deadline,
        )
        stream._handle = handle
        self._carry_out(actions, now)
        return stream

    def poll(self) -> None:
        """Carry out what is due now: expiries, deadlines, a controller tick. The gate's
        timer does this by itself; a caller with a virtual ``clock`` calls it after moving
        the clock."""
        now = self._clock()
        self._carry_out(self._core.poll(now), now)

    def record_engine_metrics(self, metrics: EngineMetrics) -> None:
        """A reading of the engine's metrics (the telemetry task calls this; so may a caller
        that scrapes the engine itself).

        Raises:
            TypeError: ``metrics`` is not an :class:`~adaptive_batcher.llm.signals.EngineMetrics`.
        """
        if not isinstance(metrics, EngineMetrics):
            raise TypeError(f"metrics must be an EngineMetrics, got {type(metrics).__name__}")
        self._core.engine_metrics(self._clock(), metrics)
        self._engine_metrics = metrics

    def stats(self) -> LLMGateStats:
        """A frozen snapshot now (safe to call from another thread, e.g. a metrics scrape)."""
        now = self._clock()
        core = self._core
        gate = core.gate
        timings = self._timings
        return LLMGateStats(
            name=self._name,
            slo=self._slo,
            counts=core.counts(),
            limit=gate.limits.max_in_flight,
            waiting=gate.waiting,
            in_flight=gate.in_flight,
            ttft=timings.ttft.quantiles(now),
            tpot=timings.tpot.quantiles(now),
            queue_wait=timings.queue_wait.quantiles(now),
            rejected_by_reason=timings.rejected_by_reason(),
            decision=self._controller.decision,
            engine=self._engine_metrics,
            closed=self._closed,
            ttft_histogram=timings.ttft.cumulative.snapshot(),
            tpot_histogram=timings.tpot.cumulative.snapshot(),
            queue_wait_histogram=timings.queue_wait.cumulative.snapshot(),
        )

    # -- carrying out the core's actions -----------------------------------------------------

    def _bind(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is loop:
            return
        if self._loop is not None:
            raise EventLoopError(f"the gate {self._name!r} runs on another event loop")
        self._loop = loop
        self._next_poll_s = self._clock() + self._controller.interval_s
        if self._telemetry is not None:
            self._telemetry_task = loop.create_task(self._read_telemetry(self._telemetry))
        _log.info("llm_gate.started", gate=self._name, telemetry=self._telemetry is not None)

    def _carry_out(self, actions: list[GateAction], now: float) -> None:
        self._depth += 1
        try:
            for action in actions:
                kind = type(action)
                if kind is SetTimer:
                    continue  # the outermost call sets the timer from the gate's state
                stream: GateStream = action.request.handle  # type: ignore[union-attr]
                if kind is Admit:
                    self._admit(stream, now)
                elif kind is Reject:
                    error = cast(Reject[GateStream], action).error
                    reason = _reason(error)
                    self._timings.record_reject(reason)
                    _log.debug("llm_gate.rejected", gate=self._name, reason=reason)
                    self._settle(stream, "rejected", error)
                elif kind is Expire:
                    expired = DeadlineExceededError(
                        "the request waited past its deadline, or too long for its first "
                        "token to meet the SLO"
                    )
                    self._settle(stream, "expired", expired)
                elif kind is Abort:
                    aborted = cast(Abort[GateStream], action).error
                    self._running.pop(stream, None)
                    self._settle(stream, "cancelled" if aborted is None else "expired", aborted)
                    self._stop_engine_stream(stream)
        finally:
            self._depth -= 1
        if self._depth == 0:
            self._set_timer()
            self._note_idle()

    def _admit(self, stream: GateStream, now: float) -> None:
        stream._admitted = True
        handle = stream._handle
        assert handle is not None  # set by submit before it carries out the arrival's actions
        self._timings.queue_wait.record(now - handle.arrival_s, now)
        self._running[stream] = None
        loop = self._loop
        assert loop is not None  # admissions happen in calls made on the bound loop
        task = loop.create_task(self._run(stream))
        stream._task = task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        stream._wake()

    def _settle(self, stream: GateStream, outcome: str, error: BaseException | None) -> None:
        """End ``stream`` with ``outcome`` (and ``error`` for its caller); once only."""
        if stream._outcome is not None:
            return
        stream._outcome = outcome
        if error is not None:
            stream._error = error
        elif outcome == "completed":
            stream._finished = True
        stream._wake()

    def _cancel(self, stream: GateStream) -> None:
        """The caller of ``stream`` is gone (its aclose, or its task cancelled)."""
        if stream._closed:
            return
        stream._closed = True
        stream._chunks.clear()
        handle = stream._handle
        if handle is None or handle.ended:
            return
        now = self._clock()
        self._carry_out(self._core.cancel(handle, now), now)  # an Abort if it was running
        self._settle(stream, "cancelled", None)  # it was waiting: it left the queue

    def _stop_engine_stream(self, stream: GateStream) -> None:
        task = stream._task
        if task is not None and not task.done():
            task.cancel()

    async def _wait_for_abort(self, task: asyncio.Task[None]) -> None:
        done, _ = await asyncio.wait({task}, timeout=self.abort_timeout_s)
        if not done:
            _log.warning(
                "llm_gate.abort_stuck", gate=self._name, abort_timeout_s=self.abort_timeout_s
            )

    # -- one engine stream -----------------------------------------------------------------

    async def _run(self, stream: GateStream) -> None:
        """Iterate the engine's stream for ``stream``; cancelled to abort it."""
        iterator: AsyncIterator[Chunk] | None = None
        try:
            iterator = self._engine.stream(stream.request)
            async for chunk in iterator:
                if not self._on_chunk(stream, chunk):
                    break
            else:
                self._on_end(stream)
        except asyncio.CancelledError:
            closed = BatcherClosedError("the engine stream's task was cancelled")
            self._fail(stream, closed)  # nothing if the gate aborted it
            raise
        except BaseException as exc:
            self._fail(stream, RequestFailedError(exc))
            if not isinstance(exc, Exception):  # KeyboardInterrupt, SystemExit: leave the loop
                raise
        finally:
            if iterator is not None:
                await self._close_iterator(iterator)

    async def _close_iterator(self, iterator: Any) -> None:
        close = getattr(iterator, "aclose", None)
        if close is None:
            return
        try:
            await close()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            error = describe(exc)
            _log.warning("llm_gate.engine_stream_close_failed", gate=self._name, error=error)

    def _on_chunk(self, stream: GateStream, chunk: object) -> bool:
        """A chunk of ``stream`` arrived: time it and hand it to the caller; False when the
        request has ended meanwhile."""
        handle = stream._handle
        if handle is None or handle.state != RequestState.RUNNING:
            return False
        if not isinstance(chunk, Chunk):
            raise TypeError(f"the engine's stream yielded a {type(chunk).__name__}, not a Chunk")
        tokens = chunk.tokens
        if type(tokens) is not int or tokens < 0:
            raise ValueError(f"Chunk.tokens must be an int >= 0, got {tokens!r}")
        if tokens:
            now = self._clock()
            core = self._core
            last = stream._last_token_s
            if last is None:
                stream._first_token_s = now
                core.first_token(handle, now)
                self._timings.ttft.record(now - handle.arrival_s, now)
                if tokens > 1:  # they came with the first: no gap to learn from
                    core.tokens(now, tokens - 1, 0.0)
            else:
                gap = (now - last) / tokens
                for _ in range(tokens):
                    core.tokens(now, 1, gap)
            stream._tokens += tokens
            stream._last_token_s = now
        if chunk.usage is not None:
            stream.usage = chunk.usage
        if not stream._closed:
            stream._chunks.append(chunk)
            stream._wake()
            bound = self.max_buffered_chunks
            if bound is not None and len(stream._chunks) > bound:
                _log.warning("llm_gate.reader_behind", gate=self._name, unread_chunks=bound + 1)
                behind = StreamBufferFullError(f"the reader fell {bound + 1} chunks behind")
                self._fail(stream, behind)
                return False
        return True

    def _on_end(self, stream: GateStream) -> None:
        handle = stream._handle
        if handle is None or handle.state != RequestState.RUNNING:
            return
        now = self._clock()
        usage = stream.usage
        output = stream._tokens if usage is None else usage.completion_tokens
        self._running.pop(stream, None)
        tpot = tpot_s(stream._first_token_s, stream._last_token_s, output)
        if not math.isnan(tpot):
            self._timings.tpot.record(tpot, now)
        actions = self._core.finish(handle, now, output)
        self._settle(stream, "completed", None)
        self._carry_out(actions, now)

    def _fail(self, stream: GateStream, error: BaseException) -> None:
        """``stream`` fails with ``error`` (for its caller) if it still runs."""
        handle = stream._handle
        if handle is None or handle.state != RequestState.RUNNING:
            return
        now = self._clock()
        self._running.pop(stream, None)
        if isinstance(error, RequestFailedError):  # a close's cut-off is logged once, as such
            _log.warning("llm_gate.request_failed", gate=self._name, error=describe(error.cause))
        actions = self._core.fail(handle, now)
        self._settle(stream, "failed", error)
        self._carry_out(actions, now)

    # -- the timer -------------------------------------------------------------------------

    def _set_timer(self) -> None:
        """Arm the loop timer for the core's next wakeup and, while requests are in the gate,
        the next controller interval."""
        if self._loop is None:
            return
        gate = self._core.gate
        at = gate.next_wakeup()
        if gate.waiting or gate.in_flight:
            at = self._next_poll_s if at is None else min(at, self._next_poll_s)
        if at == self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = at
        if at is not None:
            delay = max(0.0, at - self._clock())
            self._timer = self._loop.call_later(delay, self._on_timer)

    def _on_timer(self) -> None:
        at = self._timer_at
        self._timer = None
        self._timer_at = None
        now = self._clock()
        if at is not None and at - now > _EARLY_S:  # early (or a virtual clock): wait on
            self._set_timer()
            return
        if at is not None:
            now = max(now, at)
        if now >= self._next_poll_s:
            self._next_poll_s = now + self._controller.interval_s
        self._carry_out(self._core.poll(now), now)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = None

    # -- telemetry -------------------------------------------------------------------------

    async def _read_telemetry(self, source: EngineTelemetry) -> None:
        """Read ``source`` every ``interval_s`` until cancelled; a failed read is logged."""
        interval = float(source.interval_s)
        while True:
            try:
                metrics = await source.read()
                if metrics is not None:
                    self.record_engine_metrics(metrics)
            except Exception as exc:
                _log.warning("llm_gate.telemetry_failed", gate=self._name, error=describe(exc))
            await asyncio.sleep(interval)

    # -- closing ---------------------------------------------------------------------------

    def _note_idle(self) -> None:
        idle = self._idle
        if idle is not None and not idle.done():
            gate = self._core.gate
            if gate.waiting == 0 and gate.in_flight == 0:
                idle.set_result(None)

    async def _empties_within(self, timeout_s: float | None) -> bool:
        """Wait until no request waits or runs, at most ``timeout_s``; True if so."""
        gate = self._core.gate
        if gate.waiting == 0 and gate.in_flight == 0:
            return True
        if timeout_s == 0:
            return False
        if self._idle is None or self._idle.done():
            self._idle = asyncio.get_running_loop().create_future()
        done, _ = await asyncio.wait({self._idle}, timeout=timeout_s)
        return bool(done)

    def _cut_off(self) -> None:
        """Refuse the waiting and fail the running requests with ``BatcherClosedError``,
        aborting them upstream."""
        now = self._clock()
        self._carry_out(self._core.close(now, drain=False), now)
        running = list(self._running)
        for stream in running:
            self._fail(stream, BatcherClosedError("the gate closed while the request ran"))
            self._stop_engine_stream(stream)
        if running:
            _log.warning("llm_gate.aborted", gate=self._name, failed=len(running))

    async def _release_all(self) -> None:
        """Wait for the engine streams to wind down, then stop the timer and the telemetry
        task and close the telemetry source and the engine (each wait bounded)."""
        bound = self.abort_timeout_s
        tasks = set(self._tasks)
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=bound)
            if pending:
                _log.warning("llm_gate.abort_stuck", gate=self._name, streams=len(pending))
                for task in pending:
                    task.cancel()
        self._cancel_timer()
        reader = self._telemetry_task
        if reader is not None:
            reader.cancel()
            await asyncio.wait({reader}, timeout=bound)
        if self._telemetry is not None:
            await self._bounded_close("telemetry", self._telemetry.aclose)
        await self._bounded_close("engine", self._engine.aclose)
        _log.info("llm_gate.closed", gate=self._name, counts=str(self._core.counts()))

    async def _bounded_close(self, what: str, aclose: Callable[[], Any]) -> None:
        """Await ``aclose()`` for at most ``abort_timeout_s``; its failure is logged."""
        try:
            task = asyncio.ensure_future(aclose())
        except Exception as exc:  # not awaitable, or raised at once
            _log.warning("llm_gate.close_failed", gate=self._name, part=what, error=describe(exc))
            return
        done, _ = await asyncio.wait({task}, timeout=self.abort_timeout_s)
        if not done:
            task.cancel()
            _log.warning("llm_gate.close_stuck", gate=self._name, part=what)
            return
        failure = None if task.cancelled() else task.exception()
        if failure is not None:
            error = describe(failure)
            _log.warning("llm_gate.close_failed", gate=self._name, part=what, error=error)

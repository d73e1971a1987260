"""The sans-IO admission gate in front of a continuous-batching engine: events in, actions out.

The LLM counterpart of :class:`~adaptive_batcher.core.engine.BatchingEngine`. A continuous-batching
engine (vLLM, SGLang, TensorRT-LLM, TGI) forms its own batches every step; what a client can
still decide is *how many* requests are inside the engine, *in what order* they enter, and
*which are refused early*. The gate holds that decision: a waiting queue, an in-flight limit,
an order (FCFS or earliest TTFT deadline first), early rejection of a request whose predicted
time to first token misses, a bounded queue, per-request deadlines and cancellation.

No clock, no I/O, no asyncio: every event carries ``now`` (seconds on the caller's clock) and
returns a list of actions that the shell carries out (an asyncio server forwards an
:class:`Admit` to the engine, answers a :class:`Reject` with 429/503 and ``Retry-After``; the
simulator does the same on a virtual clock). Every list ends with one :class:`SetTimer`.

Every request ends exactly once: completed (its tokens, then done), rejected, expired, failed or
cancelled; :meth:`AdmissionGate.counts` adds up at every moment (submitted = the five endings +
waiting + running).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from dataclasses import dataclass
from typing import Any, Final, Generic, TypeVar

from adaptive_batcher._validate import (
    check_bool,
    check_choice,
    check_finite,
    check_int,
    check_number,
    check_optional_int,
)
from adaptive_batcher.core.engine import SetTimer
from adaptive_batcher.errors import BatcherClosedError, BatcherError, DeadlineExceededError
from adaptive_batcher.llm.errors import GateQueueFullError, TTFTUnreachableError

__all__ = [
    "ORDERS",
    "Abort",
    "AdmissionGate",
    "Admit",
    "Expire",
    "GateAction",
    "GateCounts",
    "GateLimits",
    "GateRequest",
    "Reject",
    "RequestState",
    "SetTimer",
    "TTFTForecast",
]

H = TypeVar("H")

ORDERS: Final = ("fcfs", "edf")
"""Admission orders: first come first served, or earliest TTFT deadline first."""


class RequestState:
    """Integer states of a :class:`GateRequest`: two live ones, five endings."""

    NEW: Final = -1
    WAITING: Final = 0
    RUNNING: Final = 1
    COMPLETED: Final = 2
    REJECTED: Final = 3
    EXPIRED: Final = 4
    FAILED: Final = 5
    CANCELLED: Final = 6

    ENDED: Final = frozenset({2, 3, 4, 5, 6})


class GateRequest(Generic[H]):
    """One request as the gate sees it.

    ``handle`` is opaque (the shell's stream and future, or the simulator's request number).
    Times are on the caller's clock, seconds.

    Args:
        handle: the shell's reference.
        arrival_s: when it reached the gate; TTFT counts from here.
        prompt_tokens: prompt length in tokens (>= 0; from the tokenizer or a usage count), for
            the controller's context estimate.
        max_tokens: the output budget asked for, or None.
        deadline_s: the whole request must end by then, or None: a request still waiting
            then expires, a running one is aborted (:class:`Abort` with a
            :class:`~adaptive_batcher.errors.DeadlineExceededError`).
        ttft_deadline_s: when its first token is due, the key of ``"edf"`` order (default:
            ``arrival_s``, which makes EDF first come first served).

    Raises:
        TypeError, ValueError: a time that is not a finite number, ``prompt_tokens`` not an
            int >= 0, ``max_tokens`` not an int >= 1 or None (named).
    """

    __slots__ = (
        "admit_backlog",
        "admitted_s",
        "arrival_s",
        "deadline_s",
        "expire_s",
        "first_token_s",
        "handle",
        "max_tokens",
        "prompt_tokens",
        "seq",
        "state",
        "ttft_deadline_s",
    )

    def __init__(
        self,
        handle: H,
        arrival_s: float,
        prompt_tokens: int = 0,
        *,
        max_tokens: int | None = None,
        deadline_s: float | None = None,
        ttft_deadline_s: float | None = None,
    ) -> None:
        self.handle = handle
        self.arrival_s = check_finite("arrival_s", arrival_s)
        self.prompt_tokens = check_int("prompt_tokens", prompt_tokens, 0)
        self.max_tokens = check_optional_int("max_tokens", max_tokens, 1)
        self.deadline_s = None if deadline_s is None else check_finite("deadline_s", deadline_s)
        self.ttft_deadline_s = (
            self.arrival_s
            if ttft_deadline_s is None
            else check_finite("ttft_deadline_s", ttft_deadline_s)
        )
        self.expire_s: float | None = None
        self.admitted_s: float | None = None
        self.admit_backlog = (
            0  # prompt tokens in the engine awaiting their first token, at admission
        )
        self.first_token_s: float | None = None
        self.seq = -1
        self.state: int = RequestState.NEW

    @property
    def ended(self) -> bool:
        """Whether the request has ended (one of the five endings)."""
        return self.state in RequestState.ENDED

    def __repr__(self) -> str:
        return (
            f"GateRequest(handle={self.handle!r}, arrival_s={self.arrival_s}, "
            f"prompt_tokens={self.prompt_tokens}, state={self.state})"
        )


@dataclass(frozen=True, slots=True)
class Admit(Generic[H]):
    """Forward ``request`` to the engine now; report its first token, end or failure back."""

    request: GateRequest[H]


@dataclass(frozen=True, slots=True)
class Reject(Generic[H]):
    """Answer ``request`` with ``error`` now; it never reached the engine. ``error`` is a
    :class:`~adaptive_batcher.llm.errors.GateRejectedError` (answer its ``http_status`` with
    ``Retry-After``) or a :class:`~adaptive_batcher.errors.BatcherClosedError`."""

    request: GateRequest[H]
    error: BatcherError


@dataclass(frozen=True, slots=True)
class Expire(Generic[H]):
    """``request`` waited past its deadline or the gate's ``max_wait_s``: fail it with
    :class:`~adaptive_batcher.errors.DeadlineExceededError` now; it never reached the engine."""

    request: GateRequest[H]


@dataclass(frozen=True, slots=True)
class Abort(Generic[H]):
    """``request`` was running and has ended: abort it upstream (close its stream, call the
    engine's abort). ``error`` is None when its caller cancelled it, a
    :class:`~adaptive_batcher.errors.DeadlineExceededError` for the caller when its deadline
    passed. The gate has freed its slot already; later engine output for it is ignored."""

    request: GateRequest[H]
    error: BatcherError | None


GateAction = Admit[Any] | Reject[Any] | Expire[Any] | Abort[Any] | SetTimer


@dataclass(frozen=True, slots=True)
class GateLimits:
    """The gate's knobs; a controller changes them at run time.

    Attributes:
        max_in_flight: most requests inside the engine at once (>= 1).
        max_queue: most requests waiting in front of it (>= 0; 0 refuses whatever finds no
            free slot, a limiter without a queue), or None for unbounded.
        max_wait_s: a request that waited this long expires (>= 0), or None. Applies to the
            requests that arrive while it is in force and find no free slot.
        admit_ttft_s: refuse an arrival whose predicted TTFT exceeds this, seconds (> 0), or
            None (no prediction; needs a :class:`TTFTForecast` to act).
        order: ``"fcfs"`` or ``"edf"`` (earliest ``ttft_deadline_s`` first).
        predict_free: check the TTFT prediction of an arrival that finds a free slot too (its
            wait is 0, its engine part alone can miss: a prompt too long for the TTFT target
            at the present step times); False: such an arrival is admitted, unless the flood
            guard holds.
        flood_ttft_s: the flood guard, seconds (> 0), or None: an arrival that finds a free
            slot is refused when the prefill already admitted (the backlog) would put even an
            empty prompt's first token beyond this (a burst flooded the engine); not while the
            engine's TTFT alone is forecast beyond it.
        prefill_tokens_per_s: prefill pacing, prompt tokens a second (> 0), or None (no
            pacing): a token bucket of this rate and ``prefill_burst_tokens`` depth; a request
            is admitted only while the bucket holds more than 0 tokens and takes its prompt
            from it (the bucket may go below 0 for a long prompt); the others wait, as for a
            slot. It starts full.
        prefill_burst_tokens: the bucket's depth, prompt tokens (> 0); needed with
            ``prefill_tokens_per_s``, None without.

    Raises:
        TypeError, ValueError: a field of the wrong type or out of range (named).
    """

    max_in_flight: int
    max_queue: int | None = None
    max_wait_s: float | None = None
    admit_ttft_s: float | None = None
    order: str = "fcfs"
    predict_free: bool = False
    flood_ttft_s: float | None = None
    prefill_tokens_per_s: float | None = None
    prefill_burst_tokens: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "max_in_flight", check_int("max_in_flight", self.max_in_flight, 1))
        object.__setattr__(self, "max_queue", check_optional_int("max_queue", self.max_queue, 0))
        if self.max_wait_s is not None:
            object.__setattr__(self, "max_wait_s", check_number("max_wait_s", self.max_wait_s, 0.0))
        if self.admit_ttft_s is not None:
            value = check_number("admit_ttft_s", self.admit_ttft_s, 0.0, strict=True)
            object.__setattr__(self, "admit_ttft_s", value)
        check_choice("order", self.order, ORDERS)
        object.__setattr__(self, "predict_free", check_bool("predict_free", self.predict_free))
        if self.flood_ttft_s is not None:
            value = check_number("flood_ttft_s", self.flood_ttft_s, 0.0, strict=True)
            object.__setattr__(self, "flood_ttft_s", value)
        rate, depth = self.prefill_tokens_per_s, self.prefill_burst_tokens
        if (rate is None) != (depth is None):
            raise ValueError(
                "prefill_tokens_per_s and prefill_burst_tokens go together, got "
                f"{rate!r} and {depth!r}"
            )
        if rate is not None and depth is not None:
            rate = check_number("prefill_tokens_per_s", rate, 0.0, strict=True)
            depth = check_number("prefill_burst_tokens", depth, 0.0, strict=True)
            object.__setattr__(self, "prefill_tokens_per_s", rate)
            object.__setattr__(self, "prefill_burst_tokens", depth)


@dataclass(frozen=True, slots=True)
class TTFTForecast:
    """What the gate needs to predict a newcomer's time to first token.

    ``predicted = max(slot_wait + per_prompt_token_s * prefill_backlog, pacing_wait) +
    engine_ttft_s + per_prompt_token_s * prompt_tokens``, with ``slot_wait = max(0, waiting +
    1 - (limit - running)) / departure_rps``: the departures it must wait for before a slot is
    its own (more when a lowered limit is below what runs) and the prefill of the prompts ahead
    of it in the engine (:attr:`AdmissionGate.prefill_backlog`), or, with prefill pacing, the
    time the bucket needs for the prompts waiting ahead and its own first token (the engine
    works the backlog off meanwhile), whichever is longer; then the engine's time from
    admission to first token and its own prefill.

    Attributes:
        departure_rps: requests leaving the engine per second while the limit binds (> 0).
        engine_ttft_s: admission to first token of an empty prompt, seconds (>= 0).
        per_prompt_token_s: seconds more per prompt token to prefill (>= 0).
    """

    departure_rps: float
    engine_ttft_s: float
    per_prompt_token_s: float = 0.0

    def __post_init__(self) -> None:
        rate = check_number("departure_rps", self.departure_rps, 0.0, strict=True)
        object.__setattr__(self, "departure_rps", rate)
        ttft = check_number("engine_ttft_s", self.engine_ttft_s, 0.0)
        object.__setattr__(self, "engine_ttft_s", ttft)
        per_token = check_number("per_prompt_token_s", self.per_prompt_token_s, 0.0)
        object.__setattr__(self, "per_prompt_token_s", per_token)


@dataclass(frozen=True, slots=True)
class GateCounts:
    """Requests by where they are or how they ended; ``submitted`` is always the sum of the
    other seven (``waiting`` and ``running`` live, five endings)."""

    submitted: int
    admitted: int
    waiting: int
    running: int
    completed: int
    rejected: int
    expired: int
    failed: int
    cancelled: int

    @property
    def ended(self) -> int:
        """Requests that have ended, any way."""
        return self.completed + self.rejected + self.expired + self.failed + self.cancelled


class AdmissionGate(Generic[H]):
    """Waiting queue, in-flight limit, order, early rejection, deadlines; sans-IO.

    Args:
        limits: the starting knobs (changeable with :meth:`set_limits`).
        forecast: the starting TTFT forecast, or None (changeable with :meth:`set_forecast`).

    Raises:
        TypeError: ``limits`` is not a :class:`GateLimits`, ``forecast`` not a
            :class:`TTFTForecast` or None.
    """

    def __init__(self, limits: GateLimits, forecast: TTFTForecast | None = None) -> None:
        self._limits = _check_limits(limits)
        self._forecast = _check_forecast(forecast)
        self._fifo: deque[GateRequest[H]] = deque()
        self._edf: list[tuple[float, int, GateRequest[H]]] = []
        self._expiries: list[tuple[float, int, GateRequest[H]]] = []
        self._deadlines: list[tuple[float, int, GateRequest[H]]] = []
        self._seq = itertools.count()
        self._closed = False
        self._draining = False
        self._waiting = 0
        self._running = 0
        self._backlog = 0
        self._waiting_tokens = 0  # prompt tokens of the waiting requests
        self._bucket = math.inf  # prefill pacing: tokens in the bucket at _bucket_s
        self._bucket_s: float | None = None
        self._submitted = 0
        self._admitted = 0
        self._ended = [0, 0, 0, 0, 0]  # completed, rejected, expired, failed, cancelled

    # -- read-only state --------------------------------------------------------------------

    @property
    def limits(self) -> GateLimits:
        """The knobs in force."""
        return self._limits

    @property
    def forecast(self) -> TTFTForecast | None:
        """The TTFT forecast in force, or None."""
        return self._forecast

    @property
    def waiting(self) -> int:
        """Requests waiting in front of the engine."""
        return self._waiting

    @property
    def in_flight(self) -> int:
        """Requests inside the engine (admitted, not ended)."""
        return self._running

    @property
    def prefill_backlog(self) -> int:
        """Prompt tokens of the requests inside the engine that have no first token yet."""
        return self._backlog

    @property
    def waiting_prompt_tokens(self) -> int:
        """Prompt tokens of the waiting requests."""
        return self._waiting_tokens

    @property
    def prefill_bucket_tokens(self) -> float:
        """Prefill pacing's bucket at the last event, prompt tokens (below 0 after a long
        prompt; infinite without pacing)."""
        return self._bucket

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def counts(self) -> GateCounts:
        """The request counts now."""
        completed, rejected, expired, failed, cancelled = self._ended
        return GateCounts(
            self._submitted,
            self._admitted,
            self._waiting,
            self._running,
            completed,
            rejected,
            expired,
            failed,
            cancelled,
        )

    def predicted_ttft_s(self, prompt_tokens: int = 0) -> float | None:
        """The TTFT an arrival with ``prompt_tokens`` would get now, by the forecast (None
        without one)."""
        forecast = self._forecast
        if forecast is None:
            return None
        # departures needed before a slot is its own: those ahead of it, plus the excess in
        # flight when a lowered limit is below what runs
        ahead = self._waiting + 1 - (self._limits.max_in_flight - self._running)
        wait = ahead / forecast.departure_rps if ahead > 0 else 0.0
        backlog_s = forecast.per_prompt_token_s * self._backlog
        # the engine works off the backlog while the pacing holds the request back
        ahead_s = max(wait + backlog_s, self._pacing_wait_s())
        return ahead_s + forecast.engine_ttft_s + forecast.per_prompt_token_s * prompt_tokens

    def next_wakeup(self) -> float | None:
        """When :meth:`poll` must run next (a deadline, an expiry, or prefill pacing's bucket
        refilled for a request that waits with a slot free), or None."""
        _drop_stale(self._expiries, RequestState.WAITING)
        _drop_stale(self._deadlines, RequestState.RUNNING)
        times = [heap[0][0] for heap in (self._expiries, self._deadlines) if heap]
        rate = self._limits.prefill_tokens_per_s
        free = self._running < self._limits.max_in_flight
        admitting = not self._closed or self._draining
        if rate is not None and self._waiting and free and admitting and self._bucket_s is not None:
            if math.isinf(self._bucket):  # pacing began since the last event: a full bucket
                times.append(self._bucket_s)
            else:
                times.append(self._bucket_s + max(1.0 - self._bucket, 0.0) / rate)
        return min(times) if times else None

    # -- knobs -----------------------------------------------------------------------------

    def set_limits(self, limits: GateLimits, now: float | None = None) -> None:
        """New knobs; a raised limit admits at the next event or :meth:`poll`. Changing
        ``order`` re-sorts the queue. With ``now``, prefill pacing's bucket is first filled up
        to ``now`` at the old rate (without it, the time since the last event is filled at
        the new rate).

        Raises:
            TypeError: not a :class:`GateLimits`.
        """
        limits = _check_limits(limits)
        if now is not None:
            self._refill(now)
        if limits.order != self._limits.order:
            live = self._queued_in_order()
            self._fifo.clear()
            self._edf.clear()
            self._limits = limits
            for request in live:
                self._enqueue(request)
        self._limits = limits
        if now is not None:
            self._refill(now)  # pacing just began: a full bucket; ended: none

    def set_forecast(self, forecast: TTFTForecast | None) -> None:
        """A new TTFT forecast (None: no early rejection).

        Raises:
            TypeError: not a :class:`TTFTForecast` or None.
        """
        self._forecast = _check_forecast(forecast)

    # -- events ----------------------------------------------------------------------------

    def arrive(self, request: GateRequest[H], now: float) -> list[GateAction]:
        """A new request: refused at once (:class:`Reject`), admitted (:class:`Admit`) or
        queued. A request that finds a free slot is refused only after :meth:`close`, while
        the flood guard holds (``flood_ttft_s``), or by its own TTFT prediction with
        ``predict_free``.

        Raises:
            ValueError: ``request`` was given to a gate before.
        """
        if request.state != RequestState.NEW:
            raise ValueError(f"request {request.handle!r} was already submitted")
        request.seq = next(self._seq)
        self._submitted += 1
        limits = self._limits
        self._refill(now)
        error = self._refusal(request, limits)
        if error is not None:
            request.state = RequestState.REJECTED
            self._ended[1] += 1
            return [Reject(request, error), *self._settle(now)]
        request.state = RequestState.WAITING
        admitted_now = (
            self._waiting == 0 and self._running < limits.max_in_flight and self._paced_ok()
        )
        if limits.max_wait_s is not None and not admitted_now:  # only a wait can expire
            request.expire_s = request.arrival_s + limits.max_wait_s
        if request.deadline_s is not None and (
            request.expire_s is None or request.deadline_s < request.expire_s
        ):
            request.expire_s = request.deadline_s
        if request.expire_s is not None:
            heapq.heappush(self._expiries, (request.expire_s, request.seq, request))
        self._waiting += 1
        self._waiting_tokens += request.prompt_tokens
        self._enqueue(request)
        return self._settle(now)

    def first_token(self, request: GateRequest[H], now: float) -> None:
        """The engine streamed ``request``'s first token at ``now`` (later calls, and calls for
        a request that is not running, are ignored)."""
        if request.state == RequestState.RUNNING and request.first_token_s is None:
            request.first_token_s = now
            self._backlog -= request.prompt_tokens

    def finish(self, request: GateRequest[H], now: float) -> list[GateAction]:
        """``request`` streamed its last token: it is completed and frees its slot. Ignored
        (an empty settle) for a request that is not running (aborted meanwhile)."""
        return self._end_running(request, RequestState.COMPLETED, 0, now)

    def fail(self, request: GateRequest[H], now: float) -> list[GateAction]:
        """The engine failed ``request`` (the shell gives its caller the error): it frees its
        slot. Ignored for a request that is not running."""
        return self._end_running(request, RequestState.FAILED, 3, now)

    def cancel(self, request: GateRequest[H], now: float) -> list[GateAction]:
        """``request``'s caller gave up: a waiting request leaves the queue, a running one ends
        with :class:`Abort` (error None) and frees its slot. Ignored for an ended request."""
        if request.state == RequestState.WAITING:
            request.state = RequestState.CANCELLED
            self._waiting -= 1
            self._waiting_tokens -= request.prompt_tokens
            self._ended[4] += 1
            return self._settle(now)
        if request.state == RequestState.RUNNING:
            self._end_running(request, RequestState.CANCELLED, 4, now, settle=False)
            return [Abort(request, None), *self._settle(now)]
        return self._settle(now)

    def poll(self, now: float) -> list[GateAction]:
        """Time passed: expire waiting requests past their time, abort running ones past
        their deadline, admit into free slots, and set the timer."""
        return self._settle(now)

    def close(self, now: float, *, drain: bool = True) -> list[GateAction]:
        """Stop arrivals (a later :meth:`arrive` is rejected with
        :class:`~adaptive_batcher.errors.BatcherClosedError`). With ``drain`` the waiting
        requests are still admitted as slots free; without, they are rejected now. Running
        requests run on either way."""
        self._closed = True
        self._draining = drain
        actions: list[GateAction] = []
        if not drain:
            for request in self._queued_in_order():
                request.state = RequestState.REJECTED
                self._waiting -= 1
                self._waiting_tokens -= request.prompt_tokens
                self._ended[1] += 1
                actions.append(Reject(request, BatcherClosedError("the gate closed")))
            self._fifo.clear()
            self._edf.clear()
        return [*actions, *self._settle(now)]

    # -- internals -------------------------------------------------------------------------

    def _refusal(self, request: GateRequest[H], limits: GateLimits) -> BatcherError | None:
        if self._closed:
            return BatcherClosedError("the gate is closed")
        free = limits.max_in_flight - self._running - self._waiting
        if free > 0 and not limits.predict_free and self._paced_ok():
            return self._flooded(limits)
        enters_now = free > 0 and self._paced_ok()
        if not enters_now and limits.max_queue is not None and self._waiting >= limits.max_queue:
            return GateQueueFullError(limits.max_queue, self._retry_after(0.0))
        predicted = self.predicted_ttft_s(request.prompt_tokens)
        limit = limits.admit_ttft_s
        if predicted is not None and limit is not None and predicted > limit:
            return TTFTUnreachableError(predicted, limit, predicted - limit)
        return None

    def _flooded(self, limits: GateLimits) -> BatcherError | None:
        """The refusal of an arrival that finds a free slot when the prefill already admitted
        would make even an empty prompt's first token miss (a burst flooded the engine), else
        None. Never while the engine's own TTFT, with nothing ahead, is forecast past the
        limit: the backlog is then not what makes it late."""
        forecast, limit = self._forecast, limits.flood_ttft_s
        if forecast is None or limit is None or forecast.engine_ttft_s > limit:
            # the engine alone is forecast late: that is no flood to guard against, refusing
            # makes no one faster, and only admitted requests can show that it is faster now
            # (refusing on that forecast kept an idle engine's gate refusing for good)
            return None
        ahead = forecast.engine_ttft_s + forecast.per_prompt_token_s * self._backlog
        if ahead <= limit:
            return None
        return TTFTUnreachableError(ahead, limit, ahead - limit)

    def _refill(self, now: float) -> None:
        """Bring prefill pacing's bucket to ``now`` (full at the first call, and whenever
        pacing is off)."""
        rate, depth = self._limits.prefill_tokens_per_s, self._limits.prefill_burst_tokens
        if rate is None or depth is None:
            self._bucket, self._bucket_s = math.inf, now
            return
        last = self._bucket_s
        if last is None or math.isinf(self._bucket):  # pacing just began: a full bucket
            self._bucket, self._bucket_s = depth, now
            return
        # a clock gone back credits nothing, and the bucket counts on from the new time
        self._bucket = min(self._bucket + rate * max(now - last, 0.0), depth)
        self._bucket_s = now

    def _paced_ok(self) -> bool:
        """Whether prefill pacing lets a request in now (the bucket holds more than 0)."""
        return self._limits.prefill_tokens_per_s is None or self._bucket > 0

    def _pacing_wait_s(self) -> float:
        """How long the bucket needs before an arrival behind the waiting requests may enter
        (0 without pacing)."""
        rate = self._limits.prefill_tokens_per_s
        if rate is None:
            return 0.0
        return max(self._waiting_tokens - self._bucket + 1.0, 0.0) / rate

    def _retry_after(self, extra_s: float) -> float:
        forecast = self._forecast
        if forecast is None:
            return extra_s
        return extra_s + (self._waiting + 1) / forecast.departure_rps

    def _enqueue(self, request: GateRequest[H]) -> None:
        if self._limits.order == "fcfs":
            self._fifo.append(request)
        else:
            heapq.heappush(self._edf, (request.ttft_deadline_s, request.seq, request))

    def _next_waiting(self) -> GateRequest[H] | None:
        if self._limits.order == "fcfs":
            fifo = self._fifo
            while fifo:
                request = fifo.popleft()
                if request.state == RequestState.WAITING:
                    return request
            return None
        heap = self._edf
        while heap:
            request = heapq.heappop(heap)[2]
            if request.state == RequestState.WAITING:
                return request
        return None

    def _queued_in_order(self) -> list[GateRequest[H]]:
        if self._limits.order == "fcfs":
            return [r for r in self._fifo if r.state == RequestState.WAITING]
        return [entry[2] for entry in sorted(self._edf) if entry[2].state == RequestState.WAITING]

    def _end_running(
        self, request: GateRequest[H], state: int, slot: int, now: float, *, settle: bool = True
    ) -> list[GateAction]:
        if request.state == RequestState.RUNNING:
            request.state = state
            self._running -= 1
            self._ended[slot] += 1
            if request.first_token_s is None:
                self._backlog -= request.prompt_tokens
        return self._settle(now) if settle else []

    def _settle(self, now: float) -> list[GateAction]:
        actions: list[GateAction] = []
        expiries = self._expiries
        while expiries and expiries[0][0] <= now:
            request = heapq.heappop(expiries)[2]
            if request.state == RequestState.WAITING:
                request.state = RequestState.EXPIRED
                self._waiting -= 1
                self._waiting_tokens -= request.prompt_tokens
                self._ended[2] += 1
                actions.append(Expire(request))
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] <= now:
            request = heapq.heappop(deadlines)[2]
            if request.state == RequestState.RUNNING:
                self._end_running(request, RequestState.EXPIRED, 2, now, settle=False)
                error = DeadlineExceededError("the request's deadline passed while it ran")
                actions.append(Abort(request, error))
        if not self._closed or self._draining:
            limit = self._limits.max_in_flight
            self._refill(now)
            while self._waiting and self._running < limit and self._paced_ok():
                next_up = self._next_waiting()
                if next_up is None:  # pragma: no cover - the counts say one is waiting
                    break
                request = next_up
                request.state = RequestState.RUNNING
                request.admitted_s = now
                request.admit_backlog = self._backlog
                self._backlog += request.prompt_tokens
                if self._limits.prefill_tokens_per_s is not None:
                    self._bucket -= request.prompt_tokens
                self._waiting -= 1
                self._waiting_tokens -= request.prompt_tokens
                self._running += 1
                self._admitted += 1
                if request.deadline_s is not None:
                    heapq.heappush(self._deadlines, (request.deadline_s, request.seq, request))
                actions.append(Admit(request))
        actions.append(SetTimer(self.next_wakeup()))
        return actions


def _drop_stale(heap: list[tuple[float, int, GateRequest[Any]]], live: int) -> None:
    while heap and heap[0][2].state != live:
        heapq.heappop(heap)


def _check_limits(limits: object) -> GateLimits:
    if not isinstance(limits, GateLimits):
        raise TypeError(f"limits must be a GateLimits, got {type(limits).__name__}")
    return limits


def _check_forecast(forecast: object) -> TTFTForecast | None:
    if forecast is not None and not isinstance(forecast, TTFTForecast):
        raise TypeError(f"forecast must be a TTFTForecast or None, got {type(forecast).__name__}")
    return forecast

"""The sans-IO batching engine: events in, actions out, no clock and no I/O.

The asyncio runtime (:mod:`adaptive_batcher.runtime`) and the simulator
(:mod:`adaptive_batcher.sim`) drive this same object; every time is a ``now`` argument in seconds
on the caller's clock.

Events: :meth:`BatchingEngine.arrive` (or :meth:`~BatchingEngine.arrive_many` for a run of
arrivals, as a replay has), :meth:`~BatchingEngine.cancel`, :meth:`~BatchingEngine.complete`,
:meth:`~BatchingEngine.close` and, for time passing (a timer fired), :meth:`~BatchingEngine.poll`.

Actions, returned by ``poll``: :class:`Dispatch` (start this batch now), :class:`Expire` (fail this
request with a deadline error now) and :class:`SetTimer` (call ``poll`` again at this time).

Semantics (each learned from a bug in an earlier batcher; see docs/architecture.md):

* The window counts from the arrival of the oldest queued request (TorchServe #2478).
* A batch is formed only when an execution slot is free, so it keeps growing until it starts
  (Triton PR #3789); window 0 sends what queued while the slots were busy ("natural batching").
* A batch is also sent, window or not, once the queue holds a full cap: leftovers go out without
  waiting for another arrival (Ray PR #42631).
* Sizes are in units (rows, tokens) given per request. Batches fill in strict FIFO order; the first
  request that would overflow the cap is *deferred* to the next batch, never split and never
  overtaken. A request larger than the current cap (possible only after the cap was lowered at run
  time) runs alone; one larger than the hard cap is rejected at arrival.
* Per-request deadlines expire on a timer, not when the running batch ends (Triton #7512).
* A deadline bounds its request's queue delay: a request whose deadline comes while a slot is
  free starts its batch then, window or not, with what queued meanwhile (Triton's rule: a
  request's timeout bounds its queue delay); it expires only if no slot can take it at its
  deadline, or if the poll comes more than ``START_GRACE_S`` after it (the caller's loop stood
  still past the deadline: the request did not start in time).
* ``max_queue_size`` counts the requests waiting beyond what the free slots take next (a full
  batch each): a request is never refused while a free slot could take it.
* Cancelled requests are skipped lazily and never dispatched (Ray #50054).
"""

from __future__ import annotations

import heapq
import itertools
import math
import sys
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, Generic, NoReturn, TypeVar

from adaptive_batcher._validate import check_integral, check_real
from adaptive_batcher.errors import BatcherClosedError, ItemTooLargeError, QueueFullError

__all__ = [
    "START_GRACE_S",
    "Action",
    "Batch",
    "BatchingEngine",
    "Dispatch",
    "EngineLimits",
    "Expire",
    "Request",
    "RequestState",
    "SetTimer",
]

H = TypeVar("H")

START_GRACE_S: Final = 0.002
"""How late past its deadline a request may still start, s: a poll later than that (the
caller's loop stood still) expires it instead; the asyncio shell applies the same grace between
a batch's dispatch and its model call. About the lateness of a busy event loop's timers."""

_NOT_READY, _AT_ONCE, _BY_WINDOW = 0, 1, 2  # why a batch may form now
_COMPACT_AT = 1024  # passed entries at the queue's front before the list is compacted


class RequestState:
    """Integer states of a :class:`Request` (ints, not an Enum, to keep the hot path cheap)."""

    QUEUED: Final = 0
    DISPATCHED: Final = 1
    CANCELLED: Final = 2
    EXPIRED: Final = 3
    REJECTED: Final = 4


class Request(Generic[H]):
    """One queued item as the engine sees it.

    ``handle`` is opaque to the engine: the runtime keeps the item and its future there, the
    simulator a request number. ``size`` is in the batch cap's units (1 per item by default).
    """

    __slots__ = ("arrival_s", "deadline_s", "handle", "size", "state")

    def __init__(
        self, handle: H, arrival_s: float, size: int = 1, deadline_s: float | None = None
    ) -> None:
        self.handle = handle
        self.arrival_s = arrival_s
        self.size = size
        self.deadline_s = deadline_s
        self.state: int = RequestState.QUEUED

    def __repr__(self) -> str:
        return (
            f"Request(handle={self.handle!r}, arrival_s={self.arrival_s}, size={self.size}, "
            f"deadline_s={self.deadline_s}, state={self.state})"
        )


# what the queue keeps in place of a request that has left it, so nothing it held stays alive
_GONE: Request[Any] = Request(None, 0.0)
_GONE.state = RequestState.DISPATCHED


class Batch(Generic[H]):
    """A dispatched batch: its requests in FIFO order and their total size in units.

    ``window_idle_s`` is how long the window went on waiting after the batch's last request
    arrived, for a batch released by its window (0 otherwise): the part of the window that
    brought no company. The controller reads it to close windows that only add latency.
    """

    __slots__ = ("batch_id", "formed_s", "requests", "units", "window_idle_s")

    def __init__(
        self,
        batch_id: int,
        requests: list[Request[H]],
        units: int,
        formed_s: float,
        window_idle_s: float = 0.0,
    ):
        self.batch_id = batch_id
        self.requests = requests
        self.units = units
        self.formed_s = formed_s
        self.window_idle_s = window_idle_s

    def __len__(self) -> int:
        return len(self.requests)

    def __repr__(self) -> str:
        return f"Batch(id={self.batch_id}, n={len(self.requests)}, units={self.units})"


@dataclass(frozen=True, slots=True)
class Dispatch(Generic[H]):
    """Start running ``batch`` now; call :meth:`BatchingEngine.complete` when it ends."""

    batch: Batch[H]


@dataclass(frozen=True, slots=True)
class Expire(Generic[H]):
    """Fail ``request`` with :class:`~adaptive_batcher.errors.DeadlineExceededError` now."""

    request: Request[H]


@dataclass(frozen=True, slots=True)
class SetTimer:
    """Call :meth:`BatchingEngine.poll` at ``at_s`` (None: no timer is needed)."""

    at_s: float | None


Action = Dispatch[Any] | Expire[Any] | SetTimer


@dataclass(frozen=True, slots=True)
class EngineLimits:
    """The knobs the controller turns.

    Attributes:
        window_s: longest time the oldest queued request waits for company, seconds (>= 0);
            any real number, stored as a float.
        max_batch_size: batch cap in size units (>= 1); any integral, stored as an int.
        max_concurrent_batches: execution slots (>= 1); any integral, stored as an int.

    Raises:
        TypeError: a field of the wrong type; ValueError: one out of range (both name it).
    """

    window_s: float
    max_batch_size: int
    max_concurrent_batches: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "window_s", check_real("window_s", self.window_s))
        for name in ("max_batch_size", "max_concurrent_batches"):
            object.__setattr__(self, name, check_integral(name, getattr(self, name)))
        if not self.window_s >= 0.0:
            raise ValueError(f"window_s must be >= 0, got {self.window_s!r}")
        if self.max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {self.max_batch_size!r}")
        if self.max_concurrent_batches < 1:
            raise ValueError(
                f"max_concurrent_batches must be >= 1, got {self.max_concurrent_batches!r}"
            )


class BatchingEngine(Generic[H]):
    """Queue, batch formation, deadlines and slots; sans-IO.

    Args:
        limits: the starting window, cap and slots (changeable with :meth:`set_limits`).
        hard_max_batch_size: the cap no setting may exceed and the largest request accepted, units.
            Defaults to ``limits.max_batch_size``.
        max_queue_size: most requests *waiting*: queued beyond what the free execution slots
            take next, a full batch each (up to ``max_batch_size`` requests per free slot; with
            one unit per request, exactly the ones they take). A request is never refused
            while a free slot could take it. None for unbounded.
        window_origin: ``"arrival"`` (default): the window counts from the oldest queued request's
            arrival. ``"slot_free"``: it counts from the later of that arrival and the moment a
            slot last freed up, TorchServe's behaviour (#2478), kept only as a baseline for
            comparisons; it makes requests queued behind a busy model wait a second window.

    Raises:
        ValueError: if a limit is out of range or ``window_origin`` is unknown.
    """

    def __init__(
        self,
        limits: EngineLimits,
        *,
        hard_max_batch_size: int | None = None,
        max_queue_size: int | None = None,
        window_origin: str = "arrival",
    ) -> None:
        if window_origin not in ("arrival", "slot_free"):
            raise ValueError(
                f"window_origin must be 'arrival' or 'slot_free', got {window_origin!r}"
            )
        hard = limits.max_batch_size if hard_max_batch_size is None else hard_max_batch_size
        if hard < limits.max_batch_size:
            raise ValueError(
                f"hard_max_batch_size ({hard}) must be >= max_batch_size ({limits.max_batch_size})"
            )
        if max_queue_size is not None and max_queue_size < 1:
            raise ValueError(f"max_queue_size must be >= 1 or None, got {max_queue_size!r}")
        self.hard_max_batch_size = hard
        self._max_queue_size = max_queue_size
        self._admit_below = sys.maxsize  # arrive() refuses once this many requests are queued
        self._limits = limits
        self._window_s = limits.window_s
        self._cap = limits.max_batch_size
        self._slots = limits.max_concurrent_batches
        # FIFO queue: a list read from index _front (a slice takes a whole batch at once);
        # entries before _front were dispatched, stale entries after it are skipped lazily
        self._queue: list[Request[H]] = []
        self._front = 0
        # deadlines, (deadline, arrival number, request): those that come in order (the usual
        # case: a fixed time after arrival) in a FIFO, the others in a heap; the earliest is at
        # the head of one of them. Stale entries (dispatched, cancelled) are skipped lazily.
        self._deadline_fifo: deque[tuple[float, int, Request[H]]] = deque()
        self._deadlines: list[tuple[float, int, Request[H]]] = []
        self._seq = itertools.count()
        self._batch_ids = itertools.count()
        self._queued = 0
        self._queued_units = 0
        self._in_flight = 0
        self._wake_units = 1  # an arrival that brings the queue to this many units needs a poll
        self._timer_at: float | None = None
        self._set_timer = SetTimer(None)  # the last SetTimer returned, reused while unchanged
        self._closed = False
        self._draining = False
        self._from_slot_free = window_origin == "slot_free"
        self._slot_freed_s = -math.inf
        # since when a slot has been free without a break (inf: every slot busy; None: one
        # freed at a moment not given, taken as the next poll's): a deadline at or after it
        # came with a slot free, and starts its batch rather than expire
        self._free_since: float | None = -math.inf
        self._update_admission()

    # -- read-only state -------------------------------------------------------------------

    @property
    def limits(self) -> EngineLimits:
        """The window, cap and slots in force."""
        return self._limits

    @property
    def max_queue_size(self) -> int | None:
        """Most requests waiting beyond what the free slots take next; None for unbounded."""
        return self._max_queue_size

    @property
    def queue_depth(self) -> int:
        """Requests queued (not cancelled, not expired, not running)."""
        return self._queued

    @property
    def queued_units(self) -> int:
        """Total size of the queued requests, in units."""
        return self._queued_units

    @property
    def in_flight(self) -> int:
        """Batches dispatched and not yet completed."""
        return self._in_flight

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called: arrivals are rejected."""
        return self._closed

    @property
    def idle(self) -> bool:
        """True when nothing is queued and nothing runs."""
        return self._queued == 0 and self._in_flight == 0

    # -- events ----------------------------------------------------------------------------

    def arrive(self, request: Request[H], now: float) -> bool:
        """Queue ``request`` (arrived at ``now``).

        Returns:
            True if :meth:`poll` must run before anything else happens (a batch may be ready, or
            the timer must move); False if the current timer already covers this arrival.
            Between an arrival that returned True and the next poll, further arrivals may return
            True as well (one poll serves them all).

        Raises:
            BatcherClosedError: after :meth:`close`.
            QueueFullError: ``max_queue_size`` requests are already waiting beyond what the
                free slots take next (see the class).
            ItemTooLargeError: ``request.size`` exceeds the hard cap.
        """
        size = request.size
        if self._queued >= self._admit_below or not 0 < size <= self.hard_max_batch_size:
            self._reject(request)
        self._queue.append(request)
        self._queued += 1
        self._queued_units += size
        if request.deadline_s is not None and self._track_deadline(request):
            return True
        return self._queued_units >= self._wake_units

    def arrive_many(
        self,
        requests: Sequence[Request[H]],
        start: int = 0,
        stop: int | None = None,
        *,
        expire_after_s: float | None = None,
        expire_short_s: float | None = None,
    ) -> tuple[int, bool]:
        """Queue ``requests[start:stop]`` in order, exactly as :meth:`arrive` would one by one,
        up to the first that needs a poll or would be refused; for a caller with many arrivals
        (a replay) that would otherwise pay a call per request.

        Args:
            requests: requests in arrival order (non-decreasing ``arrival_s``).
            start: the first of ``requests`` to queue.
            stop: the end of the range to queue, exclusive (None: to the end).
            expire_after_s: if given, each request's deadline becomes the earlier of its own
                and ``arrival_s + expire_after_s`` (seconds) as it is queued; the requests not
                queued are left untouched.
            expire_short_s: with ``expire_after_s``, what a request that joins a queue holding
                less than a full batch (fewer units than the cap) gets instead (seconds; None:
                ``expire_after_s`` for all).

        Returns:
            ``(end, poll)``: ``requests[start:end]`` were queued. ``poll`` is True when the last
            of them needs :meth:`poll` (as :meth:`arrive` returning True); otherwise, if ``end``
            < ``stop``, ``requests[end]`` would be refused: call :meth:`arrive` with it to get
            the error.
        """
        stop = len(requests) if stop is None else stop
        queue_append = self._queue.append
        admit_below, hard, wake = self._admit_below, self.hard_max_batch_size, self._wake_units
        deadlines, fifo, next_seq = self._deadlines, self._deadline_fifo, self._seq.__next__
        fifo_append = fifo.append
        timer = self._timer_at
        latest = fifo[-1][0] if fifo else -math.inf  # the fifo's last deadline
        queued, units = self._queued, self._queued_units
        # a request that joins a queue holding fewer units than `full` gets `short`
        full, short = (-1, 0.0) if expire_short_s is None else (self._cap, expire_short_s)
        index, poll = start, False
        while index < stop:
            request = requests[index]
            size = request.size
            if queued >= admit_below or not 0 < size <= hard:
                break
            deadline = request.deadline_s
            if expire_after_s is not None:
                shed_at = request.arrival_s + (short if units < full else expire_after_s)
                if deadline is None or shed_at < deadline:
                    request.deadline_s = deadline = shed_at
            queue_append(request)
            queued += 1
            units += size
            index += 1
            if deadline is not None:  # as _track_deadline
                if deadline >= latest:
                    fifo_append((deadline, next_seq(), request))
                    latest = deadline
                else:
                    heapq.heappush(deadlines, (deadline, next_seq(), request))
                if timer is None or deadline < timer:
                    poll = True
                    break
            if units >= wake:
                poll = True
                break
        self._queued, self._queued_units = queued, units
        return index, poll

    def expire_after(self, expire_after_s: float) -> None:
        """Bring each queued request's deadline forward to ``arrival_s + expire_after_s``
        (seconds) where that is earlier: a shedding deadline that began, or shortened, after
        they arrived. The next :meth:`poll` expires those already past it."""
        queued = RequestState.QUEUED
        waiting = [r for r in self._queue[self._front :] if r.state == queued]
        if self._free_since != math.inf:  # deadlines now past were never met by a free slot
            self._free_since = None
        # one heap of the queued requests' deadlines, numbered in arrival order so that equal
        # deadlines still expire in arrival order (a rebuild: rare, when shedding begins)
        self._deadline_fifo.clear()
        self._deadlines = []
        for request in waiting:
            shed_at = request.arrival_s + expire_after_s
            if request.deadline_s is not None and request.deadline_s < shed_at:
                shed_at = request.deadline_s
            request.deadline_s = shed_at
            self._deadlines.append((shed_at, next(self._seq), request))
        heapq.heapify(self._deadlines)

    def _track_deadline(self, request: Request[H]) -> bool:
        """Put a new request's deadline on the heap; True if it comes before the timer."""
        deadline = request.deadline_s
        assert deadline is not None
        fifo = self._deadline_fifo
        if not fifo or deadline >= fifo[-1][0]:
            fifo.append((deadline, next(self._seq), request))
        else:
            heapq.heappush(self._deadlines, (deadline, next(self._seq), request))
        return self._timer_at is None or deadline < self._timer_at

    def _update_wake_units(self) -> None:
        """When an arrival needs a poll: with a slot free, the first arrival in an empty queue
        (to start its window), any arrival when the window is 0, or one that fills a batch."""
        if self._in_flight >= self._slots:
            self._wake_units = sys.maxsize  # completing a batch polls anyway
        elif self._queued == 0 or self._window_s <= 0.0:
            self._wake_units = 1
        else:
            self._wake_units = self._cap

    def _update_admission(self) -> None:
        """The queue counts the requests waiting beyond the free slots' next batches: each free
        slot takes up to a full batch (``cap`` requests at most), which the bound leaves out."""
        if self._closed or self._max_queue_size is None:
            return  # closed: refuse everything (set by close); unbounded: admit everything
        free = self._slots - self._in_flight
        self._admit_below = self._max_queue_size + (free * self._cap if free > 0 else 0)

    def _reject(self, request: Request[H]) -> NoReturn:
        request.state = RequestState.REJECTED
        if self._closed:
            raise BatcherClosedError("batcher is closed")
        if not 0 < request.size <= self.hard_max_batch_size:
            raise ItemTooLargeError(
                f"item size {request.size} is outside 1..{self.hard_max_batch_size} "
                "(the batch cap, in size units)"
            )
        raise QueueFullError(f"queue is full ({self.max_queue_size} requests waiting)")

    def cancel(self, request: Request[H]) -> bool:
        """Withdraw a queued request (its caller gave up). Returns True if it was still queued."""
        if request.state != RequestState.QUEUED:
            return False
        request.state = RequestState.CANCELLED
        self._forget(request)
        return True

    def complete(self, batch: Batch[H], now: float | None = None) -> None:
        """The batch has ended (success or failure) at ``now``: its slot is free.

        Call :meth:`poll` next. ``now`` matters only with ``window_origin="slot_free"``.
        """
        del batch
        if self._in_flight <= 0:
            raise RuntimeError("complete() called with no batch in flight")
        if self._in_flight - 1 < self._slots <= self._in_flight:  # a slot is free again
            self._free_since = now
        self._in_flight -= 1
        if now is not None:
            self._slot_freed_s = now
        self._update_wake_units()
        self._update_admission()

    def set_limits(self, limits: EngineLimits) -> None:
        """Change window, cap and slots; they apply from the next :meth:`poll`.

        Raises:
            ValueError: if ``limits.max_batch_size`` exceeds the hard cap.
        """
        if limits.max_batch_size > self.hard_max_batch_size:
            raise ValueError(
                f"max_batch_size {limits.max_batch_size} exceeds the hard cap "
                f"{self.hard_max_batch_size}"
            )
        self._limits = limits
        self._window_s = limits.window_s
        self._cap = limits.max_batch_size
        was_full = self._in_flight >= self._slots
        self._slots = limits.max_concurrent_batches
        if self._in_flight >= self._slots:
            self._free_since = math.inf
        elif was_full:
            self._free_since = None  # a slot is free from the next poll on
        self._update_wake_units()
        self._update_admission()

    def close(self, *, drain: bool) -> list[Request[H]]:
        """Stop accepting arrivals.

        With ``drain`` the queued requests are dispatched as soon as slots free up, without waiting
        for the window; otherwise they are removed and returned, for the caller to fail with
        :class:`~adaptive_batcher.errors.BatcherClosedError` (also after an earlier draining
        close: escalation).
        """
        self._closed = True
        self._admit_below = -1  # arrive() rejects every request from now on
        if drain:
            self._draining = True
            return []
        dropped = self._queued_entries()
        for request in dropped:
            request.state = RequestState.REJECTED
        self._clear_queue()
        self._deadlines.clear()
        self._deadline_fifo.clear()
        self._queued = 0
        self._queued_units = 0
        return dropped

    # -- time ------------------------------------------------------------------------------

    def poll(self, now: float) -> list[Action]:
        """Expire deadlines, form every batch that should start at ``now``, and set the timer.

        Returns:
            Expire actions first, then Dispatch actions in FIFO order, then exactly one SetTimer.
        """
        actions: list[Action] = []
        if self._free_since is None:
            self._free_since = now
        if self._deadlines or self._deadline_fifo:
            # a request whose deadline came while a slot was free starts now, window or not,
            # rather than expire (its deadline bounds its queue delay: Triton's rule); those
            # due before (every slot busy, or a deadline set in the past) expire
            # ... and so do those due more than START_GRACE_S before this poll: a poll that
            # late (the loop stood still) cannot start them at their deadline
            missed = now - START_GRACE_S
            free_since = self._free_since
            if free_since > -math.inf:
                missed = max(missed, math.nextafter(free_since, -math.inf))
            self._expire(min(now, missed), actions)
            started = self._start_due(now)
            self._expire(now, actions)
            actions.extend(started)
        while self._in_flight < self._slots and self._queued:
            why = self._ready(now)
            if why == _NOT_READY:
                break
            window_end = self._window_start() + self._window_s if why == _BY_WINDOW else None
            actions.append(Dispatch(self._form_batch(now, window_end)))
        self._timer_at = self._next_wakeup()
        self._update_wake_units()
        self._update_admission()
        if self._set_timer.at_s != self._timer_at:
            self._set_timer = SetTimer(self._timer_at)
        actions.append(self._set_timer)
        return actions

    def next_wakeup(self) -> float | None:
        """The time of the timer set by the last :meth:`poll` (None: none needed)."""
        return self._timer_at

    # -- internals -------------------------------------------------------------------------

    def _head(self) -> Request[H]:
        """The oldest queued request (call only while one is queued); skips stale entries."""
        queue, front = self._queue, self._front
        while queue[front].state != RequestState.QUEUED:
            front += 1
        self._pass(front)
        return queue[front]

    def _pass(self, front: int) -> None:
        """Move the front to ``front``: the entries passed are replaced by a placeholder, so the
        queue keeps no reference to a dispatched or cancelled request (nor its item)."""
        passed = front - self._front
        if passed:
            self._queue[self._front : front] = [_GONE] * passed
            self._front = front

    def _queued_entries(self) -> list[Request[H]]:
        """The requests still queued, in FIFO order, without the stale entries."""
        return [r for r in self._queue[self._front :] if r.state == RequestState.QUEUED]

    def _clear_queue(self) -> None:
        self._queue.clear()
        self._front = 0

    def _ready(self, now: float) -> int:
        if self._draining or self._window_s <= 0.0 or self._queued_units >= self._cap:
            return _AT_ONCE
        return _BY_WINDOW if now >= self._window_start() + self._window_s else _NOT_READY

    def _start_due(self, now: float) -> list[Action]:
        """Form the batches that must start at ``now`` because a queued request's deadline is
        due (at or before ``now``, and not before a slot was free: those expired first) while
        a slot is free; the FIFO order is kept, so they are the head batches (a request whose
        deadline is due goes in the first of them: a queue still inside its window holds less
        than a full batch)."""
        started: list[Action] = []
        while self._in_flight < self._slots and self._queued:
            earliest = self._earliest_deadline()
            if earliest is None or earliest > now:
                break
            why = self._ready(now)
            window_end = self._window_start() + self._window_s if why == _BY_WINDOW else None
            started.append(Dispatch(self._form_batch(now, window_end)))
        return started

    def _earliest_deadline(self) -> float | None:
        """The earliest deadline of a queued request (None: none has one); drops the stale
        entries at the heads of the deadline FIFO and heap."""
        heap, fifo = self._deadlines, self._deadline_fifo
        queued = RequestState.QUEUED
        while fifo and fifo[0][2].state != queued:
            fifo.popleft()
        while heap and heap[0][2].state != queued:
            heapq.heappop(heap)
        if fifo and (not heap or fifo[0][0] <= heap[0][0]):
            return fifo[0][0]
        return heap[0][0] if heap else None

    def _window_start(self) -> float:
        start = self._head().arrival_s
        return max(start, self._slot_freed_s) if self._from_slot_free else start

    def _form_batch(self, now: float, window_end: float | None) -> Batch[H]:
        if self._queued_units == self._queued == len(self._queue) - self._front:
            taken, units = self._take_unit_sized()
        else:
            taken, units = self._take_fifo()
        self._queued -= len(taken)
        self._queued_units -= units
        self._in_flight += 1
        if self._in_flight >= self._slots:
            self._free_since = math.inf
        if self._queued == 0:
            self._clear_queue()  # what is left are stale entries
        elif self._front >= _COMPACT_AT and 2 * self._front >= len(self._queue):
            del self._queue[: self._front]
            self._front = 0
        idle = 0.0 if window_end is None else max(0.0, window_end - taken[-1].arrival_s)
        return Batch(next(self._batch_ids), taken, units, now, idle)

    def _take_unit_sized(self) -> tuple[list[Request[H]], int]:
        """Every queued request has size 1 and none is stale: one slice makes the batch."""
        front = self._front
        end = front + min(self._cap, self._queued)
        taken = self._queue[front:end]
        for request in taken:
            request.state = RequestState.DISPATCHED
        self._pass(end)
        return taken, len(taken)

    def _take_fifo(self) -> tuple[list[Request[H]], int]:
        """The general case: skip stale entries, stop before the first request that overflows."""
        queue, front, cap = self._queue, self._front, self._cap
        taken: list[Request[H]] = []
        units = 0
        while front < len(queue):
            request = queue[front]
            if request.state != RequestState.QUEUED:
                front += 1
                continue
            if taken and units + request.size > cap:
                break
            front += 1
            request.state = RequestState.DISPATCHED
            taken.append(request)
            units += request.size
            if units >= cap:
                break
        self._pass(front)
        return taken, units

    def _expire(self, now: float, actions: list[Action]) -> None:
        """Expire the queued requests whose deadline is at or before ``now``, earliest first
        (ties in arrival order), as one heap of all deadlines would pop them."""
        heap, fifo = self._deadlines, self._deadline_fifo
        while True:
            if fifo and (not heap or fifo[0] < heap[0]):
                if fifo[0][0] > now:
                    break
                request = fifo.popleft()[2]
            elif heap and heap[0][0] <= now:
                request = heapq.heappop(heap)[2]
            else:
                break
            if request.state == RequestState.QUEUED:
                request.state = RequestState.EXPIRED
                self._forget(request)
                actions.append(Expire(request))
        if len(heap) + len(fifo) > 64 and len(heap) + len(fifo) > 2 * self._queued:
            queued = RequestState.QUEUED
            self._deadlines = [e for e in heap if e[2].state == queued]
            heapq.heapify(self._deadlines)
            self._deadline_fifo = deque(e for e in fifo if e[2].state == queued)

    def _forget(self, request: Request[H]) -> None:
        """Account for a queued request leaving the queue other than by dispatch (lazy removal)."""
        self._queued -= 1
        self._queued_units -= request.size
        if self._queued == 0:
            self._clear_queue()
            self._update_wake_units()
            return
        stale = len(self._queue) - self._front - self._queued
        if stale > 64 and stale > self._queued:  # cancelled in bulk behind a waiting head
            self._queue = self._queued_entries()
            self._front = 0

    def _next_wakeup(self) -> float | None:
        wake: float | None = None
        if self._queued and self._in_flight < self._slots and self._window_s > 0.0:
            wake = self._window_start() + self._window_s
        deadline = self._earliest_deadline()
        if deadline is not None and (wake is None or deadline < wake):
            wake = deadline
        return wake

"""Streaming batches: a model that is an async generator answers each caller element by element.

A streaming model is an async generator function ``model(batch: list[X])`` that yields, at each
step, a sequence with one element per item, in order (token streaming: one token per caller
per step).
What an element in a caller's slot means:

* a value: the caller's stream yields it;
* ``StopIteration`` or ``StopAsyncIteration`` (the class or an instance): the caller's stream
  ends there, normally; its slots in later steps are ignored (Ray Serve's convention);
* any other exception instance: the caller's stream raises it there and ends.

Every stream ends with its elements and then either its normal end or one error: the model's
failure (``BatchFailedError``, the cause attached; its elements so far are delivered first), a
step of the wrong length (``ResultCountError``), a ``pad_fn`` that raised or returned a wrong
number of items (``PaddingError``, before the model runs), a deadline, or the batcher's closing.
A batch that runs out of memory before its first step is re-run in halves, as a batch answered
at once is (nothing was delivered yet); after it, its streams fail (their callers have elements).
A batch holds its execution slot until the model's generator is exhausted; when every caller of
a batch has left (ended, failed or stopped reading), the generator is closed at once and the slot
freed.
Elements are buffered per caller: by default the model is not held back by a slow reader, and a
stream's buffer is unbounded. ``max_buffered_elements`` bounds it; when a reader falls that far
behind, ``stream_overflow="fail"`` ends that stream with ``StreamBufferFullError`` (after the
elements it buffered; the others go on), and ``"hold"`` makes the model's next step wait until
every open stream has room (nothing is dropped; the batch runs at its slowest reader's pace).

Counting: a stream's latency is the time to its first element (what an SLO and
:meth:`~adaptive_batcher.AdaptiveBatcher.stats` measure), recorded then; its outcome is counted
once, when it ends: ``completed`` at its normal end (``within_slo`` if its first element came
in time), ``failed`` at its error (the model raises, a close times out, after elements or not),
and a caller that stops reading (or a ``submit`` caller cancelled) after its first element
counts as ``completed``, one that stops before as ``cancelled``. So every count only goes up.
The batch's service time is the whole stream (its slot is busy to the end); its first step's
time is recorded beside it, so that shedding leaves a request's own batch only the time to its
first answer (``Observation.answer_share``).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from operator import attrgetter
from typing import Any, TypeVar

from adaptive_batcher._log import get_logger
from adaptive_batcher.core.batcher_core import BatcherCore
from adaptive_batcher.core.buckets import pad_target
from adaptive_batcher.errors import (
    BatchFailedError,
    ConcurrentReadError,
    PaddingError,
    StreamBufferFullError,
    describe,
)
from adaptive_batcher.runtime.batch_runner import (
    BatchRunner,
    ModelCall,
    check_results,
    fail_pending,
)
from adaptive_batcher.runtime.executors import StreamExecutor, close_stream
from adaptive_batcher.runtime.requests import QueuedRequest

__all__ = ["CollectedRequest", "Stream", "StreamRequest", "StreamRunner", "ends_stream"]

_log = get_logger()
T = TypeVar("T")
_item_of = attrgetter("item")


def ends_stream(element: object) -> bool:
    """True for the end-of-stream markers: ``StopIteration`` and ``StopAsyncIteration``, as
    classes or instances."""
    return (
        element is StopIteration
        or element is StopAsyncIteration
        or isinstance(element, StopIteration | StopAsyncIteration)
    )


class CollectedRequest(QueuedRequest):
    """A ``submit`` caller of a streaming model: the engine's request and the caller's item;
    its future gets the list of its elements at the stream's end.

    ``in_time`` is None until its batch's first step, then whether that step came within the
    SLO: a caller that leaves after it counts as completed (in time or not), before it as
    cancelled.
    """

    __slots__ = ("in_time",)

    def __init__(
        self,
        item: Any,
        future: asyncio.Future[Any],
        arrival_s: float,
        size: int,
        deadline_s: float | None,
    ) -> None:
        super().__init__(item, future, arrival_s, size, deadline_s)
        self.in_time: bool | None = None


class StreamRequest(QueuedRequest):
    """A queued stream: the engine's request, the caller's item and the elements not yet read.

    ``handle`` is the stream's end: its result (None) is a normal end, its exception the
    stream's error; a cancelled handle means that the caller left. ``in_time`` as for
    :class:`CollectedRequest`.
    """

    __slots__ = ("elements", "in_time", "room_waiter", "waiter")

    def __init__(
        self,
        item: Any,
        future: asyncio.Future[Any],
        arrival_s: float,
        size: int,
        deadline_s: float | None,
    ) -> None:
        super().__init__(item, future, arrival_s, size, deadline_s)
        self.elements: deque[Any] = deque()
        self.waiter: asyncio.Future[None] | None = None
        self.room_waiter: asyncio.Future[None] | None = None  # a held batch step waits on it
        self.in_time: bool | None = None
        future.add_done_callback(self._on_end)

    def push(self, element: Any) -> None:
        """Hand the caller one element."""
        self.elements.append(element)
        self._wake()

    def take(self) -> Any:
        """The oldest element not yet read (call only while there is one)."""
        element = self.elements.popleft()
        if self.room_waiter is not None:
            self._wake_room()
        return element

    async def room(self) -> None:
        """Wait until the reader takes an element or the stream ends."""
        if self.room_waiter is None:
            self.room_waiter = self.handle.get_loop().create_future()
        await self.room_waiter

    def _on_end(self, future: asyncio.Future[Any]) -> None:
        del future
        self._wake()
        self._wake_room()

    def _wake_room(self) -> None:
        waiter = self.room_waiter
        if waiter is not None:
            self.room_waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None:
            self.waiter = None
            if not waiter.done():
                waiter.set_result(None)


class Stream(AsyncIterator[T]):
    """The caller's side of a stream: its elements, then its end or its error.

    The request is withdrawn (``leave(request)``: it never reaches the model if still queued,
    its batch goes on for the others, and the model stops once every caller has left) when the
    caller stops before the end: :meth:`aclose`, even before the first read; the reading task
    cancelled while it waits; or the stream dropped unread or half read (``break`` out of an
    ``async for`` over ``submit_stream(...)`` itself). A stream kept in a variable after a
    ``break`` may still be read on, so it is withdrawn only when closed or dropped.

    One task reads a stream at a time (as with an async generator): a task that asks for the
    next element while another task waits for it gets ``ConcurrentReadError`` at once, and the
    waiting reader reads on undisturbed (two readers sharing elements would each see an
    arbitrary part of the stream). Tasks may take turns.

    Raises (from ``__anext__``):
        ConcurrentReadError: another task is waiting for the next element (nothing changes).
        Exception: the stream's error (see the module docstring), after its elements; then
            ``StopAsyncIteration``, as for a stream that ended or was left.
    """

    __slots__ = ("_leave", "_over", "_request")

    def __init__(self, request: StreamRequest, leave: Callable[[StreamRequest], None]) -> None:
        self._request = request
        self._leave = leave
        self._over = False  # ended, failed, or left: no element will come

    def __aiter__(self) -> Stream[T]:
        return self

    async def __anext__(self) -> T:
        request = self._request
        handle, elements = request.handle, request.elements
        while not self._over:
            if elements:
                element: T = request.take()
                return element
            if handle.done():
                self._over = True
                handle.result()  # raises the stream's error
                break
            if request.waiter is not None:  # another task waits: one reader at a time
                raise ConcurrentReadError(
                    "another task is already waiting for this stream's next element; a "
                    "stream has one reader at a time"
                )
            waiter: asyncio.Future[None] = handle.get_loop().create_future()
            request.waiter = waiter
            try:
                await waiter
            except BaseException:  # cancelled while waiting: the caller has left
                if request.waiter is waiter:
                    request.waiter = None
                self._stop()
                raise
        raise StopAsyncIteration

    async def aclose(self) -> None:
        """Stop reading: withdraw the request unless its stream has ended."""
        self._stop()

    def _stop(self) -> None:
        self._over = True
        handle = self._request.handle
        if not handle.done():
            self._leave(self._request)
        else:  # it ended, maybe with an error this reader will never read: mark it read now,
            _read_error(handle)  # not at collection, where the future may be finalized first

    def __del__(self) -> None:
        handle = self._request.handle
        if not handle.done():  # dropped before the end: leave, on the loop's thread
            with contextlib.suppress(RuntimeError):  # a closed loop runs no batch any more
                handle.get_loop().call_soon_threadsafe(_leave_dropped, self._leave, self._request)
        else:
            _read_error(handle)


def _leave_dropped(leave: Callable[[StreamRequest], None], request: StreamRequest) -> None:
    """A dropped stream's withdrawal, at the loop's next turn (never from inside a collection
    of garbage, which may run amid the engine's own work); if its stream ended meanwhile, its
    error is read instead."""
    if request.handle.done():
        _read_error(request.handle)
    else:
        leave(request)


def _read_error(handle: asyncio.Future[Any]) -> None:
    """Mark the error of a stream nobody will read as read: no "never retrieved" warning."""
    if not handle.cancelled():
        handle.exception()


class StreamRunner(BatchRunner):
    """Runs a batch through a streaming model and hands each caller its elements as they come.

    Takes the arguments of :class:`~adaptive_batcher.runtime.batch_runner.BatchRunner`; the
    executor must be a :class:`~adaptive_batcher.runtime.executors.StreamExecutor`. Callers of
    ``submit`` (plain requests) in a streaming batch get the list of their elements at the end.

    Raises:
        ValueError: ``bisect`` is True: a stream cannot be re-run in halves once it has
            answered.
    """

    def __init__(
        self,
        executor: StreamExecutor,
        *args: Any,
        max_buffered: int | None = None,
        overflow: str = "fail",
        **kwargs: Any,
    ) -> None:
        super().__init__(executor, *args, **kwargs)
        if self.bisect:
            raise ValueError("bisect_on_error does not apply to a streaming model")
        self.streamer = executor
        self.max_buffered = max_buffered
        self.hold = overflow == "hold"

    def leave(self, request: Any) -> bool:
        in_time: bool | None = getattr(request, "in_time", None)
        if in_time is None:  # no first element yet: the caller counts it as cancelled
            return False
        request.in_time = None  # counted once
        self.core.count_completed(1, int(in_time))
        return True

    async def run(self, requests: list[Any]) -> list[ModelCall] | None:
        """Stream ``requests`` through the model and settle each stream; a batch that runs out
        of memory before its first step is re-run in halves, as a batch answered at once is.

        Raises:
            BaseException: only a non-``Exception`` (cancellation), after the streams still
                open were failed with ``BatchFailedError``.

        Returns:
            The model calls whose streams answered and ended without an error, each with its
            first answer's time; None when there is none (the batch's time is its run's).
        """
        calls: list[ModelCall] = []
        await self._stream(requests, calls)
        return calls or None

    async def _stream(self, requests: list[Any], calls: list[ModelCall]) -> bool:
        """:meth:`run`, the calls that answered appended to ``calls``; True when this call ran
        out of memory."""
        units = self._units(requests)
        unanswered_oom = await self._stream_once(requests, units, calls)
        if isinstance(unanswered_oom, bool):
            return unanswered_oom
        halves = self.core.split_failed_call(requests, oom=True, judge_later=True)
        assert halves is not None  # more than one request: see _stream_once

        async def stream_half(live: list[Any]) -> bool:
            return bool(live) and await self._stream(live, calls)

        await self.rerun_halves(requests, halves, unanswered_oom, units, stream_half, judge=True)
        return True

    async def _stream_once(
        self, requests: list[Any], units: int, calls: list[ModelCall]
    ) -> BaseException | bool:
        """One model call for ``requests``. Returns False when it did not run out of memory
        (its streams settled), True when it did and its streams were failed (a step had
        answered, or a single request), and the error when it did before any step with more
        than one request: nothing settled, the caller splits the batch (after the model's
        generator is closed, so its memory is free)."""
        delivery = _Delivery(requests, self.core, self.clock, self.max_buffered, self.name)
        stream: AsyncIterator[Sequence[Any]] | None = None
        started = self.clock()
        try:
            batch = self.pad(list(map(_item_of, requests)), units)
            expected = len(batch)  # before the model: it may change the list it is given
            stream = self.streamer.stream(batch)
            async for step in stream:
                check_results(step, expected)
                if not delivery.deliver(step):
                    break  # every caller has ended or left: stop the model now
                if self.hold and not await delivery.room():
                    break  # every caller left while the step was held
            delivery.end_all()
            calls.extend(self._answered_call(requests, units, started, delivery.first_step_s))
        except PaddingError as exc:  # before the model ran: nothing was delivered
            self.padding_failed(requests, exc)
        except Exception as exc:
            oom = self.is_oom_error(exc)
            if oom and not delivery.answered and len(requests) > 1:
                return exc  # nothing answered yet: re-run in halves
            if oom:  # counted; a stream that answered is not re-run
                self.core.note_oom(units)
            failed = delivery.fail_all(exc)
            _log.warning(
                "stream.failed",
                batcher=self.name,
                batch_size=len(requests),
                failed=failed,
                error=describe(exc),
            )
            return oom
        except BaseException as exc:
            delivery.fail_all(exc)
            raise
        finally:
            if stream is not None:
                await self._close(stream)
        return False

    def _answered_call(
        self, requests: list[Any], units: int, started: float, first_step_s: float
    ) -> list[ModelCall]:
        """The stream's one model call, its first answer ``first_step_s - started`` after its
        start (none: no step answered)."""
        if math.isnan(first_step_s):
            return []
        ended = self.clock()
        ran = pad_target(self.buckets, units) if self.buckets else units
        return [ModelCall(ended, len(requests), ran, ended - started, first_step_s - started)]

    async def call_model(self, items: list[Any], units: int) -> tuple[Sequence[Any], float]:
        """Run the stream for ``items`` to its end, checking every step; returns no results, and
        the stream's time by the loop's clock, s.

        Raises:
            ResultCountError: a step of the wrong length.
            Exception: whatever the model raised.
        """
        if not items:
            return [], 0.0
        started = self.clock()
        batch = self.pad(items, units)
        expected = len(batch)  # before the model: it may change the list it is given
        stream = self.streamer.stream(batch)
        try:
            async for step in stream:
                check_results(step, expected)
        finally:
            await close_stream(stream)
        return [], self.clock() - started

    def _units(self, requests: list[Any]) -> int:
        return sum(r.size for r in requests) if self.counts_units else len(requests)

    async def _close(self, stream: AsyncIterator[Any]) -> None:
        try:
            await close_stream(stream)
        except Exception as exc:  # the model's clean-up failed: its callers are settled already
            _log.warning("stream.close_failed", batcher=self.name, error=describe(exc))


class _Delivery:
    """Hands one batch's steps to its callers and counts each caller once, at its end."""

    def __init__(
        self,
        requests: list[Any],
        core: BatcherCore[Any],
        clock: Callable[[], float],
        max_buffered: int | None,
        name: str,
    ):
        self.requests = requests
        self.core = core
        self.clock = clock
        self.max_buffered = max_buffered  # None: unbounded
        self.name = name
        self.answered = False  # the first step has been handed out
        self.first_step_s = math.nan  # when it was (the clock's time)
        # callers of submit(): their elements, set as their result at their end
        self.collected: dict[int, list[Any]] = {
            id(r): [] for r in requests if type(r) is not StreamRequest
        }

    def deliver(self, step: Sequence[Any]) -> bool:
        """Hand out one step; True while some caller is still reading."""
        if not self.answered:
            self.answered = True
            self.first_step_s = self.clock()
            self._first_step(self.first_step_s)
        reading = False
        for request, element in zip(self.requests, step, strict=False):
            future = request.handle
            if future.done():
                continue
            if ends_stream(element):
                self._end(request)
            elif isinstance(element, BaseException):
                if not isinstance(element, Exception):  # never hand KeyboardInterrupt & co. on
                    element = BatchFailedError(element, len(self.requests))
                future.set_exception(element)
                self.core.count_failed(1)
            elif self._push(request, element):
                reading = True
        return reading

    def _first_step(self, now: float) -> None:
        """The latencies of the callers still open, whose first element this step holds at
        ``now`` (the clock's time)."""
        pending = [r for r in self.requests if not r.handle.done()]
        in_time = self.core.record_first_elements([r.arrival_s for r in pending], now)
        for request, good in zip(pending, in_time, strict=True):
            request.in_time = good

    def end_all(self) -> None:
        """The model's stream is over: every stream still open ends normally (one that had
        no element has its latency, to this end, recorded now)."""
        if not self.answered:
            self.answered = True
            self._first_step(self.clock())
        for request in self.requests:
            if not request.handle.done():
                self._end(request)

    def fail_all(self, exc: BaseException) -> int:
        """Fail every stream still open with its own typed error; returns how many."""
        return fail_pending(self.requests, exc, self.core)

    def _push(self, request: Any, element: Any) -> bool:
        """Buffer ``element`` for ``request``; False if its reader's buffer was full: the
        stream then ends with ``StreamBufferFullError`` (after what it buffered)."""
        if type(request) is not StreamRequest:
            self.collected[id(request)].append(element)
            return True
        bound = self.max_buffered
        if bound is not None and len(request.elements) >= bound:
            request.handle.set_exception(
                StreamBufferFullError(
                    f"the reader fell behind: {bound} elements were waiting unread "
                    "(max_buffered_elements) when the model produced another"
                )
            )
            self.core.count_failed(1)
            _log.warning("stream.overflow", batcher=self.name, max_buffered_elements=bound)
            return False
        request.push(element)
        return True

    async def room(self) -> bool:
        """Wait until every open stream's buffer has room for one more element (the "hold"
        policy: the model's next step waits for the slowest reader); False if no caller is
        left open meanwhile (the model stops)."""
        bound = self.max_buffered
        assert bound is not None
        while True:
            full = None
            open_ = False
            for request in self.requests:
                if request.handle.done():
                    continue
                open_ = True
                if type(request) is StreamRequest and len(request.elements) >= bound:
                    full = request
                    break
            if full is None:
                return open_
            await full.room()

    def _end(self, request: Any) -> None:
        """A normal end: completed, in time if its first element was."""
        request.handle.set_result(self.collected.pop(id(request), None))
        self.core.count_completed(1, int(bool(request.in_time)))

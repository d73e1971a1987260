"""The asyncio batcher: a thin shell around the sans-IO engine.

Per request the hot path is: one future, one queue entry, one engine call; no task and no
``wait_for`` per request. Batches are formed by a "pump" callback scheduled once per loop
iteration, timers are one ``loop.call_at`` handle for the whole batcher, and each dispatched batch
runs in one task.
"""

from __future__ import annotations

import asyncio
import functools
import math
import os
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from types import MappingProxyType
from typing import Any, Generic, TypeVar

from adaptive_batcher._log import get_logger
from adaptive_batcher._validate import (
    check_bool,
    check_callable,
    check_choice,
    check_int,
    check_integral,
    check_number,
    check_real,
    check_sequence,
)
from adaptive_batcher.control.policy import GuardFactory, Policy
from adaptive_batcher.control.types import Bounds
from adaptive_batcher.core import BatcherCore
from adaptive_batcher.engine import (
    Batch,
    Dispatch,
    EngineLimits,
    Expire,
    Request,
    RequestState,
    SetTimer,
)
from adaptive_batcher.errors import (
    BatcherClosedError,
    BatcherError,
    DeadlineExceededError,
    ItemSizeError,
    describe,
)
from adaptive_batcher.runtime.batch_runner import BatchRunner, fail_pending
from adaptive_batcher.runtime.buckets import pad_target, warmup_sizes
from adaptive_batcher.runtime.collate import repeat_last
from adaptive_batcher.runtime.collector import freeze_after_warmup
from adaptive_batcher.runtime.executors import (
    CompletionEvent,
    StreamExecutor,
    ThreadExecutor,
    make_executor,
)
from adaptive_batcher.runtime.stats import BatcherStats, BatchRecord
from adaptive_batcher.runtime.streaming import (
    CollectedRequest,
    Stream,
    StreamRequest,
    StreamRunner,
)
from adaptive_batcher.runtime.threads import check_threads
from adaptive_batcher.settings import (
    DEFAULT_CONTROL_INTERVAL_MS,
    DEFAULT_MAX_BATCH_SIZE,
    DEFAULT_WINDOW_MS,
    BatcherSettings,
    ServiceProfile,
    check_policy,
)
from adaptive_batcher.slo import SLO, check_slo
from adaptive_batcher.telemetry.base import Telemetry, TelemetrySample
from adaptive_batcher.telemetry.sampler import TelemetrySampler

__all__ = ["AdaptiveBatcher", "BatchListener", "BatchRecord", "BatcherStats", "default_is_oom"]

X = TypeVar("X")
Y = TypeVar("Y")

BatchListener = Callable[[BatchRecord], None]
"""``listener(record)``: told of each batch that ran, on the event loop, once it has ended."""

_log = get_logger()
_UNKNOWN = TelemetrySample(source="none")
_running_loop = asyncio.get_running_loop


def loop_shortcuts(
    loop: asyncio.AbstractEventLoop,
) -> tuple[Callable[[], float], Callable[[], asyncio.Future[Any]]]:
    """The batcher's clock and ``loop.create_future`` as plain callables.

    The clock is ``time.monotonic`` on asyncio's own loops, whose ``time()`` only calls it
    (one Python call fewer per request), and on uvloop's: its ``time()`` is libuv's loop time,
    in whole milliseconds and read once per loop iteration (on the same monotonic clock), so
    it measured a 0.2 ms batch as 0 or 1 ms and every event of one iteration at one instant
    (uvicorn serves on uvloop when it is installed). Other loops keep their own ``time()``
    (a virtual clock in tests). ``Future(loop=loop)`` is called directly on asyncio's loops."""
    stock = asyncio.BaseEventLoop
    # the bound methods' functions: catches subclasses and methods replaced on the instance
    stock_time = _function_of(loop.time) is stock.time
    now = time.monotonic if stock_time or _is_uvloop(loop) else loop.time
    if _function_of(loop.create_future) is stock.create_future:
        return now, functools.partial(asyncio.Future, loop=loop)
    return now, loop.create_future


def _is_uvloop(loop: asyncio.AbstractEventLoop) -> bool:
    """True for uvloop's loop (whose ``time()`` is a cached millisecond clock)."""
    return type(loop).__module__.partition(".")[0] == "uvloop"


def _function_of(method: Callable[..., Any]) -> Any:
    return getattr(method, "__func__", None)


def _raise(exc: BaseException) -> None:
    """A loop callback that raises ``exc``: asyncio lets ``KeyboardInterrupt`` and
    ``SystemExit`` from a callback leave ``run_forever`` (and so ``asyncio.run``)."""
    raise exc


def _cancelling() -> bool:
    """True when the current task has been asked to cancel (as opposed to a future it awaits
    being cancelled by someone else)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _all_pending(requests: list[Request[asyncio.Future[Any]]]) -> bool:
    """True when no request's future is done yet (the usual case for a batch about to run)."""
    for request in requests:  # noqa: SIM110 (all() of a generator allocates the generator)
        if request.handle.done():
            return False
    return True


def _check_padding(
    buckets: tuple[int, ...], pad_fn: Callable[..., Any] | None, size_fn: Callable[..., Any] | None
) -> None:
    """Raise ValueError when ``pad_fn`` and ``batch_sizes`` do not go together: a ``pad_fn``
    without buckets (nothing to pad to), or buckets with ``size_fn`` but no ``pad_fn``."""
    if pad_fn is not None and not buckets:
        raise ValueError(
            "pad_fn needs batch_sizes: it pads a batch up to the next bucket, and without "
            "batch_sizes there is none"
        )
    if pad_fn is None and buckets and size_fn is not None:
        raise ValueError("pad_fn is required when both size_fn and batch_sizes are given")


STREAM_OVERFLOWS = ("fail", "hold")
"""What a stream whose reader fell ``max_buffered_elements`` behind does (see the batcher)."""


def _check_stream_buffer(
    executor: object, max_buffered: object, overflow: object
) -> tuple[int | None, str]:
    """The stream buffer's bound and policy, checked.

    Raises:
        TypeError, ValueError: a bound that is not an int >= 1 or None, a policy not in
            STREAM_OVERFLOWS, or a bound given for a model that does not stream.
    """
    policy = check_choice("stream_overflow", overflow, STREAM_OVERFLOWS)
    if max_buffered is None:
        return None, policy
    bound = check_int("max_buffered_elements", max_buffered, 1)
    if not isinstance(executor, StreamExecutor):
        raise ValueError(
            "max_buffered_elements bounds the elements a stream buffers: it needs a streaming "
            "model (an async generator function)"
        )
    return bound, policy


def default_is_oom(exc: BaseException) -> bool:
    """True for ``torch.cuda.OutOfMemoryError``, ``MemoryError`` and "out of memory" errors."""
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


class _Pending(Request[asyncio.Future[Any]]):
    """A queued request in the runtime: the engine's request plus the caller's item."""

    __slots__ = ("item",)

    def __init__(
        self,
        item: Any,
        future: asyncio.Future[Any],
        arrival_s: float,
        size: int,
        deadline_s: float | None,
    ) -> None:
        # the engine's fields set directly, not via super().__init__: this runs once per request
        self.handle = future
        self.arrival_s = arrival_s
        self.size = size
        self.deadline_s = deadline_s
        self.state = RequestState.QUEUED
        self.item = item


class AdaptiveBatcher(Generic[X, Y]):
    """Collects single requests into batches for ``model`` and hands each caller its own result.

    Args:
        model: ``model(batch: list[X]) -> Sequence[Y]`` with one result per item, in order; sync or
            ``async def``. A result slot may hold an exception instance: only that caller gets it.
            Results are matched to callers by position in the list as given: a model that
            reorders the list (``batch.sort()``) must return its results in the original order
            (a change in length is caught, as a ``ResultCountError``; a new order cannot be).
            An async generator function is a streaming model: each ``yield`` holds one element
            per item, and callers read their elements with :meth:`submit_stream` (see
            :mod:`adaptive_batcher.runtime.streaming`).
        max_batch_size: batch cap, in size units (items, or what ``size_fn`` counts). Default 32.
        window_ms: longest wait of the oldest queued request for company, ms. 0 sends what is
            queued as soon as a slot is free ("natural batching"). Default 5.0.
        max_concurrent_batches: batches that may run at once (execution slots). Default 1.
        max_queue_size: most requests *waiting*: queued beyond what the idle execution slots
            take next, a full batch each (up to ``max_batch_size`` requests per idle slot). A
            further ``submit`` raises ``QueueFullError`` at once; a request that an idle slot
            could take is never refused (with one slot, cap 1 and a bound of 2, an idle
            batcher accepts 3 requests at once: 1 runs, 2 wait). None (default): unbounded.
        size_fn: ``size_fn(item) -> int`` units an item takes in the cap (rows, tokens); any
            integral (numpy integers too) >= 1, else ``submit`` raises ``ItemSizeError`` (as it
            does when ``size_fn`` raises, the cause attached).
            Default: 1 per item. A request larger than ``max_batch_size`` raises
            ``ItemTooLargeError``.
        batch_sizes: allowed batch sizes ("buckets"), increasing, in units. A batch is padded up to
            the next bucket by ``pad_fn`` and the padding's results are dropped. The largest
            bucket must be ``max_batch_size`` (ValueError otherwise: a bucket above the cap
            would pad past it, a cap above the largest bucket would leave full batches without
            one).
        pad_fn: ``pad_fn(items, target_size) -> padded items``, the batch's own items first.
            Default (count units only): repeat the last item. Required with ``size_fn`` and
            ``batch_sizes`` (see ``collate.pad_rows``); refused without ``batch_sizes``
            (ValueError: there is no bucket to pad to). It must return ``target_size`` items
            (with ``size_fn``: at least the batch's items), else the batch's callers get
            ``PaddingError`` and the model is not called; the same when it raises an
            ``Exception`` (the ``PaddingError``'s ``__cause__``).
        executor: ``"auto"`` (async model: on the loop; sync: worker thread), ``"async"``,
            ``"inline"`` (sync model on the loop thread), ``"thread"``, or ``"cuda"`` (launch on
            the loop thread, wait for a CUDA event in a thread; see ``CudaExecutor``).
        bisect_on_error: when the model raises for a whole batch, re-run it split in halves until
            the failing item is isolated; only that caller gets the error. Not for a streaming
            model.
        is_oom: tells out-of-memory errors apart; an OOM batch is always re-run split in halves
            (a streaming batch is not: its callers fail with ``BatchFailedError``).
        slo: the latency objective. With an SLO and no ``policy``, the batcher tunes itself with
            :class:`~adaptive_batcher.policies.PID`.
        policy: the control law that tunes window and cap online (see
            :mod:`adaptive_batcher.policies`); None with no SLO keeps the settings static. It
            holds the controller's state (a PID's integrator, a bandit's statistics): give each
            batcher its own instance.
        bounds: the range the controller keeps window and cap in. Default: window 0 to
            ``max(100, window_ms, the SLO's batcher budget)`` ms, cap 1 to ``max_batch_size``, on
            ``batch_sizes`` if given.
        guards: guard factories around the policy, innermost first (default: unused-window,
            budget, memory, and bucket guards; see :mod:`adaptive_batcher.control.guards`).
        telemetry: a GPU telemetry source (e.g. ``adaptive_batcher.telemetry.auto_telemetry()``),
            sampled in a background thread at ``telemetry_hz`` while the batcher is open.
        control_interval_ms: time between controller decisions, ms.
        control_interval_batches: also decide after this many finished batches (None: time only).
        service_profile: where the controller's service-time model starts: the path of a
            ``adaptive-batcher profile`` JSON file, or ``(batch_size, median_ms)`` rows. Without
            it the model learns from the first batches (and is optimistic beyond them).
        shed_late: with an SLO, fail at once (``DeadlineExceededError``) the queued requests that
            can no longer meet it, instead of serving them late (see ``ShedGuard``).
        max_buffered_elements: for a streaming model: most elements buffered unread per
            stream (a slow reader of a fast generator); None (default): unbounded. What
            happens when a reader falls that far behind is ``stream_overflow``'s.
        stream_overflow: ``"fail"`` (default): that stream ends with
            ``StreamBufferFullError`` after the elements it buffered (counted as failed), and
            the batch goes on for the others: one slow client cannot hold up its batch or
            grow memory. ``"hold"``: the model's next step waits until every open stream has
            room, so no element is ever dropped and the batch (and its slot) runs at the pace
            of its slowest reader; a reader that stops without closing or dropping its stream
            holds the batch until a timed close. Each stream then holds at most
            ``max_buffered_elements`` elements. ``submit`` callers of a streaming model
            collect their whole list and are not bounded.
        name: the ``batcher`` field of this batcher's log events.
        cuda_event_factory: for ``executor="cuda"``: makes completion events (tests pass a fake).

    Raises:
        TypeError: an argument of the wrong type (message names it).
        ValueError: an argument out of range (message names it and its bound).

    What callers get when the model fails: an exception the model raises fails its batch; each
    caller gets ``BatchFailedError`` whose ``cause`` is that exception (with ``bisect_on_error``
    or on OOM, only the callers of the failing items). This holds for any exception,
    ``Exception`` or not (``StopIteration``, ``GeneratorExit``, a ``BaseException`` of the
    model's own), with two exceptions. ``KeyboardInterrupt`` and ``SystemExit``: the batch's
    callers get ``BatchFailedError`` first, then the exception is raised in the event loop (from
    a loop callback, as asyncio raises its own tasks' exits), so ``asyncio.run`` raises it and
    the program stops as on Ctrl-C. ``asyncio.CancelledError``: the callers get
    ``BatchFailedError`` and the batch's task ends cancelled. An ``async def`` model cannot raise
    ``StopIteration``: Python turns it into ``RuntimeError`` (PEP 479), and that is the cause. A
    result slot holding an exception fails only its caller, raised as is, unless it cannot be
    raised into a future as is (``StopIteration``, or a ``BaseException`` that is not an
    ``Exception``): then the caller gets ``BatchFailedError`` whose cause it is, and nothing is
    raised in the loop.

    No task starts in the constructor; the batcher binds to the running event loop on first use.
    Use ``async with`` or call :meth:`aclose` so no request is left unresolved.
    """

    def __init__(
        self,
        model: Callable[[list[X]], Sequence[Y] | Awaitable[Sequence[Y]]],
        *,
        max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
        window_ms: float = DEFAULT_WINDOW_MS,
        max_concurrent_batches: int = 1,
        max_queue_size: int | None = None,
        size_fn: Callable[[X], int] | None = None,
        batch_sizes: Iterable[int] | None = None,
        pad_fn: Callable[[list[X], int], list[X]] | None = None,
        executor: str = "auto",
        bisect_on_error: bool = False,
        is_oom: Callable[[BaseException], bool] = default_is_oom,
        slo: SLO | None = None,
        policy: Policy | None = None,
        bounds: Bounds | None = None,
        guards: Sequence[GuardFactory] | None = None,
        telemetry: Telemetry | None = None,
        telemetry_hz: float = 20.0,
        control_interval_ms: float = DEFAULT_CONTROL_INTERVAL_MS,
        control_interval_batches: int | None = None,
        service_profile: ServiceProfile | None = None,
        shed_late: bool = False,
        max_buffered_elements: int | None = None,
        stream_overflow: str = "fail",
        name: str = "batcher",
        cuda_event_factory: Callable[[], CompletionEvent] | None = None,
    ) -> None:
        check_callable("model", model)
        settings = BatcherSettings(
            max_batch_size=max_batch_size,
            window_ms=window_ms,
            max_concurrent_batches=max_concurrent_batches,
            max_queue_size=max_queue_size,
            batch_sizes=batch_sizes,
            slo=slo,
            policy=policy,
            bounds=bounds,
            guards=guards,
            control_interval_ms=control_interval_ms,
            control_interval_batches=control_interval_batches,
            service_profile=service_profile,
            shed_late=shed_late,
        )
        if size_fn is not None:
            check_callable("size_fn", size_fn)
        if pad_fn is not None:
            check_callable("pad_fn", pad_fn)
        check_callable("is_oom", is_oom)
        if cuda_event_factory is not None:
            check_callable("cuda_event_factory", cuda_event_factory)
        if not isinstance(name, str):
            raise TypeError(f"name must be a str, got {type(name).__name__}")
        bisect_on_error = check_bool("bisect_on_error", bisect_on_error)
        if telemetry is not None and not callable(getattr(telemetry, "sample", None)):
            raise TypeError(
                f"telemetry must have a sample() method, got {type(telemetry).__name__}"
            )
        check_number("telemetry_hz", telemetry_hz, 0.0, strict=True)
        self._buckets = settings.buckets
        _check_padding(self._buckets, pad_fn, size_fn)
        self._sampler = (
            TelemetrySampler(telemetry, rate_hz=telemetry_hz) if telemetry is not None else None
        )
        self._core: BatcherCore[asyncio.Future[Any]] = BatcherCore(
            settings,
            read_telemetry=self._read_telemetry,
            warmed=lambda: self.warmed_sizes,
            name=name,
        )
        self._engine = self._core.engine
        self._size_fn = size_fn
        self.name = name
        self.recorder = self._core.recorder
        self._executor = make_executor(model, executor, max_concurrent_batches, cuda_event_factory)
        runner_args = (
            self._buckets,
            pad_fn or repeat_last,
            size_fn is not None,
            bool(bisect_on_error),
            is_oom,
            self._core,
            self._clock,
            name,
        )
        self._runner: BatchRunner
        overflow = _check_stream_buffer(self._executor, max_buffered_elements, stream_overflow)
        if isinstance(self._executor, StreamExecutor):  # an async generator model
            self._runner = StreamRunner(
                self._executor,
                *runner_args,
                on_oom=self._core.note_oom,
                max_buffered=overflow[0],
                overflow=overflow[1],
            )
        else:
            self._runner = BatchRunner(self._executor, *runner_args, on_oom=self._core.note_oom)
        self._streams = isinstance(self._runner, StreamRunner)
        # a submit() caller: of a streaming model, one whose first step is remembered
        self._request_type: type[_Pending] | type[CollectedRequest] = (
            CollectedRequest if self._streams else _Pending
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        # the loop's clock and future factory, set on binding (see loop_shortcuts)
        self._now: Callable[[], float] = time.monotonic
        self._new_future: Callable[[], asyncio.Future[Any]] = asyncio.Future
        self._pump_scheduled = False
        self._pumping = False  # inside _pump: a batch ending now must not pump again in it
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._tasks: dict[asyncio.Task[None], Batch[Any]] = {}  # batch tasks not yet ended
        self._warming: set[asyncio.Future[Any]] = set()  # warm-up model calls not yet ended
        self._unstarted: set[Batch[asyncio.Future[Any]]] = set()  # dispatched, task not yet run
        self._running: list[list[Any]] = []
        self._closed = False
        self._closer: asyncio.Future[None] | None = None  # a close awaited by the model (aclose)
        self._batch_listeners: list[BatchListener] = []
        self.warmed_sizes: frozenset[int] = frozenset()
        # loop callbacks bound once, not once per scheduling (a method object each time)
        self._pump_callback: Callable[[], None] = self._pump
        self._timer_callback: Callable[[], None] = self._on_timer
        self._task_done_callback: Callable[[asyncio.Task[None]], None] = self._batch_task_done

    @classmethod
    def from_preset(
        cls,
        preset: str | os.PathLike[str],
        model: Callable[[list[Any]], Sequence[Any] | Awaitable[Sequence[Any]]],
        **overrides: Any,
    ) -> AdaptiveBatcher[Any, Any]:
        """A batcher configured by a scenario preset (see :mod:`adaptive_batcher.presets`).

        Example: ``AdaptiveBatcher.from_preset("realtime_chat", model, max_queue_size=256)``.

        Args:
            preset: a preset name from ``list_presets()`` (``"search"``,
                ``"customer_service/chat"``) or the path of a preset TOML file.
            model: as for the constructor.
            **overrides: constructor keyword arguments; they win over the preset's. The preset's
                bounds follow an overridden ``max_batch_size``, ``window_ms`` or ``batch_sizes``
                (see ``Preset.batcher_kwargs``).

        Raises:
            PresetError: an unknown preset name (the message lists the available ones) or an
                invalid preset file (the message names the file and the key); a ``ValueError``.
            TypeError, ValueError: as the constructor, for the model and the overrides.
        """
        from adaptive_batcher.presets import load_preset

        return cls(model, **load_preset(preset).batcher_kwargs(**overrides))

    # -- public API ------------------------------------------------------------------------

    async def submit(self, item: X, *, deadline_ms: float | None = None) -> Y:
        """Queue ``item`` and return its result once its batch has run.

        Args:
            item: one input; its size is ``size_fn(item)`` units (1 by default).
            deadline_ms: if the request has not started within this many ms of now, it fails with
                ``DeadlineExceededError`` at that moment (a timer, not the end of a running batch).
                It bounds the request's queue delay: with a slot free at that moment, its batch
                starts then instead, even if the window is longer.

        Raises:
            QueueFullError: ``max_queue_size`` requests are waiting (raised at once).
            ItemTooLargeError: the item is larger than the batch cap.
            ItemSizeError: ``size_fn`` raised for the item, or gave it no int >= 1.
            BatcherClosedError: the batcher is closed, or closed without draining meanwhile.
            DeadlineExceededError: the deadline passed before the request started.
            BatchFailedError: the model raised for this request's batch (cause attached).
            ResultCountError: the model returned the wrong number of results.
            PaddingError: ``pad_fn`` raised, or returned a wrong number of items, for this
                request's batch (the model did not run).
            Exception: whatever exception instance the model returned in this request's slot.
        """
        loop = _running_loop()
        if loop is not self._loop:
            self._bind()
        now = self._now()
        deadline_s = None
        if deadline_ms is not None:
            deadline_s = now + check_number("deadline_ms", deadline_ms, 0.0, strict=True) / 1e3
        size = 1 if self._size_fn is None else self._item_size(item)
        future: asyncio.Future[Y] = self._new_future()
        request = self._request_type(item, future, now, size, deadline_s)
        if self._core.arrive(request, now) and not self._pump_scheduled:
            self._pump_scheduled = True
            loop.call_soon(self._pump_callback)
        try:
            return await future
        except asyncio.CancelledError:
            self._engine.cancel(request)
            # no result or error was set: cancelled, unless a streaming batch had handed it a
            # first element (then it counts as completed)
            if future.cancelled() and not self._runner.leave(request):
                self._core.count_cancelled(1)
            raise

    def submit_stream(self, item: X, *, deadline_ms: float | None = None) -> Stream[Y]:
        """Queue ``item`` for a streaming model now and return its stream of elements.

        The request is queued by this call, not by the first read. Iterate the result with
        ``async for``. Stopping early withdraws the request (it never reaches the model if
        still queued, and the batch goes on for the others): ``await stream.aclose()``, even
        before the first read; cancelling the task that reads it; or dropping it
        (``break`` out of ``async for ... in batcher.submit_stream(...)``). A stream kept in
        a variable after a ``break`` may still be read, so it is withdrawn only when closed
        or dropped (see :class:`~adaptive_batcher.runtime.streaming.Stream`).

        Args:
            item: one input; its size is ``size_fn(item)`` units (1 by default).
            deadline_ms: as for :meth:`submit`: the stream fails with ``DeadlineExceededError``
                if its batch has not started within this many ms of now.

        Raises:
            TypeError: the model is not a streaming model (use :meth:`submit`).
            QueueFullError, ItemTooLargeError, ItemSizeError, BatcherClosedError: raised by
                this call, at once.

        The stream raises, after the elements it delivered: ``DeadlineExceededError``,
        ``BatcherClosedError`` (closed without draining, or a close that timed out),
        ``BatchFailedError`` (the model raised; cause attached), ``ResultCountError`` (a step
        of the wrong length), ``PaddingError`` (``pad_fn`` raised or returned a wrong number of
        items), or the exception instance the model put in this caller's slot.
        """
        if not self._streams:
            raise TypeError(
                "submit_stream needs a streaming model (an async generator function); "
                "this batcher's model returns its results at once: use submit"
            )
        if _running_loop() is not self._loop:
            self._bind()
        now = self._now()
        deadline_s = None
        if deadline_ms is not None:
            deadline_s = now + check_number("deadline_ms", deadline_ms, 0.0, strict=True) / 1e3
        size = 1 if self._size_fn is None else self._item_size(item)
        request = StreamRequest(item, self._new_future(), now, size, deadline_s)
        if self._core.arrive(request, now):
            self._schedule_pump()
        return Stream(request, self._leave_stream)

    def _leave_stream(self, request: StreamRequest) -> None:
        """The caller stopped reading before its stream ended: withdraw it (once)."""
        if request.handle.done():  # ended meanwhile, or withdrawn already
            return
        self._engine.cancel(request)
        request.handle.cancel()
        if not self._runner.leave(request):  # one that had an element counts as completed
            self._core.count_cancelled(1)

    async def submit_many(
        self,
        items: Iterable[X],
        *,
        deadline_ms: float | None = None,
        return_exceptions: bool = False,
    ) -> list[Any]:
        """Submit several items at once and return their results in order.

        Args:
            items: the inputs, any iterable but a str or bytes-like object (read in full
                first).
            deadline_ms: as for :meth:`submit`, for each item.
            return_exceptions: False (default): raise the first error (the other items still
                complete). True: return each item's exception in its place, like
                ``asyncio.gather``.

        Raises:
            TypeError: ``items`` is not iterable, or is a str or bytes-like (one input, not a
                sequence of them), or ``return_exceptions`` is not a bool; nothing is submitted.
            Exception: the first error any item raised (the errors of :meth:`submit`), unless
                ``return_exceptions``; whatever iterating ``items`` raises, before any item is
                submitted.
        """
        # first: a failing iterable must not strand half-made submissions
        items = check_sequence("items", items, "inputs")
        return_exceptions = check_bool("return_exceptions", return_exceptions)
        return list(
            await asyncio.gather(
                *[self.submit(i, deadline_ms=deadline_ms) for i in items],
                return_exceptions=return_exceptions,
            )
        )

    def stats(self) -> BatcherStats:
        """A frozen snapshot of queue, counters, batch sizes and sliding-window latency."""
        engine = self._engine
        controller = self._core.controller
        limits = engine.limits
        now = self._now() if self._loop is not None else 0.0
        slo_s = self.recorder.slo_latency_s
        return BatcherStats(
            name=self.name,
            queue_depth=engine.queue_depth,
            queued_units=engine.queued_units,
            in_flight_batches=engine.in_flight,
            counts=self.recorder.counts(),
            batch_sizes=self.recorder.batch_size_histogram(),
            latency=self.recorder.quantiles(now),
            window_ms=limits.window_s * 1e3,
            max_batch_size=limits.max_batch_size,
            max_concurrent_batches=limits.max_concurrent_batches,
            slo=self.slo,
            policy=controller.chain.name if controller else None,
            slo_unreachable=controller.slo_unreachable if controller else False,
            decisions=controller.decisions if controller else 0,
            slo_attainment=self.recorder.latency.fraction_at_most(slo_s, now)
            if slo_s != math.inf
            else math.nan,
            decision_reasons=MappingProxyType(dict(controller.reasons) if controller else {}),
            gpu=self._sampler.usage if self._sampler is not None else None,
        )

    def add_batch_listener(self, listener: BatchListener) -> None:
        """Call ``listener(record)`` with a :class:`BatchRecord` once for each batch that ran,
        when it has ended (after its callers have their results). Exporters feed their
        per-batch histograms from it (see :mod:`adaptive_batcher.export`).

        The listener runs on the event loop, so it must be quick and must not block; an
        exception it raises, ``Exception`` or not, is logged (``batch_listener.failed``) and
        otherwise ignored (a ``KeyboardInterrupt`` or ``SystemExit`` is raised in the loop
        after the batch's bookkeeping, as the model's would be).

        Raises:
            TypeError: ``listener`` is not callable.
        """
        check_callable("listener", listener)
        self._batch_listeners.append(listener)

    def remove_batch_listener(self, listener: BatchListener) -> None:
        """Stop calling a listener added by :meth:`add_batch_listener`.

        Raises:
            ValueError: ``listener`` was not added.
        """
        try:
            self._batch_listeners.remove(listener)
        except ValueError:
            raise ValueError("listener was not added to this batcher") from None

    def set_limits(
        self,
        *,
        window_ms: float | None = None,
        max_batch_size: int | None = None,
        max_concurrent_batches: int | None = None,
    ) -> None:
        """Change window, cap or slots at run time; they apply to the next batch formed.

        Raises:
            BatcherClosedError: the batcher is closed (as :meth:`submit`, after the arguments'
                checks); nothing changes.
            TypeError, ValueError: as the constructor, or a cap above the configured one.
        """
        current = self._engine.limits
        limits = EngineLimits(
            current.window_s
            if window_ms is None
            else check_number("window_ms", window_ms, 0) / 1e3,
            current.max_batch_size
            if max_batch_size is None
            else check_int("max_batch_size", max_batch_size, 1),
            current.max_concurrent_batches
            if max_concurrent_batches is None
            else check_int("max_concurrent_batches", max_concurrent_batches, 1),
        )
        self._check_open()
        self._core.set_limits(limits)
        self._executor.resize(limits.max_concurrent_batches)  # one thread per slot
        if self._loop is not None:
            self._schedule_pump()

    def set_hard_cap(self, max_batch_size: int) -> None:
        """Move the hard cap: the largest request accepted and the ceiling of the batch cap.

        Raising it lets :meth:`set_limits` (and the controller) go above the ``max_batch_size``
        the batcher was made with; lowering it lowers the cap in force to it if above. The
        controller's cap bound follows: it moves with the hard cap when it was the hard cap
        (the default bounds), and is lowered to it if above. Requests queued already keep
        their place; one larger than the cap in force runs alone.

        Raises:
            BatcherClosedError: the batcher is closed (as :meth:`submit`, after the arguments'
                checks); nothing changes.
            TypeError, ValueError: ``max_batch_size`` is not an int >= 1.
            ValueError: the batcher has ``batch_sizes`` (the largest bucket is the hard cap).
        """
        cap = check_int("max_batch_size", max_batch_size, 1)
        self._check_open()
        self._core.set_hard_cap(cap)
        if self._loop is not None:
            self._schedule_pump()

    @property
    def slo(self) -> SLO | None:
        """The latency objective in force (None: none)."""
        return self._core.slo

    def set_slo(self, slo: SLO | None) -> None:
        """Change the latency objective at run time; the controller uses it from its next tick.

        On a batcher without a controller (made with neither ``slo`` nor ``policy``), an SLO
        starts the default one, ``PID`` behind the standard guards, as if the batcher had been
        made with that SLO (``stats().policy`` names it). Not after ``set_policy(None)``, which
        stops the controller until ``set_policy`` starts one again. ``set_slo(None)`` keeps a
        running controller (it then has no objective).

        Raises:
            BatcherClosedError: the batcher is closed (as :meth:`submit`, after the arguments'
                checks); nothing changes.
            TypeError: ``slo`` is not an SLO or None.
            ValueError: ``slo`` is None on a batcher made with ``shed_late=True`` (shedding is
                relative to the SLO, as the constructor says); the SLO in force stays.
        """
        check_slo(slo)
        self._check_open()
        self._core.set_slo(slo, self._now() if self._loop is not None else None)

    def set_policy(self, policy: Policy | None) -> None:
        """Switch the control law at run time; it continues from the settings in force.

        None stops the controller (and SLO-aware shedding): the settings in force stay as they
        are.

        Raises:
            BatcherClosedError: the batcher is closed (as :meth:`submit`, after the arguments'
                checks); nothing changes.
            TypeError: ``policy`` is not a Policy.
        """
        if policy is not None:
            check_policy(policy)
        self._check_open()
        self._core.set_policy(policy, self._now() if self._loop is not None else None)

    async def warmup(
        self, make_item: Callable[[], X], *, freeze_gc: bool = False
    ) -> dict[int, float]:
        """Run the model once at every bucket size before serving; returns {size: seconds}.

        Cold batch shapes cost 100-970 ms of p99 on an H200 (measured by this project:
        resnet50, bf16, eager, the first call at each new batch size, in every execution mode),
        so call this before taking traffic. Without ``batch_sizes`` it warms
        powers of two up to the cap, and the cap itself. Items come from ``make_item()``, added
        while they fit the size in units; the batch is then padded as in serving, and the size
        it ran at is what counts as warmed (a size no item fits is skipped).

        With ``max_concurrent_batches`` N > 1, the smallest size then runs on every execution
        slot at once: N calls together, as serving at full concurrency runs them and never more.
        A thread executor starts its N worker threads there (calls one at a time would start
        only one), so whatever the framework sets up per thread on its first call (torch: a
        thread's CUDA library handles, its OpenMP team) is paid now, not by the first burst
        that needs N slots. A later ``set_limits(max_concurrent_batches=...)`` starts a fresh
        pool of threads: warm up again after it. The warm-up's calls are not counted against
        the slots of serving batches: call it before taking traffic (called while batches run,
        its calls run beside them).

        With an SLO and a controller but no ``service_profile``, each size then runs twice more,
        warm, and the faster of the two times start the controller's service-time model
        (logged as ``batcher.service_times_seeded``): its plan (and
        SLO-aware shedding) works from the first tick, instead of after its first 8 batches
        (a burst at start-up was answered late until then). The timings returned are the
        first, cold calls.

        With ``freeze_gc``, the process's heap is then frozen for the cyclic garbage collector
        (:func:`~adaptive_batcher.runtime.collector.freeze_after_warmup`: a full collection,
        then ``gc.freeze()``), so that later full collections skip the model and everything
        loaded so far and pause the event loop for a few ms instead of ~100 ms with torch
        loaded. It freezes the whole process: call it once, on the last batcher warmed up.

        Raises:
            TypeError: ``make_item`` is not callable, or ``freeze_gc`` is not a bool.
            BatcherClosedError: the batcher is closed, or was closed during the warm-up (it
                stops calling the model then; a close whose ``timeout_s`` ran out cancels the
                model call running, and the task awaiting ``warmup()`` gets this error, never
                a cancellation).
            PaddingError: ``pad_fn`` raised, or returned a wrong number of items.
            Exception: whatever the model raises (warm-up failures are not hidden); a sync
                model's ``StopIteration`` or a ``GeneratorExit`` from its worker thread arrives
                as ``CarriedModelError``, a ``RuntimeError`` whose ``__cause__`` it is.
        """
        check_callable("make_item", make_item)
        freeze_gc = check_bool("freeze_gc", freeze_gc)
        if self._closed:
            raise BatcherClosedError("batcher is closed")
        self._bind()
        sizes = warmup_sizes(self._buckets, self._engine.hard_max_batch_size)
        batches: dict[int, tuple[list[X], int]] = {}
        timings: dict[int, float] = {}
        for size in sizes:
            items, units = self._warmup_batch(make_item, size)
            if not items:  # an item is larger than this size: it cannot be warmed with them
                continue
            ran = pad_target(self._buckets, units) if self._buckets else units
            batches[ran] = (items, units)
            timings[ran] = await self._timed_call(items, units)
        slots = await self._warm_slots(batches[min(batches)]) if batches else 0
        self.warmed_sizes = frozenset(self.warmed_sizes | set(timings))
        _log.info(
            "batcher.warmed_up",
            batcher=self.name,
            sizes=sorted(timings),
            total_ms=round(sum(timings.values()) * 1e3, 3),
            slots=slots,
        )
        if self._core.wants_service_times:
            await self._seed_service_times(batches)
        if freeze_gc:
            _log.info("batcher.gc_frozen", batcher=self.name, objects=freeze_after_warmup())
        return timings

    async def _warm_slots(self, batch: tuple[list[X], int]) -> int:
        """Run ``batch`` on every execution slot at once (not again with one slot: every
        size's call ran on it); returns the number of slots warmed.

        Raises:
            BatcherClosedError, Exception: as :meth:`_timed_call`.
        """
        slots = self._engine.limits.max_concurrent_batches
        if slots > 1:
            await asyncio.gather(*(self._timed_call(*batch) for _ in range(slots)))
        return slots

    async def _seed_service_times(self, batches: dict[int, tuple[list[X], int]]) -> None:
        """Time two warm calls per size and start the controller's model from the faster: a
        stall (a collector pause, a descheduled thread) only adds time, and one slow seed above
        the sizes serving reaches would stay in the fit and hold the cap low."""
        rows = []
        for size, batch in batches.items():
            first = await self._timed_call(*batch)
            rows.append((size, min(first, await self._timed_call(*batch)) * 1e3))
        if self._core.seed_service_times(rows):
            _log.info(
                "batcher.service_times_seeded",
                batcher=self.name,
                sizes=[n for n, _ in rows],
                ms=[round(ms, 3) for _, ms in rows],
            )

    async def _timed_call(self, items: list[X], units: int) -> float:
        """Seconds one model call on ``items`` takes.

        Raises:
            BatcherClosedError: the batcher was closed (warm-up stops calling the model), or a
                close that timed out cancelled this call.
            asyncio.CancelledError: the task awaiting the warm-up was cancelled.
        """
        if self._closed:
            raise BatcherClosedError("batcher closed during warm-up")
        started = self._now()
        call = asyncio.ensure_future(self._runner.call_model(items, units))
        self._warming.add(call)  # a close waits for it, as for a running batch
        call.add_done_callback(self._warming.discard)
        try:
            await call
        except asyncio.CancelledError:
            if self.closed and call.cancelled() and not _cancelling():  # the close's abort
                raise BatcherClosedError(
                    "batcher closed during warm-up (its timeout cancelled the model call)"
                ) from None
            raise
        return self._now() - started

    def _warmup_batch(self, make_item: Callable[[], X], size: int) -> tuple[list[X], int]:
        """Items from ``make_item`` filling ``size`` units without going over it."""
        items: list[X] = []
        units = 0
        while units < size:
            item = make_item()
            item_units = 1 if self._size_fn is None else self._item_size(item)
            if units + item_units > size:
                break
            items.append(item)
            units += item_units
        return items, units

    async def aclose(self, *, drain: bool = True, timeout_s: float | None = None) -> None:
        """Stop accepting requests and settle every pending one.

        Args:
            drain: True (default): queued requests still run, without waiting for the window.
                False: queued requests fail at once with ``BatcherClosedError``; running batches
                finish. A later call with ``drain=False`` also fails what a draining close
                left queued (escalation).
            timeout_s: the longest wait, seconds (None or ``math.inf``: no limit). When it
                runs out, running batches are cancelled (an ``async def`` model sees
                ``CancelledError``; a sync model's thread cannot be interrupted and finishes in
                the background, and Python waits for it when the process exits: a call that
                never returns holds the exit) and every request still pending fails with
                ``BatcherClosedError`` (a :meth:`warmup` running too: its model call is
                cancelled). The close then returns after one turn of the loop, without waiting
                for cancelled batches to wind down.

        Awaited by an ``async def`` model inside one of this batcher's batches, the close cannot
        wait for that batch (which waits for the close): it stops accepting requests (and fails
        the queue when ``drain`` is False) and returns at once; the rest, waiting for the other
        batches and the queue (within ``timeout_s``) and releasing threads, runs in a task of
        its own and ends after the calling batch has.

        Raises:
            TypeError: ``drain`` not a bool, ``timeout_s`` not a number.
            ValueError: a negative or NaN ``timeout_s``.
        """
        drain = check_bool("drain", drain)
        if timeout_s is not None and check_real("timeout_s", timeout_s) == math.inf:
            timeout_s = None  # no limit, as None says
        if timeout_s is not None:
            check_number("timeout_s", timeout_s, 0.0)
        first = not self._closed
        self._closed = True
        rejected = self._core.close(drain=drain)
        self._fail_unstarted(rejected)
        if first or rejected:
            _log.info("batcher.closing", batcher=self.name, drain=drain, rejected=len(rejected))
        current = asyncio.current_task()
        if current in self._tasks or current in self._warming:  # awaited by the model
            self._closer = asyncio.ensure_future(self._finish_close(timeout_s))
            return
        await self._finish_close(timeout_s)

    async def _finish_close(self, timeout_s: float | None) -> None:
        """Dispatch what is left, wait for every request to end (at most ``timeout_s``, then
        abort), and release the threads and the timer."""
        try:
            if self._loop is not None:
                self._pump()
            if not await self._settles_within(timeout_s):
                await self._abort()
        finally:
            self._release()

    async def _settles_within(self, timeout_s: float | None) -> bool:
        """Wait until every request has ended, for at most ``timeout_s``; True if they did.
        The wait ends at the timeout itself (``wait_for`` would first wait for its cancellation,
        while inline batches went on starting)."""
        if timeout_s == 0:
            return not self._tasks and not self._warming and self._engine.idle
        settled = asyncio.ensure_future(self._settled())
        try:
            done, _ = await asyncio.wait({settled}, timeout=timeout_s)
        finally:
            settled.cancel()  # nothing if it is done; else the wait is over
        return bool(done)

    def _fail_unstarted(self, requests: list[Request[asyncio.Future[Any]]]) -> None:
        """Requests a close took off the queue: refused, like a submit after closing."""
        self._core.count_rejected(
            self._fail_each(requests, lambda: BatcherClosedError("batcher closed before this ran"))
        )

    def _fail_each(
        self, requests: list[Request[asyncio.Future[Any]]], error: Callable[[], BaseException]
    ) -> int:
        """Fail every caller not settled yet with its own ``error()``; returns how many."""
        return sum(self._settle_error(request, error()) for request in requests)

    async def _settled(self) -> None:
        while self._tasks or self._warming or not self._engine.idle:
            if self._tasks or self._warming:
                await asyncio.wait({*self._tasks, *self._warming})
            else:
                await asyncio.sleep(0)

    async def _abort(self) -> None:
        """Fail everything still pending and cancel the running batches."""
        self._fail_unstarted(self._core.close(drain=False))
        for requests in self._running:
            self._core.count_failed(
                self._fail_each(
                    requests, lambda: BatcherClosedError("batcher closed while this ran")
                )
            )
        for batch in self._unstarted:  # their tasks are cancelled before they run
            self._fail_never_ran(batch)
        tasks = {*self._tasks, *self._warming}
        for task in tasks:
            task.cancel()
        if tasks:  # one turn of the loop to take the cancellation; no longer (timeout_s holds)
            await asyncio.wait(tasks, timeout=0)
        _log.warning("batcher.aborted", batcher=self.name, cancelled_batches=len(tasks))

    def abandon(self) -> None:
        """Close at once, without settling anything, and release the threads (the model's
        worker threads, the telemetry sampler): for a batcher whose event loop has been closed,
        where nothing can run any more and :meth:`aclose` cannot be awaited. Requests still
        pending stay so (their loop is gone). ``@batched`` calls it for the batchers of closed
        loops."""
        self._closed = True
        self._release()

    def _release(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._executor.close()
        if self._sampler is not None and self._sampler.running:
            self._sampler.stop_soon()  # never a wait on the loop: a reading may be stuck

    async def __aenter__(self) -> AdaptiveBatcher[X, Y]:
        if self._closed:
            raise BatcherClosedError("batcher is closed; create a new one")
        self._bind()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose(drain=True)

    @property
    def closed(self) -> bool:
        """True once :meth:`aclose` has been called."""
        return self._closed

    # -- internals -------------------------------------------------------------------------

    def _check_open(self) -> None:
        """Raise ``BatcherClosedError`` once :meth:`aclose` has been called."""
        if self._closed:
            raise BatcherClosedError("batcher is closed")

    def _bind(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        if self._loop is loop:
            return loop
        if self._loop is not None:
            raise RuntimeError("this AdaptiveBatcher is bound to another event loop")
        self._loop = loop
        self._now, self._new_future = loop_shortcuts(loop)
        self._core.start(self._now())
        if self._sampler is not None and not self._closed:
            self._sampler.start()
        if isinstance(self._executor, ThreadExecutor):
            check_threads(_log, self.name)
        return loop

    def _clock(self) -> float:
        return self._now()

    def _read_telemetry(self, now: float) -> TelemetrySample:
        del now
        return self._sampler.latest if self._sampler is not None else _UNKNOWN

    def _item_size(self, item: X) -> int:
        """``size_fn(item)``, an int >= 1.

        Raises:
            ItemSizeError: ``size_fn`` raised (the cause) or gave no int >= 1; the request is
                counted as submitted and rejected.
        """
        assert self._size_fn is not None
        try:
            size = self._size_fn(item)
        except Exception as exc:
            error = ItemSizeError(f"size_fn raised for this item: {describe(exc)}")
            raise self._core.refuse(error) from exc
        if type(size) is not int:  # numpy integers too (operator.index); plain ints stay cheap
            try:
                size = check_integral("size_fn(item)", size)
            except TypeError as exc:
                raise self._core.refuse(ItemSizeError(str(exc))) from None
        if size < 1:
            raise self._core.refuse(ItemSizeError(f"size_fn must return an int >= 1, got {size!r}"))
        return size

    def _schedule_pump(self) -> None:
        if not self._pump_scheduled and self._loop is not None:
            self._pump_scheduled = True
            self._loop.call_soon(self._pump_callback)

    def _pump(self, now: float | None = None) -> None:
        self._pump_scheduled = False
        self._pumping = True
        try:
            self._poll_engine(self._now() if now is None else now)
        finally:
            self._pumping = False

    def _poll_engine(self, now: float) -> None:
        loop = self._loop
        assert loop is not None
        for action in self._core.poll(now):
            if type(action) is Dispatch:
                self._start_batch(loop, action.batch)
            elif type(action) is Expire:
                if self._settle_error(
                    action.request,
                    DeadlineExceededError("request did not start before its deadline"),
                ):
                    self._core.count_expired(1)
            elif type(action) is SetTimer:
                self._set_timer(action.at_s)

    def _start_batch(self, loop: asyncio.AbstractEventLoop, batch: Batch[Any]) -> None:
        self._unstarted.add(batch)  # before create_task: an eager task runs inside it
        task = loop.create_task(self._run_batch(batch))
        self._tasks[task] = batch
        task.add_done_callback(self._task_done_callback)

    def _batch_task_done(self, task: asyncio.Task[None]) -> None:
        """A batch task ended. One cancelled before it ran (a time-limited close, or anything
        cancelling the loop's tasks) never entered :meth:`_run_batch`: its callers are failed
        here and its slot is given back, so that none of them waits forever."""
        batch = self._tasks.pop(task)
        if batch not in self._unstarted:
            return
        self._unstarted.discard(batch)
        self._fail_never_ran(batch)
        self._core.complete(batch, self._now())
        self._pump()

    def _fail_never_ran(self, batch: Batch[Any]) -> None:
        """Fail the callers of a batch whose task was cancelled before it ran: refused, as if
        taken off the queue, when the batcher is closing; failed otherwise."""
        if self._closed:
            self._fail_unstarted(batch.requests)
            return
        self._core.count_failed(
            self._fail_each(
                batch.requests, lambda: BatcherError("the batch was cancelled before it ran")
            )
        )

    def _tell_listeners(self, record: BatchRecord) -> None:
        """Call each listener; whatever one raises is logged, and serving goes on (a
        ``KeyboardInterrupt`` or ``SystemExit`` is raised in the loop afterwards, from a loop
        callback, as for the model)."""
        for listener in tuple(self._batch_listeners):
            try:
                listener(record)
            except BaseException as exc:  # a listener must never stop serving
                _log.error(
                    "batch_listener.failed",
                    batcher=self.name,
                    batch_id=record.batch_id,
                    error=describe(exc),
                )
                if isinstance(exc, KeyboardInterrupt | SystemExit):
                    _running_loop().call_soon(_raise, exc)

    def _set_timer(self, at_s: float | None) -> None:
        if at_s == self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = at_s
        if at_s is not None:
            assert self._loop is not None
            self._timer = self._loop.call_at(at_s, self._timer_callback)

    def _on_timer(self) -> None:
        at = self._timer_at
        self._timer = None
        self._timer_at = None
        now = self._now()
        self._pump(now if at is None else max(now, at))

    def _settle_error(self, request: Request[asyncio.Future[Any]], error: BaseException) -> bool:
        """Fail the request's caller with ``error`` unless it is settled already; True if set."""
        future = request.handle
        if future.done():
            return False
        future.set_exception(error)
        return True

    async def _run_batch(self, batch: Batch[asyncio.Future[Any]]) -> None:
        self._unstarted.discard(batch)
        started = self._now()
        live = batch.requests
        if not _all_pending(live):  # some callers gave up meanwhile
            live = [r for r in live if not r.handle.done()]
        self._running.append(live)
        try:
            if live:
                _log.debug(
                    "batch.dispatched",
                    batcher=self.name,
                    batch_id=batch.batch_id,
                    batch_size=len(live),
                    units=batch.units,
                    queue_wait_ms=round((started - batch.requests[0].arrival_s) * 1e3, 3),
                    queue_depth=self._engine.queue_depth,
                )
                await self._runner.run(live)
        except BaseException as exc:  # nothing may leave a caller waiting (e.g. a logger raising)
            fail_pending(live, exc, self._core)
            if isinstance(exc, KeyboardInterrupt | SystemExit):
                # raised in the loop once the callers' tasks have seen their errors, as asyncio
                # raises its own tasks' (from the task's step it would skip their wake-ups)
                _running_loop().call_soon(_raise, exc)
            elif isinstance(exc, asyncio.CancelledError):
                raise
        finally:
            self._running.remove(live)
            self._finish_batch(batch, live, started)

    def _finish_batch(
        self, batch: Batch[asyncio.Future[Any]], live: list[Any], started: float
    ) -> None:
        ended = self._now()
        self._core.complete(batch, ended)
        try:
            if live:
                self._core.record_device_time(ended - started)
                units = len(live) if self._size_fn is None else sum(r.size for r in live)
                if self._buckets:
                    units = pad_target(self._buckets, units)  # what the model actually ran
                self._core.record_run(ended, len(live), units, ended - started, batch.window_idle_s)
                if self._batch_listeners:
                    record = BatchRecord(
                        batch.batch_id, live[0].arrival_s, started, ended, len(live), units
                    )
                    self._tell_listeners(record)
        finally:  # the slot is free: whatever happened, what is queued must not wait
            if self._pumping:  # ended inside create_task (eager task factories, 3.12+):
                self._schedule_pump()  # pumping from here would nest one pump per batch
            else:
                self._pump(ended)

"""The asyncio batcher: the facade users see, over the loop driver and the sans-IO core.

Per request the hot path is: one future, one queue entry, one core call; no task and no
``wait_for`` per request. The parts behind the facade: :mod:`~adaptive_batcher.runtime.driver`
(pump, timer, batch tasks), :mod:`~adaptive_batcher.runtime.in_flight` (what a close waits
for), :mod:`~adaptive_batcher.runtime.warmup`, :mod:`~adaptive_batcher.runtime.shutdown`,
:mod:`~adaptive_batcher.runtime.listeners` and :mod:`~adaptive_batcher.runtime.stats`.
"""

from __future__ import annotations

import asyncio
import functools
import math
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import fields, replace
from typing import Any, Generic, ParamSpec, TypeVar

from adaptive_batcher._log import get_logger
from adaptive_batcher._oom import is_out_of_memory
from adaptive_batcher._validate import (
    check_bool,
    check_callable,
    check_choice,
    check_int,
    check_number,
    check_real,
    check_sequence,
)
from adaptive_batcher.control.policy import GuardFactory, Policy
from adaptive_batcher.control.types import Bounds
from adaptive_batcher.core.batcher_core import BatcherCore
from adaptive_batcher.core.engine import EngineLimits
from adaptive_batcher.core.settings import (
    DEFAULT_CONTROL_INTERVAL_MS,
    DEFAULT_MAX_BATCH_SIZE,
    DEFAULT_WINDOW_MS,
    BatcherSettings,
    ServiceProfile,
    check_policy,
)
from adaptive_batcher.errors import BatcherClosedError, EventLoopError
from adaptive_batcher.presets import load_preset
from adaptive_batcher.runtime.batch_runner import BatchRunner
from adaptive_batcher.runtime.collate import repeat_last
from adaptive_batcher.runtime.driver import LoopDriver
from adaptive_batcher.runtime.executors import (
    BatchExecutor,
    CompletionEvent,
    StreamExecutor,
    ThreadExecutor,
    make_executor,
    running_as,
)
from adaptive_batcher.runtime.in_flight import InFlight
from adaptive_batcher.runtime.listeners import BatchListener, BatchListeners
from adaptive_batcher.runtime.loop import loop_shortcuts
from adaptive_batcher.runtime.requests import QueuedRequest, item_size
from adaptive_batcher.runtime.shutdown import Shutdown
from adaptive_batcher.runtime.stats import BatcherStats, BatchRecord, take_stats
from adaptive_batcher.runtime.streaming import (
    CollectedRequest,
    Stream,
    StreamRequest,
    StreamRunner,
)
from adaptive_batcher.runtime.threads import check_threads
from adaptive_batcher.runtime.warmup import WarmUp
from adaptive_batcher.slo import SLO, check_slo
from adaptive_batcher.telemetry.base import Telemetry, TelemetrySample
from adaptive_batcher.telemetry.sampler import TelemetrySampler

__all__ = ["AdaptiveBatcher", "BatchListener", "BatchRecord", "BatcherStats", "default_is_oom"]

X = TypeVar("X")
Y = TypeVar("Y")

ModelResult = Sequence[Y] | Awaitable[Sequence[Y]] | AsyncIterator[Sequence[Y]]
"""What a model returns for a batch: its results, an awaitable of them, or (an async generator
function, a streaming model) an async iterator of one element per item per ``yield``."""
P = ParamSpec("P")

_log = get_logger()
_UNKNOWN = TelemetrySample(source="none")
_running_loop = asyncio.get_running_loop

SETTING_ARGUMENTS = frozenset(f.name for f in fields(BatcherSettings)) - {
    "window_origin",
    "window_slack",
}
"""The constructor's arguments that are settings: the fields of ``BatcherSettings`` but
``window_origin`` (a baseline for replays) and ``window_slack`` (a replay's comparison, or a
batcher that must keep the plan's bound alone), given only through ``settings``."""

STREAM_OVERFLOWS = ("fail", "hold")
"""What a stream whose reader fell ``max_buffered_elements`` behind does (see the batcher)."""


def default_is_oom(exc: BaseException) -> bool:
    """True for ``torch.cuda.OutOfMemoryError``, ``MemoryError`` and a ``RuntimeError`` whose
    message says an allocator ran out: CUDA's "out of memory", torch's CPU allocator's "can't
    allocate memory" (:func:`adaptive_batcher._oom.is_out_of_memory`)."""
    return is_out_of_memory(exc)


def _settings_or_arguments(
    init: Callable[P, None],
) -> Callable[P, None]:
    """Refuse a ``settings`` object together with a setting given as an argument (TypeError:
    which one would win is not obvious)."""

    @functools.wraps(init)
    def checked(*args: P.args, **kwargs: P.kwargs) -> None:
        if kwargs.get("settings") is not None:
            both = sorted(SETTING_ARGUMENTS.intersection(kwargs))
            if both:
                raise TypeError(
                    f"{', '.join(both)}: give each setting in settings or as an argument, not both"
                )
        init(*args, **kwargs)

    return checked


class AdaptiveBatcher(Generic[X, Y]):
    """Collects single requests into batches for ``model`` and hands each caller its own result.

    Args:
        model: ``model(batch: list[X]) -> Sequence[Y]``, sync or ``async def``: one result per
            item, in the order given; a result slot may hold an exception instance (only that
            caller gets it). An async generator function is a streaming model (one element per
            item per ``yield``; see :meth:`submit_stream`).
        max_batch_size: the batch cap and the hard cap, size units (items, or what ``size_fn``
            counts); default 32.
        window_ms: the longest wait of the oldest queued request for company, ms; 0 sends what
            is queued as soon as a slot is free (natural batching). Default 5.0.
        max_concurrent_batches: batches that may run at once (execution slots); default 1.
        max_queue_size: most requests waiting beyond what the idle slots take next (a full
            batch each); a further ``submit`` raises ``QueueFullError`` at once. None
            (default): unbounded.
        size_fn: ``size_fn(item) -> int``, the units an item takes in the cap (any integral
            >= 1; else ``submit`` raises ``ItemSizeError``). Default: 1 per item.
        batch_sizes: the allowed batch sizes (buckets), strictly increasing, units, the largest
            equal to ``max_batch_size``; a batch is padded up to the next by ``pad_fn`` and the
            padding's results are dropped.
        pad_fn: ``pad_fn(items, target_size) -> padded items``, the batch's own items first;
            default (counting items): repeat the last item. Required with ``size_fn`` and
            ``batch_sizes``, refused without ``batch_sizes``.
        executor: where a model call runs: ``"auto"`` (an async model on the loop, a sync one
            in a worker thread), ``"async"``, ``"inline"`` (a sync model on the loop thread),
            ``"thread"``, ``"adaptive"`` (a sync model in a worker thread, or on the loop once
            ``warmup`` finds a call of the largest batch within 1 ms: ``AdaptiveExecutor``) or
            ``"cuda"`` (see ``CudaExecutor``).
        bisect_on_error: re-run a batch the model raised for in halves until the failing item
            is isolated (not for a streaming model).
        is_oom: ``is_oom(exc) -> bool``, tells out-of-memory errors apart; an OOM batch is
            re-run split in halves (a streaming one only before its first step).
        slo: the latency objective; with no ``policy`` the batcher tunes itself with
            :class:`~adaptive_batcher.policies.PID`.
        policy: the control law that tunes window and cap (see :mod:`adaptive_batcher.policies`);
            it holds the controller's state: one instance per batcher. None with no ``slo``:
            the settings stay as given.
        bounds: the range the controller keeps window and cap in. Default: window 0 to
            ``max(100, window_ms, the SLO's batcher budget)`` ms, cap 1 to ``max_batch_size``,
            on ``batch_sizes`` if given.
        guards: guard factories around the policy, innermost first (default:
            :func:`~adaptive_batcher.control.default_guards`).
        telemetry: a GPU telemetry source (e.g. ``adaptive_batcher.telemetry.auto_telemetry()``),
            sampled in a background thread at ``telemetry_hz`` (Hz) while the batcher is open.
        control_interval_ms: time between controller decisions, ms.
        control_interval_batches: also decide after this many finished batches (None: time only).
        service_profile: where the controller's service-time model starts: the path of an
            ``adaptive-batcher profile`` JSON file, or ``(batch_size, median_ms)`` rows (None: it
            learns from the first batches).
        shed_late: with an SLO, fail at once (``DeadlineExceededError``) the queued requests that
            can no longer meet it (see ``ShedGuard``).
        max_buffered_elements: for a streaming model, the most elements buffered unread per
            stream (None, default: unbounded).
        stream_overflow: what a stream whose reader fell ``max_buffered_elements`` behind does:
            ``"fail"`` (default): it ends with ``StreamBufferFullError``, the batch goes on;
            ``"hold"``: the model's next step waits until every open stream has room.
        name: the ``batcher`` field of this batcher's log events.
        cuda_event_factory: for ``executor="cuda"``: makes completion events (tests pass a fake).
        settings: every setting in one checked object, in place of the setting arguments
            (``max_batch_size`` to ``shed_late``; also ``window_origin`` and ``window_slack``): a
            :class:`~adaptive_batcher.core.settings.BatcherSettings` (a ``SimConfig`` too).

    Raises:
        TypeError: an argument of the wrong type, or ``settings`` given with a setting
            argument (the message names them).
        ValueError: an argument out of range, or arguments that contradict each other (the
            message names them and the bound).
        FileNotFoundError: a ``service_profile`` path with no file.

    The constructor starts nothing: the batcher binds to the running event loop on first use;
    use ``async with`` or call :meth:`aclose` so that no request is left unresolved. What
    callers get when the model fails, and why each argument behaves as it does:
    docs/architecture.md ("Failure isolation") and docs/tuning.md ("The batcher's arguments").
    """

    @_settings_or_arguments
    def __init__(
        self,
        model: Callable[[list[X]], ModelResult[Y]],
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
        settings: BatcherSettings | None = None,
    ) -> None:
        check_callable("model", model)
        if settings is None:
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
        elif not isinstance(settings, BatcherSettings):
            raise TypeError(
                f"settings must be a BatcherSettings or None, got {type(settings).__name__}"
            )
        settings = _with_profile_rows(settings)
        _check_options(size_fn, pad_fn, is_oom, cuda_event_factory, name, telemetry, telemetry_hz)
        bisect_on_error = check_bool("bisect_on_error", bisect_on_error)
        buckets = settings.buckets
        _check_padding(buckets, pad_fn, size_fn)
        self.name = name
        self._size_fn = size_fn
        self._sampler = (
            TelemetrySampler(telemetry, rate_hz=telemetry_hz) if telemetry is not None else None
        )
        self._core: BatcherCore[asyncio.Future[Any]] = BatcherCore(
            settings, read_telemetry=self._read_telemetry, warmed=self._warmed, name=name
        )
        self.recorder = self._core.recorder
        self._executor = make_executor(
            model, executor, settings.max_concurrent_batches, cuda_event_factory, name
        )
        overflow = _check_stream_buffer(self._executor, max_buffered_elements, stream_overflow)
        self._runner = _make_runner(
            self._executor,
            (buckets, pad_fn or repeat_last, size_fn is not None, bisect_on_error, is_oom),
            self._core,
            self._clock,
            name,
            overflow,
        )
        self._streams = isinstance(self._runner, StreamRunner)
        # a submit() caller: of a streaming model, one whose first step is remembered
        self._request_type: type[QueuedRequest] = (
            CollectedRequest if self._streams else QueuedRequest
        )
        self._in_flight = InFlight()
        self._listeners = BatchListeners(name)
        self._driver = LoopDriver(
            self._core,
            self._runner,
            self._in_flight,
            self._listeners,
            buckets=buckets,
            counts_units=size_fn is not None,
            name=name,
        )
        self._warmup = WarmUp(self._driver, size_fn, name)
        self._shutdown = Shutdown(self._driver, self._executor, self._sampler)
        self._loop: asyncio.AbstractEventLoop | None = None
        # the loop's clock and future factory, set on binding (see loop_shortcuts)
        self._now: Callable[[], float] = self._driver.now
        self._new_future: Callable[[], asyncio.Future[Any]] = asyncio.Future

    @classmethod
    def from_preset(
        cls,
        preset: str | os.PathLike[str],
        model: Callable[[list[Any]], ModelResult[Any]],
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
        return cls(model, **load_preset(preset).batcher_kwargs(**overrides))

    # -- public API ------------------------------------------------------------------------

    async def submit(self, item: X, *, deadline_ms: float | None = None) -> Y:
        """Queue ``item`` and return its result once its batch has run.

        On a streaming model the result is the list of the caller's elements, once its stream
        has ended. Its static type is still ``Y``, the element's (the batcher's type does not
        say which kind of model it holds): ``typing.cast`` it to ``list[Y]``, or read the
        elements with :meth:`submit_stream`.

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
        request = self._arrive(item, deadline_ms, self._request_type)
        future: asyncio.Future[Y] = request.handle
        try:
            return await future
        except asyncio.CancelledError:
            self._core.cancel(request)
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
        request = self._arrive(item, deadline_ms, StreamRequest)
        assert isinstance(request, StreamRequest)
        return Stream(request, self._leave_stream)

    def _arrive(
        self, item: X, deadline_ms: float | None, kind: type[QueuedRequest]
    ) -> QueuedRequest:
        """The opening of every submit path: bind to the running loop on first use, check the
        deadline, size the item and queue its request of type ``kind`` (the pump follows when
        the core asks for a poll).

        Raises:
            TypeError, ValueError: a bad ``deadline_ms``.
            QueueFullError, ItemTooLargeError, ItemSizeError, BatcherClosedError: refused.
        """
        if _running_loop() is not self._loop:
            self._bind()
        now = self._now()
        deadline_s = None
        if deadline_ms is not None:
            deadline_s = now + check_number("deadline_ms", deadline_ms, 0.0, strict=True) / 1e3
        size = 1 if self._size_fn is None else item_size(self._size_fn, item, self._core)
        request = kind(item, self._new_future(), now, size, deadline_s)
        if self._core.arrive(request, now):
            self._driver.schedule_pump()
        return request

    def _leave_stream(self, request: StreamRequest) -> None:
        """The caller stopped reading before its stream ended: withdraw it (once)."""
        if request.handle.done():  # ended meanwhile, or withdrawn already
            return
        self._core.cancel(request)
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
        now = self._now() if self._loop is not None else 0.0
        gpu = self._sampler.usage if self._sampler is not None else None
        return take_stats(self._core, self.name, now, gpu, running_as(self._executor))

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
        self._listeners.add(listener)

    def remove_batch_listener(self, listener: BatchListener) -> None:
        """Stop calling a listener added by :meth:`add_batch_listener`.

        Raises:
            ValueError: ``listener`` was not added.
        """
        self._listeners.remove(listener)

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
        current = self._core.limits
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
        self._driver.schedule_pump()

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
        self._driver.schedule_pump()

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

    @property
    def warmed_sizes(self) -> frozenset[int]:
        """The batch sizes, in units, that :meth:`warmup` has run so far."""
        return self._warmup.warmed_sizes

    async def warmup(
        self, make_item: Callable[[], X], *, freeze_gc: bool = False
    ) -> dict[int, float]:
        """Run the model once at every bucket size before serving; returns {size: seconds}.

        The sizes: ``batch_sizes``, or without them the powers of two up to the cap and the cap.
        Items come from ``make_item()``, added while they fit the size in units; the batch is
        padded as in serving, and the size it ran at counts as warmed (a size no item fits is
        skipped). With ``max_concurrent_batches`` N > 1 the smallest size then runs on all N
        slots at once; with an SLO, a controller and no ``service_profile``, each size runs
        twice more and the faster time seeds the controller's service-time model (logged as
        ``batcher.service_times_seeded``). The timings returned are the first, cold calls. Its
        calls run beside serving batches, not in their slots: call it before taking traffic.
        With a controller, a size that runs out of memory (``is_oom``) after a smaller one ran
        ends the sizes there: it is counted as an out-of-memory error of that size (the memory
        guard's ceiling goes below it), logged as ``batcher.warmup_out_of_memory``, and the
        warm-up goes on with the sizes that ran.

        Args:
            make_item: ``make_item() -> X``, one input to warm up with (called repeatedly).
            freeze_gc: then freeze the process's heap for the cyclic garbage collector
                (:func:`~adaptive_batcher.runtime.collector.freeze_after_warmup`); it freezes
                the whole process: once, on the last batcher warmed up.

        Why each step (cold shapes, per-thread set-up, the seed, the frozen heap): the tuning
        guide, "Buckets and warm-up" and "Garbage-collector pauses".

        Raises:
            TypeError: ``make_item`` is not callable, or ``freeze_gc`` is not a bool.
            BatcherClosedError: the batcher is closed, or was closed during the warm-up (it
                stops calling the model then; a close whose ``timeout_s`` ran out cancels the
                model call running, and the task awaiting ``warmup()`` gets this error, never
                a cancellation).
            PaddingError: ``pad_fn`` raised, or returned a wrong number of items.
            Exception: whatever the model raises (warm-up failures are not hidden, out of
                memory too without a controller or at the smallest size); a sync
                model's ``StopIteration`` or a ``GeneratorExit`` from its worker thread arrives
                as ``CarriedModelError``, a ``RuntimeError`` whose ``__cause__`` it is.
        """
        check_callable("make_item", make_item)
        freeze_gc = check_bool("freeze_gc", freeze_gc)
        self._check_open()
        self._bind()
        return await self._warmup.run(make_item, freeze_gc)

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
        await self._shutdown.close(drain, timeout_s)

    def abandon(self) -> None:
        """Close at once, without settling anything, and release the threads (the model's
        worker threads, the telemetry sampler): for a batcher whose event loop has been closed,
        where nothing can run any more and :meth:`aclose` cannot be awaited. Requests still
        pending stay so (their loop is gone). ``@batched`` calls it for the batchers of closed
        loops."""
        self._shutdown.abandon()

    async def __aenter__(self) -> AdaptiveBatcher[X, Y]:
        if self.closed:
            raise BatcherClosedError("batcher is closed; create a new one")
        self._bind()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose(drain=True)

    @property
    def closed(self) -> bool:
        """True once :meth:`aclose` has been called."""
        return self._driver.closed

    # -- internals -------------------------------------------------------------------------

    def _check_open(self) -> None:
        """Raise ``BatcherClosedError`` once :meth:`aclose` has been called."""
        if self._driver.closed:
            raise BatcherClosedError("batcher is closed")

    def _bind(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        if self._loop is loop:
            return loop
        if self._loop is not None:
            raise EventLoopError("this AdaptiveBatcher is bound to another event loop")
        self._loop = loop
        self._now, self._new_future = loop_shortcuts(loop)
        self._driver.bind(loop, self._now)
        self._core.start(self._now())
        if self._sampler is not None and not self.closed:
            self._sampler.start()
        if isinstance(self._executor, ThreadExecutor):
            check_threads(_log, self.name)
        return loop

    def _clock(self) -> float:
        return self._now()

    def _read_telemetry(self, now: float) -> TelemetrySample:
        del now
        return self._sampler.latest if self._sampler is not None else _UNKNOWN

    def _warmed(self) -> frozenset[int]:
        return self._warmup.warmed_sizes


def _check_options(
    size_fn: object,
    pad_fn: object,
    is_oom: object,
    cuda_event_factory: object,
    name: object,
    telemetry: object,
    telemetry_hz: object,
) -> None:
    """Check the constructor's arguments that are not settings.

    Raises:
        TypeError, ValueError: an argument of the wrong type or out of range.
    """
    for label, value in (("size_fn", size_fn), ("pad_fn", pad_fn)):
        if value is not None:
            check_callable(label, value)
    check_callable("is_oom", is_oom)
    if cuda_event_factory is not None:
        check_callable("cuda_event_factory", cuda_event_factory)
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    if telemetry is not None and not callable(getattr(telemetry, "sample", None)):
        raise TypeError(f"telemetry must have a sample() method, got {type(telemetry).__name__}")
    check_number("telemetry_hz", telemetry_hz, 0.0, strict=True)


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


def _make_runner(
    executor: BatchExecutor,
    options: tuple[tuple[int, ...], Callable[..., Any], bool, bool, Callable[..., bool]],
    core: BatcherCore[Any],
    clock: Callable[[], float],
    name: str,
    overflow: tuple[int | None, str],
) -> BatchRunner:
    """The batch runner for ``executor``: a ``StreamRunner`` for a streaming model.
    ``options``: buckets, pad_fn, counts_units, bisect, is_oom (see ``BatchRunner``)."""
    if isinstance(executor, StreamExecutor):  # an async generator model
        return StreamRunner(
            executor, *options, core, clock, name, max_buffered=overflow[0], overflow=overflow[1]
        )
    return BatchRunner(executor, *options, core, clock, name)


def _with_profile_rows(settings: BatcherSettings) -> BatcherSettings:
    """``settings`` with a ``service_profile`` file replaced by its rows (the core reads no
    file).

    Raises:
        FileNotFoundError, ValueError: an unreadable profile file (see ``read_service_profile``).
    """
    profile = settings.service_profile
    if not isinstance(profile, str | os.PathLike):
        return settings
    from adaptive_batcher.profile.format import read_service_profile  # only for a file

    return replace(settings, service_profile=read_service_profile(profile))

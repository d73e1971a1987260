"""How a batch reaches the model: on the event loop, in a worker thread, or split for CUDA.

Each executor is an object with ``async run(items) -> results``; one that runs the model off the
event loop also has ``async run_timed(items, clock) -> (results, seconds)``, the call's time
measured where it ran (:func:`run_timed`): the loop may notice a worker's result late, and that
lateness is the loop's, not the model's (the README's FastAPI app: a batch of 4 read 3.4 ms
from the loop against 0.34 ms in its thread, docs/benchmarks.md). Measured by this project on one
NVIDIA H200 (resnet50, PyTorch 2.11, bf16, eager; the same load served with each execution
strategy): a worker thread fighting the event loop for the GIL made each resnet50 batch 2-5x
slower, while launching kernels on the loop thread and waiting for a
CUDA event in a worker thread ("split", :class:`CudaExecutor`) gave p50 6-8 ms and p99 11-14 ms at
2000-12000 req/s. CPU models whose calls take milliseconds run well in a thread (torch
releases the GIL inside kernels); a short one waits for the GIL between them while the loop
works (``"adaptive"`` moves it onto the loop).

A ``StopIteration`` raised by a sync model (or a CUDA event) leaves every executor as
:class:`CarriedModelError`, and so does a ``GeneratorExit`` from a worker thread: asyncio refuses to
set a ``StopIteration`` on a future (a worker thread's result never arrived, and the batch hung),
Python turns one leaving a coroutine into ``RuntimeError`` (PEP 479), and a ``GeneratorExit``
thrown into the awaiting coroutine closes it instead of propagating. An ``async def`` model's own
``StopIteration`` is turned into ``RuntimeError`` by Python inside the model, before any executor
sees it.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal, Protocol

from adaptive_batcher._log import get_logger
from adaptive_batcher.core.settings import EXECUTOR_KINDS

__all__ = [
    "INLINE_LEAVE_CALLS",
    "INLINE_LEAVE_S",
    "INLINE_MAX_S",
    "INLINE_RECENT",
    "INLINE_STALL_S",
    "INLINE_TRIES",
    "INLINE_TRY_LIMIT_S",
    "THREAD_LOOKS",
    "AdaptiveExecutor",
    "AsyncExecutor",
    "BatchExecutor",
    "CarriedModelError",
    "CudaExecutor",
    "ExecutorKind",
    "InlineExecutor",
    "StreamExecutor",
    "ThreadExecutor",
    "is_async_callable",
    "is_stream_callable",
    "make_executor",
    "run_timed",
    "running_as",
]

_log = get_logger()

ExecutorKind = Literal["auto", "async", "inline", "thread", "adaptive", "cuda"]


class CarriedModelError(RuntimeError):
    """A ``StopIteration`` or ``GeneratorExit`` raised by a sync model, carried to the batch runner
    as a ``RuntimeError`` (its ``__cause__`` and ``carried`` attribute) that, unlike them, crosses
    futures and coroutines as an ordinary exception. The runner hands the carried exception itself
    to the callers as the cause of their ``BatchFailedError``; ``warmup`` raises this error."""

    def __init__(self, carried: BaseException) -> None:
        super().__init__(f"the model raised {type(carried).__name__}")
        self.carried = carried
        self.__cause__ = carried


def call_carrying(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` for a worker thread, with a ``StopIteration`` or ``GeneratorExit`` raised as
    :class:`CarriedModelError` (see the module docstring for why neither can travel as is).

    Raises:
        CarriedModelError: ``fn`` raised ``StopIteration`` or ``GeneratorExit``.
        BaseException: whatever else ``fn`` raised.
    """
    try:
        return fn(*args)
    except (StopIteration, GeneratorExit) as exc:
        raise CarriedModelError(exc) from exc


class BatchExecutor(Protocol):
    """Runs the model on one batch and returns its results (one per item)."""

    async def run(self, items: list[Any]) -> Sequence[Any]: ...

    def close(self) -> None: ...

    def resize(self, workers: int) -> None: ...


async def run_timed(
    executor: BatchExecutor, items: list[Any], clock: Callable[[], float]
) -> tuple[Sequence[Any], float]:
    """``executor.run(items)`` and the call's time, s: as the executor measured it where the
    model ran (its ``run_timed``), else around the ``await`` by ``clock``.

    Raises:
        BaseException: whatever ``executor.run`` raises.
    """
    timed = getattr(executor, "run_timed", None)
    if timed is not None:
        results, took_s = await timed(items, clock)
        return results, took_s
    started = clock()
    results = await executor.run(items)
    return results, clock() - started


def _timed_call(
    fn: Callable[..., Any], clock: Callable[[], float], span: list[float], *args: Any
) -> Any:
    """:func:`call_carrying` of ``fn(*args)``, its start and end by ``clock`` put in ``span``
    (s; also when it raises)."""
    span.append(clock())
    try:
        return call_carrying(fn, *args)
    finally:
        span.append(clock())


class AsyncExecutor:
    """Awaits an ``async def model(batch)`` on the event loop."""

    def __init__(self, fn: Callable[[list[Any]], Awaitable[Sequence[Any]]]) -> None:
        self._fn = fn

    async def run(self, items: list[Any]) -> Sequence[Any]:
        return await self._fn(items)

    def close(self) -> None:
        """Nothing to release."""

    def resize(self, workers: int) -> None:
        """No threads to size."""


class InlineExecutor:
    """Calls a sync model on the event-loop thread (lowest overhead; blocks the loop meanwhile)."""

    def __init__(self, fn: Callable[[list[Any]], Sequence[Any]]) -> None:
        self._fn = fn

    async def run(self, items: list[Any]) -> Sequence[Any]:
        try:
            return self._fn(items)
        except StopIteration as stop:
            raise CarriedModelError(stop) from stop

    def close(self) -> None:
        """Nothing to release."""

    def resize(self, workers: int) -> None:
        """No threads to size."""


class _PoolOwner:
    """Owns a thread pool created on first use and shut down by ``close``."""

    def __init__(self, workers: int, prefix: str) -> None:
        self._workers = workers
        self._prefix = prefix
        self._pool: ThreadPoolExecutor | None = None

    def _get_pool(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self._workers, thread_name_prefix=self._prefix)
        return self._pool

    def close(self) -> None:
        """Shut the pool down (running calls finish first)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None

    def resize(self, workers: int) -> None:
        """Use ``workers`` threads from now on (calls running on the old pool finish there)."""
        if workers != self._workers:
            self._workers = workers
            self.close()


class ThreadExecutor(_PoolOwner):
    """Runs a sync model in a worker thread (one worker per execution slot)."""

    def __init__(self, fn: Callable[[list[Any]], Sequence[Any]], workers: int = 1) -> None:
        super().__init__(workers, "adaptive-batcher-model")
        self._fn = fn

    async def run(self, items: list[Any]) -> Sequence[Any]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._get_pool(), call_carrying, self._fn, items)

    async def run_timed(
        self, items: list[Any], clock: Callable[[], float]
    ) -> tuple[Sequence[Any], float]:
        """:meth:`run`, and the call's time by ``clock`` in the worker thread, s."""
        loop, span = asyncio.get_running_loop(), list[float]()
        pool = self._get_pool()
        results = await loop.run_in_executor(pool, _timed_call, self._fn, clock, span, items)
        return results, span[1] - span[0]


INLINE_MAX_S = 0.001
"""``"adaptive"`` runs a sync model on the loop when warm-up's call of the largest batch took at
most this long, s: less than the thread's hand-off and the GIL it then fights the loop for (the
README's FastAPI app, a 0.1 ms model, answered 1.4-1.8x more within its SLO on the loop than in
a thread; docs/benchmarks.md)."""

INLINE_LEAVE_S = 0.005
"""An inline call this long, s, blocks the loop past what ``INLINE_MAX_S`` promised."""

INLINE_LEAVE_CALLS = 3
"""Inline calls beyond ``INLINE_LEAVE_S`` among the last ``INLINE_RECENT`` that send the model
back to its thread for good (one is a preemption of the process, not the model's time)."""

INLINE_RECENT = 16

INLINE_TRIES = 5
"""Warm-up times the largest batch up to this many times more on the loop for ``"adaptive"``'s
choice and takes the fastest (a stall only adds time): on a busy two-core machine the README
app's 0.1 ms model read 7.5 ms in its thread in 2 of 6 starts, and 7-11 ms on each of six calls
back to back in 2 of 8 starts of a fresh user's, so it stayed in its thread; on the loop the
same calls take what the model does."""

THREAD_LOOKS = 2
"""Calls of the largest batch that warm-up adds in the thread, for ``"adaptive"``'s choice,
while none took at most ``INLINE_TRY_LIMIT_S``: beside four busy loops on two cores the first
call of the README app's 0.06 ms model took 34-50 ms in 4 of 12 starts, and none was tried on
the loop."""

INLINE_TRY_LIMIT_S = 0.02
"""Warm-up tries a model on the loop only once a call in the thread took at most this long, s;
a try this long ends the tries, and their total on the loop stays within it (a fresh user's
15 ms model held the loop 77 ms in five tries back to back)."""

INLINE_STALL_S = 0.05
"""One inline call this long, s, is a stall of the loop: the model goes back to its thread for
good at once (a call of 300 ms in every 10 stood the loop still six times in a fresh user's
trial, never three in 16)."""


class AdaptiveExecutor(ThreadExecutor):
    """``"adaptive"``: a sync model in a worker thread, or on the event loop once warm-up has
    found its calls short (:meth:`choose`): at most ``INLINE_MAX_S`` for the largest batch,
    with one execution slot, and a call on the loop that succeeds (warm-up's next: a model
    bound to its thread, or that runs an event loop of its own, stays there). Back in the
    thread for good (a later warm-up included) once ``INLINE_LEAVE_CALLS`` of the last
    ``INLINE_RECENT`` inline calls took over ``INLINE_LEAVE_S``, or one over
    ``INLINE_STALL_S``. Logs ``batcher.executor_chosen`` (``kind``: ``inline`` or ``thread``)
    at each change and each warm-up's choice. On the loop, a call that hangs holds the loop:
    ``aclose(timeout_s=...)`` cannot end it, and a model that waits on the batcher's own event
    loop (say ``asyncio.run_coroutine_threadsafe(...).result()``) waits for itself; such
    models want ``"thread"``.

    Args:
        fn: the sync model.
        workers: worker threads (one per execution slot).
        name: the ``batcher`` field of its log events.
    """

    def __init__(
        self, fn: Callable[[list[Any]], Sequence[Any]], workers: int = 1, name: str = ""
    ) -> None:
        super().__init__(fn, workers)
        self.name = name
        self.inline = False
        self.left_loop = False  # sent back to the thread by long calls: for good
        self._long: deque[bool] = deque(maxlen=INLINE_RECENT)  # recent inline calls, long?
        self._longest_since_mark_s = 0.0  # the longest inline call since :meth:`mark`

    @property
    def may_go_inline(self) -> bool:
        """Whether a warm-up's time can still move the model onto the loop (one slot, and not
        sent back to its thread for good)."""
        return self._workers == 1 and not self.left_loop

    def choose(self, largest_call_s: float) -> bool:
        """Run on the loop from now on if ``largest_call_s``, warm-up's time for a call of the
        largest batch (s), is within ``INLINE_MAX_S`` and there is one slot; else in the
        thread. True when it moved onto the loop (the caller then tries a call there, and
        :meth:`leave_loop` if it fails)."""
        inline = self.may_go_inline and 0.0 <= largest_call_s <= INLINE_MAX_S
        if inline == self.inline or self.left_loop:
            reason = "left_loop" if self.left_loop else "warmup"
            self._log_choice(self.inline, reason, largest_call_s)  # unchanged: say why
            return False
        self._switch(inline, "warmup", largest_call_s)
        return inline

    def time_on_loop(self, items: list[Any], clock: Callable[[], float]) -> float:
        """Call the model on ``items`` here, on the loop's thread, and return the call's time
        by ``clock``, s (warm-up's tries: what a call costs the loop, where a call in the
        thread also pays for the thread's wake-up on a busy machine).

        Raises:
            Exception: whatever the model raised (one bound to its thread fails here).
        """
        started = clock()
        call_carrying(self._fn, items)
        return clock() - started

    def leave_loop(self, reason: str, call_s: float = math.nan) -> None:
        """Back to the thread for good (``reason`` for the log; logged as well when the model
        was still in its thread: a warm-up's try on the loop failed)."""
        self.left_loop = True
        if self.inline:
            self._switch(False, reason, call_s)
        else:
            self._log_choice(False, reason, call_s)

    async def run_timed(
        self, items: list[Any], clock: Callable[[], float]
    ) -> tuple[Sequence[Any], float]:
        """The model on the loop (see the class) or in the thread, and its time by ``clock``
        where it ran, s."""
        if not self.inline:
            return await super().run_timed(items, clock)
        started = clock()
        try:
            results = call_carrying(self._fn, items)
        finally:
            took_s = clock() - started
            self._note_inline(took_s)
        return results, took_s

    async def run(self, items: list[Any]) -> Sequence[Any]:
        results, _ = await self.run_timed(items, time.monotonic)
        return results

    def resize(self, workers: int) -> None:
        """As :meth:`ThreadExecutor.resize`; more than one slot runs in the threads."""
        super().resize(workers)
        if workers > 1 and self.inline:
            self._switch(False, "slots", math.nan)

    def mark(self) -> None:
        """Count inline calls for :meth:`since_mark` from now (the shell marks it at each stall
        heartbeat)."""
        self._longest_since_mark_s = 0.0

    def since_mark(self, at_least_s: float) -> dict[str, object]:
        """``{"inline_call_ms": ms}`` when a call on the loop since the mark took at least
        ``at_least_s`` (it held the loop: a stall noted now was the model's), else ``{}``."""
        longest = self._longest_since_mark_s
        return {"inline_call_ms": round(longest * 1e3, 3)} if longest >= at_least_s else {}

    def _note_inline(self, took_s: float) -> None:
        self._longest_since_mark_s = max(self._longest_since_mark_s, took_s)
        long = self._long
        long.append(took_s > INLINE_LEAVE_S)
        if took_s > INLINE_STALL_S:
            self.leave_loop("stalled_loop", took_s)
        elif sum(long) >= INLINE_LEAVE_CALLS:
            self.leave_loop("long_calls", took_s)

    def _switch(self, inline: bool, reason: str, call_s: float) -> None:
        self.inline = inline
        self._long.clear()
        self._log_choice(inline, reason, call_s)

    def _log_choice(self, inline: bool, reason: str, call_s: float) -> None:
        _log.info(
            "batcher.executor_chosen",
            batcher=self.name,
            kind="inline" if inline else "thread",
            reason=reason,
            call_ms=round(call_s * 1e3, 3),
        )


class CompletionEvent(Protocol):
    """The part of ``torch.cuda.Event`` the CUDA executor uses."""

    def record(self) -> None: ...

    def synchronize(self) -> None: ...


def _require_cuda() -> None:
    try:
        import torch
    except ImportError:
        raise RuntimeError("executor='cuda' needs torch; it is not installed") from None
    if not torch.cuda.is_available():
        raise RuntimeError(
            "executor='cuda' needs a CUDA device (torch.cuda.is_available() is False)"
        )


def _torch_cuda_event() -> CompletionEvent:
    import torch  # imported here so the package imports without torch

    event: CompletionEvent = torch.cuda.Event()  # type: ignore[no-untyped-call]
    return event


class CudaExecutor(_PoolOwner):
    """ "Split" execution: launch the model's kernels on the loop thread, wait off the loop.

    The model is called on the event-loop thread, so kernel launches never compete with the loop
    for the GIL; an event is recorded on the current CUDA stream after the call and a worker thread
    blocks in ``event.synchronize()`` while the loop keeps serving. The results are returned once
    the GPU has finished them.

    Args:
        fn: sync model that enqueues CUDA work and returns (possibly not yet computed) results.
        event_factory: makes a fresh completion event; defaults to ``torch.cuda.Event``. Tests pass
            a fake (see ``adaptive_batcher.testing.FakeCudaEvent``), so this runs without a GPU.
        workers: waiter threads (one per execution slot).

    Raises:
        RuntimeError: with the default event factory, when torch or a CUDA device is missing.
    """

    def __init__(
        self,
        fn: Callable[[list[Any]], Sequence[Any]],
        event_factory: Callable[[], CompletionEvent] | None = None,
        workers: int = 1,
    ) -> None:
        super().__init__(workers, "adaptive-batcher-cuda-wait")
        self._fn = fn
        if event_factory is None:
            _require_cuda()
        self._event_factory = event_factory or _torch_cuda_event

    async def run(self, items: list[Any]) -> Sequence[Any]:
        results, _ = await self.run_timed(items, time.monotonic)
        return results

    async def run_timed(
        self, items: list[Any], clock: Callable[[], float]
    ) -> tuple[Sequence[Any], float]:
        """:meth:`run`, and its time by ``clock`` from the launch to the event's completion in
        the waiter thread, s."""
        started = clock()
        try:
            results = self._fn(items)
            event = self._event_factory()
            event.record()
        except StopIteration as stop:
            raise CarriedModelError(stop) from stop
        loop, span = asyncio.get_running_loop(), list[float]()
        await loop.run_in_executor(self._get_pool(), _timed_call, event.synchronize, clock, span)
        return results, span[1] - started


class StreamExecutor:
    """Iterates an async generator model on the event loop (a streaming model).

    ``model(batch)`` yields, at each step, a sequence with one element per item of the batch, in
    order (see :mod:`adaptive_batcher.runtime.streaming` for what an element may be).
    """

    def __init__(self, fn: Callable[[list[Any]], AsyncIterator[Sequence[Any]]]) -> None:
        self._fn = fn

    def stream(self, items: list[Any]) -> AsyncIterator[Sequence[Any]]:
        """The model's stream for ``items``.

        Raises:
            TypeError: the model returned something that is not an async iterator.
        """
        stream = self._fn(items)
        if not callable(getattr(stream, "__anext__", None)):
            raise TypeError(
                f"a streaming model must return an async iterator, got {type(stream).__name__}"
            )
        return stream

    async def run(self, items: list[Any]) -> Sequence[Any]:
        """Run the stream to its end; returns each item's elements as a list, in order."""
        elements: list[list[Any]] = [[] for _ in items]
        stream = self.stream(items)
        try:
            async for step in stream:
                for collected, element in zip(elements, step, strict=False):
                    collected.append(element)
        finally:
            await close_stream(stream)
        return elements

    def close(self) -> None:
        """Nothing to release."""

    def resize(self, workers: int) -> None:
        """No threads to size."""


async def close_stream(stream: AsyncIterator[Any]) -> None:
    """``await stream.aclose()`` when the stream has one (async generators do)."""
    aclose = getattr(stream, "aclose", None)
    if aclose is not None:
        await aclose()


def is_stream_callable(fn: Callable[..., Any]) -> bool:
    """True for async generator functions; plain functions annotated to return an async
    iterator (``-> AsyncIterator[...]``, as a type checker reads them); plain wrappers of
    either made with ``functools.wraps`` (a logging or tracing decorator: its calls return the
    wrapped one's generator); and objects whose ``__call__`` is one. An ``async def`` is never
    one, whatever it wraps: its calls return a coroutine."""
    if inspect.isasyncgenfunction(fn):
        return True
    if inspect.iscoroutinefunction(fn):
        return False
    unwrapped = inspect.unwrap(fn)
    if inspect.isasyncgenfunction(unwrapped) or _returns_async_iterator(unwrapped):
        return True
    call = getattr(fn, "__call__", None)  # noqa: B004 - we need the bound method itself
    return call is not None and inspect.isasyncgenfunction(call)


_ASYNC_ITERATORS = ("AsyncIterator", "AsyncGenerator", "AsyncIterable")


def _returns_async_iterator(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` is a plain function whose return annotation is an async iterator type
    (a string annotation is read by its name, without evaluating it)."""
    if not inspect.isfunction(fn) or inspect.iscoroutinefunction(fn):
        return False
    annotation = fn.__annotations__.get("return")
    if annotation is None:
        return False
    if isinstance(annotation, str):
        name = annotation.split("[", 1)[0].rsplit(".", 1)[-1].strip()
    else:
        origin = getattr(annotation, "__origin__", annotation)
        name = getattr(origin, "__name__", "")
    return name in _ASYNC_ITERATORS


def is_async_callable(fn: Callable[..., Any]) -> bool:
    """True for ``async def`` functions and objects whose ``__call__`` is ``async def``."""
    if inspect.iscoroutinefunction(fn):
        return True
    call = getattr(fn, "__call__", None)  # noqa: B004 - we need the bound method itself
    return call is not None and inspect.iscoroutinefunction(call)


def running_as(executor: BatchExecutor) -> str:
    """The kind ``executor`` runs the model as now: ``"stream"``, ``"async"``, ``"inline"``,
    ``"thread"`` or ``"cuda"`` (an ``"adaptive"`` one as ``"inline"`` or ``"thread"``, by where
    its calls go now; another object: its class's name)."""
    if isinstance(executor, AdaptiveExecutor):
        return "inline" if executor.inline else "thread"
    kinds: tuple[tuple[type, str], ...] = (
        (StreamExecutor, "stream"),
        (AsyncExecutor, "async"),
        (InlineExecutor, "inline"),
        (ThreadExecutor, "thread"),
        (CudaExecutor, "cuda"),
    )
    return next((kind for cls, kind in kinds if isinstance(executor, cls)), type(executor).__name__)


def make_executor(
    fn: Callable[[list[Any]], Any],
    kind: str,
    workers: int,
    event_factory: Callable[[], CompletionEvent] | None = None,
    name: str = "",
) -> BatchExecutor:
    """Build the executor for ``kind`` (``name``: the batcher's, for log events).

    ``"auto"`` picks :class:`StreamExecutor` for async generator models,
    :class:`AsyncExecutor` for ``async def`` models and :class:`ThreadExecutor` otherwise.
    ``"adaptive"`` is :class:`AdaptiveExecutor` (a worker thread, or the loop once warm-up
    finds the model's calls short).

    Raises:
        TypeError: ``kind`` is not a str (None included); an ``async def`` model with a sync
            executor kind, or the reverse; an async generator model with a kind other than
            ``"auto"`` or ``"async"``.
        ValueError: unknown ``kind``.
    """
    if not isinstance(kind, str):
        raise TypeError(
            f"executor must be a str, one of {', '.join(EXECUTOR_KINDS)}; got {type(kind).__name__}"
        )
    if kind not in EXECUTOR_KINDS:
        raise ValueError(f"executor must be one of {', '.join(EXECUTOR_KINDS)}; got {kind!r}")
    if is_stream_callable(fn):
        if kind not in ("auto", "async"):
            raise TypeError(
                f"executor={kind!r} cannot run an async generator model: it streams on the "
                "event loop, use 'auto' or 'async'"
            )
        return StreamExecutor(fn)
    is_async = is_async_callable(fn)
    if kind == "auto":
        kind = "async" if is_async else "thread"
    if kind == "async":
        if not is_async:
            raise TypeError("executor='async' needs an async def model")
        return AsyncExecutor(fn)
    if is_async:
        raise TypeError(f"executor={kind!r} needs a sync model; an async def model uses 'async'")
    if kind == "inline":
        return InlineExecutor(fn)
    if kind == "thread":
        return ThreadExecutor(fn, workers)
    if kind == "adaptive":
        return AdaptiveExecutor(fn, workers, name)
    return CudaExecutor(fn, event_factory, workers)

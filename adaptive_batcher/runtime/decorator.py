"""``@batched``: the batcher as a decorator on a batch function or method."""

from __future__ import annotations

import asyncio
import copy
import functools
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, Generic, Protocol, Self, TypeVar, overload

from adaptive_batcher.runtime.batcher import AdaptiveBatcher
from adaptive_batcher.runtime.executors import is_stream_callable
from adaptive_batcher.runtime.streaming import Stream

__all__ = ["BatchedDecorator", "BatchedFunction", "BatchedStream", "batched"]

X = TypeVar("X")
Y = TypeVar("Y")


class BatchedFunction(Generic[X, Y]):
    """A batch function turned into a per-item coroutine function.

    Calling it (``await f(item, deadline_ms=...)``) submits ``item`` to a batcher owned by this
    object: one batcher per event loop, and, on a method, one per instance. Options are those of
    :class:`~adaptive_batcher.AdaptiveBatcher`. The batchers of event loops that have been
    closed are released (their worker threads ended) when a batcher is made for a new loop, so
    a test suite that runs a loop per test keeps one batcher, not one per test.
    """

    def __init__(self, fn: Callable[..., Any], options: dict[str, Any]) -> None:
        functools.update_wrapper(self, fn)
        self._fn = fn
        self._options = options
        self._batchers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AdaptiveBatcher[X, Y]]
        self._batchers = weakref.WeakKeyDictionary()
        self._last: tuple[asyncio.AbstractEventLoop, AdaptiveBatcher[X, Y]] | None = None
        AdaptiveBatcher(fn, **options)  # validate the options now, not at the first call

    @property
    def batcher(self) -> AdaptiveBatcher[X, Y]:
        """The batcher serving the running event loop (created on first use)."""
        loop = asyncio.get_running_loop()
        last = self._last
        if last is not None and last[0] is loop and not last[1].closed:
            return last[1]
        batcher = self._batchers.get(loop)
        if batcher is None or batcher.closed:
            self._release_closed_loops()
            # a policy is stateful: every batcher gets its own copy
            batcher = AdaptiveBatcher(self._fn, **copy.deepcopy(self._options))
            self._batchers[loop] = batcher
        self._last = (loop, batcher)
        return batcher

    def _release_closed_loops(self) -> None:
        """Forget the batchers of event loops that were closed (an ``asyncio.run`` per test)
        and release their threads: the model's worker threads and the telemetry sampler. (A
        batcher holds its loop, so the weak mapping alone would keep them all.)"""
        for loop, batcher in list(self._batchers.items()):
            if loop.is_closed():
                del self._batchers[loop]
                batcher.abandon()

    async def __call__(self, item: X, *, deadline_ms: float | None = None) -> Y:
        return await self.batcher.submit(item, deadline_ms=deadline_ms)

    def set_limits(
        self,
        *,
        window_ms: float | None = None,
        max_batch_size: int | None = None,
        max_concurrent_batches: int | None = None,
    ) -> None:
        """Change window, cap or slots of this function's batchers, now and for those it makes
        later (one per event loop; on a method, this instance's only).

        ``max_batch_size`` becomes the hard cap as well (see
        :meth:`AdaptiveBatcher.set_hard_cap`), so it may go above the one decorated. Call it
        from the thread of the batchers' event loop.

        Raises:
            TypeError, ValueError: as the constructor of :class:`AdaptiveBatcher` (the message
                names the setting); nothing is changed then.
        """
        changes = {
            name: value
            for name, value in (
                ("window_ms", window_ms),
                ("max_batch_size", max_batch_size),
                ("max_concurrent_batches", max_concurrent_batches),
            )
            if value is not None
        }
        options = {**self._options, **changes}
        AdaptiveBatcher(self._fn, **options)  # validate before changing anything
        self._options = options
        for batcher in list(self._batchers.values()):
            if batcher.closed:
                continue
            if max_batch_size is not None:
                batcher.set_hard_cap(max_batch_size)
            batcher.set_limits(
                window_ms=window_ms,
                max_batch_size=max_batch_size,
                max_concurrent_batches=max_concurrent_batches,
            )

    async def aclose(self, *, drain: bool = True, timeout_s: float | None = None) -> None:
        """Close the batcher of the running loop (a later call starts a new one); ``drain``
        and ``timeout_s`` as for :meth:`AdaptiveBatcher.aclose` (a hung model's callers fail
        with ``BatcherClosedError`` once ``timeout_s`` runs out)."""
        loop = asyncio.get_running_loop()
        batcher = self._batchers.get(loop)
        self._last = None
        if batcher is None:
            return
        try:  # kept meanwhile, so that a second close waits for this one (a call opens anew)
            await batcher.aclose(drain=drain, timeout_s=timeout_s)
        finally:
            if self._batchers.get(loop) is batcher:
                del self._batchers[loop]

    def __get__(self, instance: object, owner: type | None = None) -> Self:
        if instance is None:
            return self
        key = f"__batched_{self._fn.__name__}"
        try:
            namespace = instance.__dict__
        except AttributeError:
            raise TypeError(
                f"@batched on a method needs instances with a __dict__ to keep their batcher; "
                f"{type(instance).__name__} uses __slots__ without __dict__"
            ) from None
        bound: Self | None = namespace.get(key)
        if bound is None:
            bound = type(self)(self._fn.__get__(instance, owner), self._options)
            namespace[key] = bound
        return bound


class BatchedStream(BatchedFunction[X, Y]):
    """A streaming batch function (an async generator) turned into a per-item stream.

    Calling it (``f(item, deadline_ms=...)``, no ``await``) queues ``item`` at once and returns
    its stream: ``async for element in f(item)``. Everything else is as for
    :class:`BatchedFunction`; see :meth:`AdaptiveBatcher.submit_stream` for how a stream ends.
    """

    def __call__(  # type: ignore[override]
        self, item: X, *, deadline_ms: float | None = None
    ) -> Stream[Y]:
        return self.batcher.submit_stream(item, deadline_ms=deadline_ms)


class BatchedDecorator(Protocol):
    """What ``batched(...)`` returns: it turns a batch function into a :class:`BatchedStream`
    (an async generator function or method, or a function annotated to return an async
    iterator) or a :class:`BatchedFunction` (any other), typed by the function's item and
    result types where its results are a sequence (a function returning one tensor or array
    for the batch is ``BatchedFunction[Any, Any]``)."""

    @overload
    def __call__(
        self, fn: Callable[[list[X]], AsyncIterator[Sequence[Y]]]
    ) -> BatchedStream[X, Y]: ...
    @overload
    def __call__(
        self, fn: Callable[[Any, list[X]], AsyncIterator[Sequence[Y]]]
    ) -> BatchedStream[X, Y]: ...
    @overload
    def __call__(
        self, fn: Callable[[list[X]], Awaitable[Sequence[Y]] | Sequence[Y]]
    ) -> BatchedFunction[X, Y]: ...
    @overload
    def __call__(
        self, fn: Callable[[Any, list[X]], Awaitable[Sequence[Y]] | Sequence[Y]]
    ) -> BatchedFunction[X, Y]: ...
    @overload
    def __call__(self, fn: Callable[..., Any]) -> BatchedFunction[Any, Any]: ...
    def __call__(self, fn: Callable[..., Any]) -> BatchedFunction[Any, Any]: ...


def batched(**options: Any) -> BatchedDecorator:
    """Decorate ``fn(batch: list[X]) -> list[Y]`` (sync or async; function or method).

    An async generator function (each ``yield`` one element per item) becomes a
    :class:`BatchedStream`: ``async for token in generate("prompt")``.

    Example::

        @batched(max_batch_size=64, window_ms=2.0)
        async def embed(texts: list[str]) -> list[list[float]]: ...

        vector = await embed("hello")      # one item in, its own result out
        await embed.aclose()

    Raises:
        TypeError, ValueError: invalid options, at decoration time.
    """

    def decorate(fn: Callable[..., Any]) -> BatchedFunction[Any, Any]:
        if is_stream_callable(fn):
            return BatchedStream(fn, options)
        return BatchedFunction(fn, options)

    return decorate  # type: ignore[return-value]  # the overloads narrow what decorate returns

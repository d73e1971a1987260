"""``@batched``: the batcher as a decorator on a batch function or method."""

from __future__ import annotations

import asyncio
import copy
import functools
import weakref
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from adaptive_batcher.runtime.batcher import AdaptiveBatcher

__all__ = ["BatchedFunction", "batched"]

X = TypeVar("X")
Y = TypeVar("Y")


class BatchedFunction(Generic[X, Y]):
    """A batch function turned into a per-item coroutine function.

    Calling it (``await f(item, deadline_ms=...)``) submits ``item`` to a batcher owned by this
    object: one batcher per event loop, and, on a method, one per instance. Options are those of
    :class:`~adaptive_batcher.AdaptiveBatcher`.
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
            # a policy is stateful: every batcher gets its own copy
            batcher = AdaptiveBatcher(self._fn, **copy.deepcopy(self._options))
            self._batchers[loop] = batcher
        self._last = (loop, batcher)
        return batcher

    async def __call__(self, item: X, *, deadline_ms: float | None = None) -> Y:
        return await self.batcher.submit(item, deadline_ms=deadline_ms)

    async def aclose(self, *, drain: bool = True) -> None:
        """Close the batcher of the running loop (a later call starts a new one)."""
        loop = asyncio.get_running_loop()
        batcher = self._batchers.pop(loop, None)
        self._last = None
        if batcher is not None:
            await batcher.aclose(drain=drain)

    def __get__(self, instance: object, owner: type | None = None) -> BatchedFunction[X, Y]:
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
        bound: BatchedFunction[X, Y] | None = namespace.get(key)
        if bound is None:
            bound = BatchedFunction(self._fn.__get__(instance, owner), self._options)
            namespace[key] = bound
        return bound


def batched(**options: Any) -> Callable[[Callable[..., Any]], BatchedFunction[Any, Any]]:
    """Decorate ``fn(batch: list[X]) -> list[Y]`` (sync or async; function or method).

    Example::

        @batched(max_batch_size=64, window_ms=2.0)
        async def embed(texts: list[str]) -> list[list[float]]: ...

        vector = await embed("hello")      # one item in, its own result out
        await embed.aclose()

    Raises:
        TypeError, ValueError: invalid options, at decoration time.
    """

    def decorate(fn: Callable[..., Any]) -> BatchedFunction[Any, Any]:
        return BatchedFunction(fn, options)

    return decorate

"""``batch``: Ray Serve's ``@serve.batch``, with the same signature and semantics, on our batcher.

Swap ``@serve.batch`` for ``@batch`` (``from adaptive_batcher.ray import batch``) and a
deployment keeps working: the same arguments (``max_batch_size``, ``batch_wait_timeout_s``,
``max_concurrent_batches``, ``batch_size_fn``), one list per parameter for multi-argument and
keyword calls, the model's own exception raised to every caller of a failed batch, streaming
handlers (async generators, ``StopIteration`` in a slot ends that caller's stream), the setters
``set_max_batch_size`` / ``set_batch_wait_timeout_s`` / ``set_max_concurrent_batches`` (above the
first cap too) and a ``RuntimeError`` for an item larger than the cap. Each handler runs on an
:class:`~adaptive_batcher.AdaptiveBatcher`, so our options apply as well: ``slo=`` and
``policy=`` tune window and cap online, ``shed_late=`` sheds requests that can no longer meet
the SLO, ``deadline_ms=`` bounds each request's wait.

Differences from Ray Serve (the Ray guide of the documentation gives the reasons): one batcher
per instance and per event loop (Ray shares one queue per method across instances and answers
with the first request's ``self``); setters apply to the batch being collected too; an
exception instance in a result slot is raised to that caller (Ray hands it over as a value);
``batch_size_fn`` is called on one item at a time and its sizes are added up.
"""

from __future__ import annotations

import functools
import inspect
import weakref
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol, cast, overload

from adaptive_batcher._validate import check_number
from adaptive_batcher.control.policy import Policy
from adaptive_batcher.control.types import Bounds
from adaptive_batcher.errors import BatcherError
from adaptive_batcher.ray._calls import CallShape
from adaptive_batcher.ray._replica import warn_if_cap_unreachable
from adaptive_batcher.ray.errors import serve_error
from adaptive_batcher.runtime.batcher import AdaptiveBatcher
from adaptive_batcher.runtime.decorator import BatchedFunction, BatchedStream
from adaptive_batcher.runtime.executors import close_stream
from adaptive_batcher.slo import SLO

__all__ = ["BatchHandler", "batch"]

DEFAULT_MAX_BATCH_SIZE = 10
"""Ray Serve's default ``max_batch_size``."""

DEFAULT_BATCH_WAIT_TIMEOUT_S = 0.01
"""Ray Serve's default ``batch_wait_timeout_s``, seconds."""


class BatchHandler(Protocol):
    """What :func:`batch` returns: the handler, called once per caller, with Ray's setters.

    Called as the decorated function is, with one value per parameter (``await f(x)``; a
    streaming handler returns its caller's stream at once: ``async for y in f(x)``). On a
    method, the setters act on the batchers of every instance (as Ray's do); ``get_batcher``
    and ``aclose`` take the instance.
    """

    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...

    def set_max_batch_size(self, max_batch_size: int) -> None:
        """Set the batch cap (the hard cap too: it may go above the first one).

        Raises:
            TypeError, ValueError: not an int >= 1 (an integral float is taken).
        """

    def set_batch_wait_timeout_s(self, batch_wait_timeout_s: float) -> None:
        """Set the window: the longest wait of the oldest request for company, seconds.

        Raises:
            TypeError, ValueError: not a finite number >= 0.
        """

    def set_max_concurrent_batches(self, max_concurrent_batches: int) -> None:
        """Set how many batches may run at once.

        Raises:
            TypeError, ValueError: not an int >= 1.
        """

    def get_batcher(self, instance: object | None = None) -> AdaptiveBatcher[Any, Any]:
        """The batcher serving the running event loop (for a method: ``instance``'s)."""

    async def aclose(self, instance: object | None = None, *, drain: bool = True) -> None:
        """Close the batcher of the running event loop (a later call starts a new one)."""


@overload
def batch(_func: Callable[..., Any], /) -> BatchHandler: ...


@overload
def batch(
    _func: None = None,
    /,
    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
    batch_wait_timeout_s: float = DEFAULT_BATCH_WAIT_TIMEOUT_S,
    max_concurrent_batches: int = 1,
    batch_size_fn: Callable[[list[Any]], int] | None = None,
    *,
    slo: SLO | None = None,
    policy: Policy | None = None,
    shed_late: bool = False,
    deadline_ms: float | None = None,
    max_queue_size: int | None = None,
    bounds: Bounds | None = None,
    name: str | None = None,
) -> Callable[[Callable[..., Any]], BatchHandler]: ...


def batch(
    _func: Callable[..., Any] | None = None,
    /,
    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
    batch_wait_timeout_s: float = DEFAULT_BATCH_WAIT_TIMEOUT_S,
    max_concurrent_batches: int = 1,
    batch_size_fn: Callable[[list[Any]], int] | None = None,
    *,
    slo: SLO | None = None,
    policy: Policy | None = None,
    shed_late: bool = False,
    deadline_ms: float | None = None,
    max_queue_size: int | None = None,
    bounds: Bounds | None = None,
    name: str | None = None,
) -> Any:
    """Turn an ``async def`` batch function or method into a per-caller one (``@serve.batch``).

    Used bare (``@batch``) or with arguments (``@batch(max_batch_size=8)``). The handler takes
    a list per parameter and returns a list with one result per caller, in order; an async
    generator handler yields such a list per step (see
    :mod:`adaptive_batcher.runtime.streaming`).

    Args:
        _func: the handler, when used bare.
        max_batch_size: the batch cap, in callers (or in ``batch_size_fn`` units). Default 10.
        batch_wait_timeout_s: the window: the longest wait of the oldest caller for company,
            seconds. Default 0.01.
        max_concurrent_batches: batches that may run at once. Default 1.
        batch_size_fn: ``batch_size_fn(items) -> int``, the size of a list of first arguments;
            called with one item at a time, the sizes added (so it must be additive, like a
            sum of tokens). An item larger than the cap raises ``RuntimeError``
            (:class:`~adaptive_batcher.ray.errors.ItemTooLargeForBatchError`).
        slo: as for :class:`~adaptive_batcher.AdaptiveBatcher`: with an SLO the window and
            cap are tuned online, within the cap set here.
        policy: the control law, as for ``AdaptiveBatcher``.
        shed_late: SLO-aware shedding, as for ``AdaptiveBatcher``.
        max_queue_size: the bounded queue, as for ``AdaptiveBatcher``.
        bounds: the controller's range, as for ``AdaptiveBatcher``.
        deadline_ms: each call fails with ``DeadlineExceededError`` if its batch has not
            started within this many ms.
        name: the ``batcher`` field of log events (default: the handler's qualified name).

    Raises:
        TypeError: the handler is not ``async def`` (nor an async generator function), or an
            argument of the wrong type (the message names it).
        ValueError: an argument out of range (the message names it).

    A call raises what the handler raised for its batch, :class:`BatchSizeMismatchError` for a
    wrong number of results, or our typed errors (``DeadlineExceededError``,
    ``QueueFullError``, ``BatcherClosedError``).
    """
    if _func is not None:
        _check_handler(_func)
    settings = _Settings(
        _check_max_batch_size(max_batch_size),
        _check_wait_timeout(batch_wait_timeout_s),
        _check_concurrency(max_concurrent_batches),
    )
    if batch_size_fn is not None and not callable(batch_size_fn):
        raise TypeError(f"batch_size_fn must be callable or None, got {type(batch_size_fn)}")
    options: dict[str, Any] = {
        "slo": slo,
        "policy": policy,
        "shed_late": shed_late,
        "max_queue_size": max_queue_size,
        "bounds": bounds,
    }

    def decorate(fn: Callable[..., Any]) -> BatchHandler:
        _check_handler(fn)
        handler = _Handler(fn, settings, batch_size_fn, options, deadline_ms, name)
        return handler.wrapper()

    return decorate(_func) if _func is not None else decorate


class _Settings:
    """Ray's three settings of one handler, as set last."""

    def __init__(self, max_batch_size: int, wait_s: float, concurrent: int) -> None:
        self.max_batch_size = max_batch_size
        self.batch_wait_timeout_s = wait_s
        self.max_concurrent_batches = concurrent


class _Bound:
    """One handler's batchers for one instance (or for the function): per event loop."""

    __slots__ = ("__weakref__", "batched", "shape")

    def __init__(self, batched: BatchedFunction[Any, Any], shape: CallShape) -> None:
        self.batched = batched
        self.shape = shape


class _Handler:
    """The state behind a decorated handler: its settings, and its batchers per instance."""

    def __init__(
        self,
        fn: Callable[..., Any],
        settings: _Settings,
        batch_size_fn: Callable[[list[Any]], int] | None,
        options: dict[str, Any],
        deadline_ms: float | None,
        name: str | None,
    ) -> None:
        self.fn = fn
        self.settings = settings
        self.batch_size_fn = batch_size_fn
        self.name = str(name or getattr(fn, "__qualname__", "batch"))
        self.options = {**options, "name": self.name}
        self.deadline_ms = deadline_ms
        self.streams = inspect.isasyncgenfunction(fn)
        self.is_method = _defined_in_class(fn)
        self.key = f"__serve_batch_{getattr(fn, '__name__', 'handler')}"
        self.function: _Bound | None = None
        self.bound: weakref.WeakSet[_Bound] = weakref.WeakSet()
        if deadline_ms is not None:
            check_number("deadline_ms", deadline_ms, 0.0, strict=True)
        AdaptiveBatcher(fn, **self.batcher_options(None))  # the options are checked now

    # -- per call --------------------------------------------------------------------------

    def route(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[_Bound, Any]:
        """The batchers that serve this call and the call's item."""
        if self.is_method:
            if not args:
                raise TypeError(f"{self.name}() is a method: call it on an instance")
            bound = self.for_instance(args[0])
            return bound, bound.shape.item(args[1:], kwargs)
        bound = self.function or self.for_function()
        return bound, bound.shape.item(args, kwargs)

    def for_function(self) -> _Bound:
        if self.function is None:
            self.function = self.make(self.fn)
        return self.function

    def for_instance(self, instance: object) -> _Bound:
        try:
            namespace = instance.__dict__
        except AttributeError:
            raise TypeError(
                f"@batch on a method needs instances with a __dict__ to keep their batcher; "
                f"{type(instance).__name__} uses __slots__ without __dict__"
            ) from None
        bound: _Bound | None = namespace.get(self.key)
        if bound is None:
            bound = self.make(self.fn.__get__(instance, type(instance)))
            namespace[self.key] = bound
        return bound

    def make(self, fn: Callable[..., Any]) -> _Bound:
        shape = CallShape(fn)
        model = fn if shape.single else _batch_call(fn, shape, self.streams)
        kind = BatchedStream if self.streams else BatchedFunction
        bound = _Bound(kind(model, self.batcher_options(shape)), shape)
        self.bound.add(bound)
        self.warn_if_unreachable()
        return bound

    def batcher_options(self, shape: CallShape | None) -> dict[str, Any]:
        settings = self.settings
        options = {
            **self.options,
            "max_batch_size": settings.max_batch_size,
            "window_ms": settings.batch_wait_timeout_s * 1e3,
            "max_concurrent_batches": settings.max_concurrent_batches,
        }
        if self.batch_size_fn is not None:
            options["size_fn"] = _size_fn(self.batch_size_fn, shape)
        return options

    # -- setters ---------------------------------------------------------------------------

    def set_max_batch_size(self, max_batch_size: int) -> None:
        cap = _check_max_batch_size(max_batch_size)
        for bound in list(self.bound):
            bound.batched.set_limits(max_batch_size=cap)
        self.settings.max_batch_size = cap
        self.warn_if_unreachable()

    def set_batch_wait_timeout_s(self, batch_wait_timeout_s: float) -> None:
        wait_s = _check_wait_timeout(batch_wait_timeout_s)
        for bound in list(self.bound):
            bound.batched.set_limits(window_ms=wait_s * 1e3)
        self.settings.batch_wait_timeout_s = wait_s

    def set_max_concurrent_batches(self, max_concurrent_batches: int) -> None:
        slots = _check_concurrency(max_concurrent_batches)
        for bound in list(self.bound):
            bound.batched.set_limits(max_concurrent_batches=slots)
        self.settings.max_concurrent_batches = slots
        self.warn_if_unreachable()

    def warn_if_unreachable(self) -> None:
        settings = self.settings
        warn_if_cap_unreachable(self.name, settings.max_batch_size, settings.max_concurrent_batches)

    # -- the handler -----------------------------------------------------------------------

    def get_batcher(self, instance: object | None = None) -> AdaptiveBatcher[Any, Any]:
        bound = self.for_function() if instance is None else self.for_instance(instance)
        return bound.batched.batcher

    async def aclose(self, instance: object | None = None, *, drain: bool = True) -> None:
        bound = self.for_function() if instance is None else self.for_instance(instance)
        await bound.batched.aclose(drain=drain)

    def wrapper(self) -> BatchHandler:
        wrapper = self.stream_wrapper() if self.streams else self.call_wrapper()
        for attribute in (
            "set_max_batch_size",
            "set_batch_wait_timeout_s",
            "set_max_concurrent_batches",
            "get_batcher",
            "aclose",
        ):
            setattr(wrapper, attribute, getattr(self, attribute))
        settings = self.settings
        # Ray's getters, read by code written for Ray Serve
        setattr(wrapper, "_get_max_batch_size", lambda: settings.max_batch_size)  # noqa: B010
        setattr(wrapper, "_get_batch_wait_timeout_s", lambda: settings.batch_wait_timeout_s)  # noqa: B010
        setattr(wrapper, "_get_max_concurrent_batches", lambda: settings.max_concurrent_batches)  # noqa: B010
        return cast(BatchHandler, wrapper)

    def call_wrapper(self) -> Callable[..., Any]:
        route = self.route
        deadline_ms = self.deadline_ms

        @functools.wraps(self.fn)
        async def batch_handler(*args: Any, **kwargs: Any) -> Any:
            bound, item = route(args, kwargs)
            try:
                return await bound.batched.batcher.submit(item, deadline_ms=deadline_ms)
            except BatcherError as exc:
                error = serve_error(exc)
            raise error

        return batch_handler

    def stream_wrapper(self) -> Callable[..., Any]:
        route = self.route
        deadline_ms = self.deadline_ms

        @functools.wraps(self.fn)
        def batch_handler(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
            bound, item = route(args, kwargs)  # a bad call raises here, as in Ray
            try:
                stream = bound.batched.batcher.submit_stream(item, deadline_ms=deadline_ms)
            except BatcherError as exc:  # raised at the first read, as in Ray
                return _failed_stream(serve_error(exc))
            return _serve_stream(stream)

        return batch_handler


def _batch_call(fn: Callable[..., Any], shape: CallShape, streams: bool) -> Callable[..., Any]:
    """The model for a handler with several parameters: one list per argument."""
    if streams:

        async def stream_columns(items: list[Any]) -> AsyncIterator[Any]:
            args, kwargs = shape.columns(items)
            stream = fn(*args, **kwargs)
            try:
                async for step in stream:
                    yield step
            finally:
                await close_stream(stream)

        return stream_columns

    async def call_columns(items: list[Any]) -> Any:
        args, kwargs = shape.columns(items)
        return await fn(*args, **kwargs)

    return call_columns


def _size_fn(
    batch_size_fn: Callable[[list[Any]], int], shape: CallShape | None
) -> Callable[[Any], int]:
    if shape is None:
        return lambda item: batch_size_fn([item])
    first = shape.first_argument
    return lambda item: batch_size_fn([first(item)])


async def _serve_stream(stream: AsyncIterator[Any]) -> AsyncIterator[Any]:
    """``stream`` with our errors turned into Ray Serve's (see ``serve_error``)."""
    error: Exception | None = None
    try:
        async for element in stream:
            yield element
    except BatcherError as exc:
        error = serve_error(exc)
    finally:
        await close_stream(stream)
    if error is not None:
        raise error


async def _failed_stream(error: Exception) -> AsyncIterator[Any]:
    """A stream that raises ``error`` at its first read."""
    raise error
    yield  # type: ignore[unreachable]  # pragma: no cover - makes this an async generator


def _defined_in_class(fn: Callable[..., Any]) -> bool:
    """True for a function defined in a class body (a method), from its qualified name."""
    parts = getattr(fn, "__qualname__", "").split(".")
    return len(parts) >= 2 and parts[-2] != "<locals>"


def _check_handler(fn: object) -> None:
    if not callable(fn):
        raise TypeError(f"@batch can only decorate functions or methods, got {type(fn).__name__}")
    if not (inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn)):
        raise TypeError(
            "Functions decorated with @batch must be 'async def' (a coroutine or an async "
            f"generator function), got {getattr(fn, '__qualname__', fn)!r}"
        )


def _check_max_batch_size(value: object) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"max_batch_size must be an integer >= 1, got {value!r}")
    if value < 1:
        raise ValueError(f"max_batch_size must be an integer >= 1, got {value!r}")
    return value


def _check_wait_timeout(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"batch_wait_timeout_s must be a number >= 0, got {value!r}")
    if not 0 <= value < float("inf"):
        raise ValueError(f"batch_wait_timeout_s must be a finite number >= 0, got {value!r}")
    return float(value)


def _check_concurrency(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"max_concurrent_batches must be an integer >= 1, got {value!r}")
    if value < 1:
        raise ValueError(f"max_concurrent_batches must be an integer >= 1, got {value!r}")
    return value

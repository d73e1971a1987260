"""The event loop's clock and future factory as plain callables, and the loop-level helpers the
runtime's modules share."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from typing import Any

__all__ = ["cancelling", "loop_shortcuts", "raise_in_loop"]


def loop_shortcuts(
    loop: asyncio.AbstractEventLoop,
) -> tuple[Callable[[], float], Callable[[], asyncio.Future[Any]]]:
    """The batcher's clock and ``loop.create_future`` as plain callables.

    The clock is ``time.monotonic`` on asyncio's own loops (whose ``time()`` only calls it) and
    on uvloop's (whose ``time()`` is a cached millisecond clock on the same monotonic clock);
    other loops keep their own ``time()`` (a virtual clock in tests). ``Future(loop=loop)`` is
    called directly on asyncio's loops. See docs/architecture.md, "The runtime hot path"."""
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
    raise exc


def raise_in_loop(exc: BaseException) -> None:
    """Raise ``exc`` from a callback of the running loop: asyncio lets ``KeyboardInterrupt``
    and ``SystemExit`` from a callback leave ``run_forever`` (and so ``asyncio.run``)."""
    asyncio.get_running_loop().call_soon(_raise, exc)


def cancelling() -> bool:
    """True when the current task has been asked to cancel (as opposed to a future it awaits
    being cancelled by someone else)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0

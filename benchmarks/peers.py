"""The same job behind each batcher: ours, the two small peers on PyPI, and a bare future.

Each factory returns ``(submit, close)`` for a batch function, all configured alike: a batch cap,
a window, one batch at a time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from adaptive_batcher import AdaptiveBatcher

Submit = Callable[[Any], Awaitable[Any]]
Close = Callable[[], Awaitable[None]]
BatchFn = Callable[[list[Any]], list[Any]]


def ours(fn: BatchFn, cap: int, window_ms: float, executor: str) -> tuple[Submit, Close]:
    batcher = AdaptiveBatcher(fn, max_batch_size=cap, window_ms=window_ms, executor=executor)
    return batcher.submit, batcher.aclose


def async_batcher(fn: BatchFn, cap: int, window_ms: float, executor: str) -> tuple[Submit, Close]:
    """``async-batcher`` (PyPI): a sync process_batch runs in the default thread pool."""
    from async_batcher.batcher import AsyncBatcher

    if executor == "inline":

        class Peer(AsyncBatcher[Any, Any]):
            async def process_batch(self, batch: list[Any]) -> list[Any]:
                return fn(batch)
    else:

        class Peer(AsyncBatcher[Any, Any]):  # type: ignore[no-redef]
            def process_batch(self, batch: list[Any]) -> list[Any]:
                return fn(batch)

    peer = Peer(max_batch_size=cap, max_queue_time=window_ms / 1e3, concurrency=1)

    async def close() -> None:
        await peer.stop()

    return peer.process, close


def batched_peer(fn: BatchFn, cap: int, window_ms: float, executor: str) -> tuple[Submit, Close]:
    """``batched`` (PyPI) ``aio.dynamically``; its sync path runs the function in a thread."""
    import batched

    if executor == "inline":

        async def run(items: list[Any]) -> list[Any]:
            return fn(items)

        wrapped = batched.aio.dynamically(run, batch_size=cap, timeout_ms=window_ms)
    else:
        wrapped = batched.aio.dynamically(fn, batch_size=cap, timeout_ms=window_ms)

    async def close() -> None:
        return None

    return wrapped, close


def bare_future(fn: BatchFn, cap: int, window_ms: float, executor: str) -> tuple[Submit, Close]:
    """No batcher at all: each request is a future resolved on the next loop iteration."""
    del fn, cap, window_ms, executor

    async def submit(item: Any) -> Any:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        loop.call_soon(future.set_result, item)
        return await future

    async def close() -> None:
        return None

    return submit, close


PEERS = {
    "adaptive_batcher": ours,
    "async-batcher": async_batcher,
    "batched": batched_peer,
}

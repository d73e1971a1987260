"""The same job behind each batcher: ours, the two small peers on PyPI, and a bare future.

Each factory returns ``(submit, close)`` for a batch function, all configured alike: a batch cap,
a window, one batch at a time.
"""

from __future__ import annotations

import asyncio
import importlib.util
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


def _model_call(fn: BatchFn, executor: str) -> Callable[[list[Any]], Awaitable[list[Any]]]:
    """An ``async def`` handler (all ``@serve.batch`` takes): inline, or in a worker thread."""
    if executor == "inline":

        async def inline(items: list[Any]) -> list[Any]:
            return fn(items)

        return inline

    async def in_thread(items: list[Any]) -> list[Any]:
        return await asyncio.to_thread(fn, items)

    return in_thread


def _fake_replica_context() -> None:
    """Ray Serve's replica context, set as Ray's own unit tests of ``@serve.batch`` set it: the
    decorator reads it, and no cluster is started."""
    from ray import serve
    from ray.serve._private.common import DeploymentID, ReplicaID
    from ray.serve._private.config import DeploymentConfig

    if serve.context._get_internal_replica_context() is None:
        serve.context._set_internal_replica_context(
            replica_id=ReplicaID(unique_id="bench", deployment_id=DeploymentID(name="bench")),
            servable_object=None,
            _deployment_config=DeploymentConfig(max_ongoing_requests=1_000_000),
            rank=0,
            world_size=1,
            code_version="bench",
        )


def ray_serve_batch(fn: BatchFn, cap: int, window_ms: float, executor: str) -> tuple[Submit, Close]:
    """Ray Serve's ``@serve.batch`` (``ray[serve]``), on the benchmark's loop, no cluster."""
    from ray import serve

    _fake_replica_context()
    handler = serve.batch(max_batch_size=cap, batch_wait_timeout_s=window_ms / 1e3)(
        _model_call(fn, executor)
    )

    async def close() -> None:
        # the queue's background task, reached through a setter bound to Ray's queue wrapper
        queue = handler.set_max_batch_size.__self__._queue
        if queue is not None and queue._handle_batch_task is not None:
            queue._handle_batch_task.cancel()
            await asyncio.gather(queue._handle_batch_task, return_exceptions=True)

    return handler, close


def ours_for_ray(fn: BatchFn, cap: int, window_ms: float, executor: str) -> tuple[Submit, Close]:
    """Our drop-in for ``@serve.batch`` (``adaptive_batcher.ray.batch``), configured alike."""
    from adaptive_batcher.ray import batch

    handler = batch(max_batch_size=cap, batch_wait_timeout_s=window_ms / 1e3)(
        _model_call(fn, executor)
    )

    async def close() -> None:
        await handler.aclose()

    return handler, close


PEERS = {
    "adaptive_batcher": ours,
    "async-batcher": async_batcher,
    "batched": batched_peer,
}
if importlib.util.find_spec("ray") is not None:  # the ray extra: Ray Serve's decorator and ours
    PEERS["ray.serve.batch"] = ray_serve_batch
    PEERS["adaptive_batcher.ray.batch"] = ours_for_ray

"""One request's stream through the gate: what
:meth:`~adaptive_batcher.gateway.shell.LLMGate.submit` returns.

The stream is the caller's side only: the gate (:mod:`adaptive_batcher.gateway.shell`) admits
it, fills it with the engine's chunks and ends it; the stream waits, hands out chunks and the
ending error, and tells the gate when its caller goes away.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Final, Protocol

from adaptive_batcher.errors import BatcherClosedError, ConcurrentReadError
from adaptive_batcher.gateway.types import Chunk, LLMRequest, Usage
from adaptive_batcher.llm.gate import GateRequest

__all__ = ["OUTCOMES", "GateStream", "StreamOwner"]

OUTCOMES: Final = ("completed", "rejected", "expired", "failed", "cancelled")
"""How a request can end (:attr:`GateStream.outcome`); the five endings of
:class:`~adaptive_batcher.llm.gate.GateCounts`."""


class StreamOwner(Protocol):
    """What a :class:`GateStream` asks of its gate."""

    def _cancel(self, stream: GateStream) -> None:
        """The stream's caller is gone: end the request, start its upstream abort."""
        ...

    async def _wait_for_abort(self, task: asyncio.Task[None]) -> None:
        """Wait (bounded) for the engine stream's task to wind down."""
        ...


class GateStream:
    """One request's way through the gate: an async iterator of the engine's
    :class:`~adaptive_batcher.gateway.types.Chunk` objects, and an async context manager that
    closes it on exit.

    Made by :meth:`~adaptive_batcher.gateway.shell.LLMGate.submit`. One task reads it at a
    time (a second concurrent reader gets
    :class:`~adaptive_batcher.errors.ConcurrentReadError`). Cancelling the task that waits in
    :meth:`admitted` or :meth:`__anext__` counts as the caller going away: the request is
    cancelled as by :meth:`aclose` (without waiting for the upstream abort).

    Attributes:
        request: the request as submitted.
        usage: the engine's token counts, once a chunk carried them (the last), else None.
    """

    __slots__ = (
        "_admitted",
        "_chunks",
        "_closed",
        "_error",
        "_finished",
        "_first_token_s",
        "_gate",
        "_handle",
        "_last_token_s",
        "_outcome",
        "_raised",
        "_task",
        "_tokens",
        "_waiter",
        "request",
        "usage",
    )

    def __init__(self, gate: StreamOwner, request: LLMRequest) -> None:
        self._gate = gate
        self.request = request
        self.usage: Usage | None = None
        self._handle: GateRequest[GateStream] | None = None
        self._admitted = False
        self._closed = False  # its caller closed it
        self._finished = False  # the engine's stream ended normally
        self._outcome: str | None = None
        self._error: BaseException | None = None
        self._raised = False  # __anext__ raised the error (once)
        self._chunks: deque[Chunk] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._tokens = 0
        self._first_token_s: float | None = None
        self._last_token_s: float | None = None

    # -- what the caller sees ----------------------------------------------------------------

    @property
    def outcome(self) -> str | None:
        """How the request ended (one of :data:`OUTCOMES`), None while it is live."""
        return self._outcome

    @property
    def tokens(self) -> int:
        """Output tokens: the usage's completion tokens once the engine sent them (exact),
        else those the chunks counted so far (an engine that packs several tokens in one
        event, as vLLM does when its API server falls behind, is undercounted until then)."""
        usage = self.usage
        return self._tokens if usage is None else usage.completion_tokens

    async def admitted(self) -> None:
        """Wait until the request is forwarded to the engine (returns at once if it was).

        Raises:
            GateRejectedError: refused at once
                (:class:`~adaptive_batcher.llm.errors.TTFTUnreachableError`,
                :class:`~adaptive_batcher.llm.errors.GateQueueFullError`; ``retry_after_s``
                and ``http_status`` tell the caller when to retry and what to answer).
            DeadlineExceededError: it expired waiting (its ``timeout_s``, or the gate shed it
                because its first token could no longer come in time).
            BatcherClosedError: the gate closed (without draining) before admitting it, or the
                stream was closed.
            ConcurrentReadError: another task is waiting on the stream.
        """
        while not self._admitted:
            error = self._error
            if error is not None:
                raise error
            if self._closed:
                raise BatcherClosedError("the stream was closed before it was admitted")
            await self._wait()

    def __aiter__(self) -> GateStream:
        return self

    async def __anext__(self) -> Chunk:
        """The next chunk; waits for admission first. Chunks that arrived before an error are
        handed out before it; the error is raised once, then the stream is exhausted.

        Raises:
            StopAsyncIteration: the stream ended (or was closed).
            GateRejectedError, DeadlineExceededError, BatcherClosedError: as :meth:`admitted`
                (:class:`~adaptive_batcher.errors.DeadlineExceededError` too when the deadline
                passed while it ran; ``BatcherClosedError`` when the gate's close cut it off).
            RequestFailedError: the engine failed it; ``cause`` is the engine's exception (an
                :class:`~adaptive_batcher.gateway.errors.UpstreamError` from an HTTP adapter).
            ConcurrentReadError: another task is reading the stream.
        """
        while True:
            if self._closed:
                raise StopAsyncIteration
            chunks = self._chunks
            if chunks:
                return chunks.popleft()
            error = self._error
            if error is not None:
                if self._raised:
                    raise StopAsyncIteration
                self._raised = True
                raise error
            if self._finished:
                raise StopAsyncIteration
            await self._wait()

    async def aclose(self) -> None:
        """The caller is gone: free the request's place (in the queue or its engine slot) and
        abort it upstream (the engine's iterator is closed), waiting for the abort at most the
        gate's ``abort_timeout_s``. Idempotent; safe before admission, mid-stream and after
        the end (then it only drops unread chunks)."""
        self._gate._cancel(self)
        task = self._task
        if task is not None and not task.done():
            await self._gate._wait_for_abort(task)

    async def __aenter__(self) -> GateStream:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"GateStream(outcome={self._outcome!r}, tokens={self._tokens})"

    # -- internals -------------------------------------------------------------------------

    async def _wait(self) -> None:
        if self._waiter is not None:
            raise ConcurrentReadError("another task is waiting on this stream")
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiter = waiter
        try:
            await waiter
        except asyncio.CancelledError:
            self._gate._cancel(self)  # the caller's task is cancelled: the caller is gone
            raise
        finally:
            self._waiter = None

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

"""What flows between the gate's asyncio shell and an engine adapter.

An engine adapter turns one :class:`LLMRequest` into an async iterator of :class:`Chunk`;
closing that iterator early (``aclose()``, or cancelling the task that iterates it) is the
abort: the adapter must stop the request upstream (close its HTTP stream, call the engine's
abort) before ``aclose()`` returns. An adapter fails a request by raising an
:class:`~adaptive_batcher.gateway.errors.UpstreamError` from the iterator.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from adaptive_batcher.llm.signals import EngineMetrics

__all__ = ["Chunk", "Engine", "EngineTelemetry", "LLMRequest", "Usage"]


@dataclass(frozen=True, slots=True)
class Usage:
    """The engine's own token counts for one request (OpenAI ``usage``).

    Attributes:
        prompt_tokens: tokens in the prompt (>= 0).
        completion_tokens: tokens generated (>= 0).
    """

    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True, slots=True)
class LLMRequest:
    """One request for an engine.

    Attributes:
        payload: what the adapter forwards, unchanged (the OpenAI JSON body as a dict for the
            HTTP adapter; anything for an in-process one).
        prompt_tokens: the prompt's length in tokens, or an estimate (>= 0): the controller's
            context estimate until the engine's usage count arrives.
        max_tokens: the output budget asked for, or None.
        timeout_s: the whole request must end within this, seconds from submission (> 0), or
            None.
        path: the HTTP route it came in on (``/v1/completions`` or ``/v1/chat/completions``);
            ignored by in-process adapters.
        headers: headers to send upstream with it (``authorization``), lower-case names.
        query: the URL's query string, percent-encoded, without the ``?`` (``""``: none),
            sent upstream with ``path``; ignored by in-process adapters.
    """

    payload: Any
    prompt_tokens: int = 0
    max_tokens: int | None = None
    timeout_s: float | None = None
    path: str = "/v1/completions"
    headers: dict[str, str] = field(default_factory=dict)
    query: str = ""


@dataclass(frozen=True, slots=True)
class Chunk:
    """One piece of a response stream, passed to the caller unchanged.

    Attributes:
        data: the piece as the engine sent it (one SSE event's bytes, ``data: ...\\n\\n``, for
            the HTTP adapter; a string or any object for an in-process one).
        tokens: output tokens this piece carries (>= 0; 0 for a usage-only or control piece).
        usage: the engine's counts, on the piece that carries them (the last), else None.
    """

    data: Any
    tokens: int = 1
    usage: Usage | None = None


@runtime_checkable
class Engine(Protocol):
    """An engine the gate forwards to (``stream`` starts one request; ``aclose`` releases the
    adapter's resources: connections, background tasks)."""

    def stream(self, request: LLMRequest) -> AsyncIterator[Chunk]:
        """The request's chunks, in order; raises an ``UpstreamError`` when the engine fails it."""
        ...

    async def aclose(self) -> None:
        """Release the adapter's resources; streams still open fail."""
        ...


@runtime_checkable
class EngineTelemetry(Protocol):
    """A source of the engine's own metrics (a scrape of its Prometheus ``/metrics``), read by
    the shell in a background task every ``interval_s``, never on a request's path.

    Attributes:
        interval_s: seconds between reads (> 0).
    """

    interval_s: float

    async def read(self) -> EngineMetrics | None:
        """One reading, or None when the engine exposes none of the metrics (or did not answer:
        a failed read is logged by the source and returns None; it never raises)."""
        ...

    async def aclose(self) -> None:
        """Release the source's resources."""
        ...

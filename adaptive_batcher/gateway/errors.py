"""Typed errors of the engine adapters (each a
:class:`~adaptive_batcher.errors.BatcherError`; the shell wraps them in a
:class:`~adaptive_batcher.llm.errors.RequestFailedError` whose ``cause`` is one of these).

Hierarchy::

    UpstreamError                 the engine did not answer the request as asked
    ├── UpstreamUnavailableError  no connection (refused, reset before any answer)  -> 502
    ├── UpstreamTimeoutError      no answer, or no next chunk, in time              -> 504
    ├── UpstreamHTTPError         the engine answered with an HTTP error status     -> its status
    │   └── UpstreamEventError    ... or sent an error event in a begun stream      -> 502
    └── UpstreamProtocolError     the stream broke off or was not valid SSE/JSON    -> 502
"""

from __future__ import annotations

import json

from adaptive_batcher.errors import BatcherError

__all__ = [
    "UpstreamError",
    "UpstreamEventError",
    "UpstreamHTTPError",
    "UpstreamProtocolError",
    "UpstreamTimeoutError",
    "UpstreamUnavailableError",
]


class UpstreamError(BatcherError):
    """The engine did not answer as asked. ``http_status``: what a gateway answers with."""

    http_status = 502


class UpstreamUnavailableError(UpstreamError):
    """No connection to the engine (refused, or reset before it answered)."""


class UpstreamTimeoutError(UpstreamError):
    """The engine gave no answer, or no next chunk, within the adapter's timeout."""

    http_status = 504


class UpstreamHTTPError(UpstreamError):
    """The engine answered with an HTTP error.

    Attributes:
        status: the engine's status code.
        body: the start of its body (at most 2 KiB), for the message.
    """

    def __init__(self, status: int, body: str) -> None:
        super().__init__(self._describe(status, body))
        self.status = status
        self.body = body[:2048]
        self.http_status = status if 400 <= status < 600 else 502

    @staticmethod
    def _describe(status: int, body: str) -> str:
        return f"the engine answered HTTP {status}: {body[:200]}"


class UpstreamEventError(UpstreamHTTPError):
    """The engine began a stream with 200, then sent an error event (vLLM's ``data:
    {"error": {...}}``): it failed after accepting the request, so a gateway answers 502
    whatever status the event names (kept in ``status``: its ``code``, else 500)."""

    def __init__(self, status: int, body: str) -> None:
        super().__init__(status, body)
        self.http_status = 502

    @staticmethod
    def _describe(status: int, body: str) -> str:
        return f"the engine sent an error event mid-stream: {_event_message(body)}"


def _event_message(body: str) -> str:
    """The message an error event carries (``{"error": {"message": ...}}``, ``{"error":
    "..."}`` or ``{"message": ...}``), else the start of its data."""
    try:
        event = json.loads(body)
    except ValueError:
        return body[:200]
    error = event.get("error", event) if isinstance(event, dict) else None
    message = error.get("message") if isinstance(error, dict) else error
    return message[:200] if isinstance(message, str) and message else body[:200]


class UpstreamProtocolError(UpstreamError):
    """The engine's stream broke off mid-answer, or was not valid SSE/JSON."""

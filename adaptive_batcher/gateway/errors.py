"""Typed errors of the engine adapters (each a
:class:`~adaptive_batcher.errors.BatcherError`; the shell wraps them in a
:class:`~adaptive_batcher.llm.errors.RequestFailedError` whose ``cause`` is one of these).

Hierarchy::

    UpstreamError                 the engine did not answer the request as asked
    ├── UpstreamUnavailableError  no connection (refused, reset before any answer)  -> 502
    ├── UpstreamTimeoutError      no answer, or no next chunk, in time              -> 504
    ├── UpstreamHTTPError         the engine answered with an HTTP error status     -> its status
    └── UpstreamProtocolError     the stream broke off or was not valid SSE/JSON    -> 502
"""

from __future__ import annotations

from adaptive_batcher.errors import BatcherError

__all__ = [
    "UpstreamError",
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
    """The engine answered with an HTTP error, or sent an error event in a stream it had
    begun with 200 (``mid_stream``: the status is the one the event names, else 500).

    Attributes:
        status: the engine's status code.
        body: the start of its body, or the event's data (at most 2 KiB), for the message.
        mid_stream: whether the error came as an event of a begun stream.
    """

    def __init__(self, status: int, body: str, *, mid_stream: bool = False) -> None:
        what = "sent an error event mid-stream" if mid_stream else f"answered HTTP {status}"
        super().__init__(f"the engine {what}: {body[:200]}")
        self.mid_stream = mid_stream
        self.status = status
        self.body = body[:2048]
        self.http_status = status if 400 <= status < 600 else 502


class UpstreamProtocolError(UpstreamError):
    """The engine's stream broke off mid-answer, or was not valid SSE/JSON."""

"""The errors a request in front of an LLM engine can end with.

Hierarchy (each a :class:`~adaptive_batcher.errors.BatcherError`)::

    GateRejectedError          refused at once, before reaching the engine; has retry_after_s
    ├── TTFTUnreachableError   its predicted time to first token misses the SLO (HTTP 503)
    └── GateQueueFullError     the gate's bounded queue is full (HTTP 429; a QueueFullError)
    RequestFailedError         the engine failed the request after admission; ``cause`` is why

Requests also end with the batcher's own errors:
:class:`~adaptive_batcher.errors.DeadlineExceededError` (its deadline passed, queued or running)
and :class:`~adaptive_batcher.errors.BatcherClosedError` (the gate closed without draining).
A server maps a :class:`GateRejectedError` to its ``http_status`` with a ``Retry-After`` header
of ``ceil(retry_after_s)`` seconds, at least 1 (RFC 9110, section 10.2.3; 0 would invite an
immediate retry into the same full gate).
"""

from __future__ import annotations

from adaptive_batcher.errors import BatcherError, QueueFullError, describe

__all__ = [
    "GateQueueFullError",
    "GateRejectedError",
    "RequestFailedError",
    "TTFTUnreachableError",
]


class GateRejectedError(BatcherError):
    """Refused at arrival; nothing reached the engine.

    Attributes:
        retry_after_s: when a retry is likely to be admitted, seconds from now (>= 0).
        http_status: the status a server answers with (429 or 503).
    """

    http_status = 503

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = max(0.0, float(retry_after_s))


class TTFTUnreachableError(GateRejectedError):
    """The first token would come too late: the queue ahead of the request and the engine's
    time to first token add up to more than the SLO allows (HTTP 503, the service is
    overloaded).

    Attributes:
        predicted_ttft_s: the prediction, seconds.
        limit_s: the TTFT the gate admits up to, seconds.
    """

    http_status = 503

    def __init__(self, predicted_ttft_s: float, limit_s: float, retry_after_s: float) -> None:
        super().__init__(
            f"predicted time to first token {predicted_ttft_s * 1e3:.0f} ms exceeds the "
            f"{limit_s * 1e3:.0f} ms the gate admits",
            retry_after_s,
        )
        self.predicted_ttft_s = predicted_ttft_s
        self.limit_s = limit_s


class GateQueueFullError(GateRejectedError, QueueFullError):
    """``max_queue`` requests are already waiting in front of the engine (HTTP 429)."""

    http_status = 429

    def __init__(self, max_queue: int, retry_after_s: float) -> None:
        super().__init__(f"the gate's queue is full ({max_queue} waiting)", retry_after_s)
        self.max_queue = max_queue


class RequestFailedError(BatcherError):
    """The engine failed the request after it was admitted (an upstream error, a dropped
    stream, a timeout); ``cause`` (also ``__cause__``) is the engine's exception."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(f"the engine failed the request: {describe(cause)}")
        self.cause = cause
        self.__cause__ = cause

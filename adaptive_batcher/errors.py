"""The exceptions a caller of the batcher can receive while it serves requests.

Hierarchy::

    BatcherError               every error the batcher raises for a request
    ├── QueueFullError         the bounded queue is full; raised at once by ``submit``
    ├── DeadlineExceededError  the request did not start before its deadline (a TimeoutError)
    ├── BatcherClosedError     submitted after ``aclose()``, or queued when closed without draining
    ├── ItemTooLargeError      the item's size exceeds the configured batch cap (a ValueError)
    ├── ItemSizeError          ``size_fn`` raised, or gave the item no int >= 1 (a ValueError)
    ├── ResultCountError       the model returned a different number of results than items
    ├── PaddingError           ``pad_fn`` raised or returned a wrong number of items; no model call
    ├── BatchFailedError       the model raised for the whole batch; ``__cause__`` is its exception
    ├── ConcurrentReadError    a second task read a stream while another waited on it
    ├── StreamBufferFullError  a stream's reader fell ``max_buffered_elements`` behind
    └── EventLoopError         used from another event loop than the one it is bound to

A model may also return an exception *instance* in one result slot: only that caller receives it,
raised as is, and its neighbours get their own results. A slot exception that cannot be raised into
a future as is (``StopIteration``, which asyncio refuses, or a ``BaseException`` that is not an
``Exception``) reaches its caller as ``BatchFailedError`` whose ``cause`` it is.

Bad arguments are not ``BatcherError``: a constructor, setter or call given a value of the wrong
type raises ``TypeError``, one out of range ``ValueError``, each naming the argument (Python's
convention; ``ItemTooLargeError`` and ``ItemSizeError`` are both: an item is a request's input).
"""

from __future__ import annotations

__all__ = [
    "BatchFailedError",
    "BatcherClosedError",
    "BatcherError",
    "ConcurrentReadError",
    "DeadlineExceededError",
    "EventLoopError",
    "ItemSizeError",
    "ItemTooLargeError",
    "PaddingError",
    "QueueFullError",
    "ResultCountError",
    "StreamBufferFullError",
    "describe",
]


class BatcherError(Exception):
    """Base class of every error the batcher raises for a request (bad arguments: ``TypeError`` and
    ``ValueError``, see the module)."""


class QueueFullError(BatcherError):
    """``max_queue_size`` requests are already waiting (beyond what the idle execution slots
    take next); the request was rejected at once."""


class DeadlineExceededError(BatcherError, TimeoutError):
    """The request was still queued when its deadline passed; it never reached the model."""


class BatcherClosedError(BatcherError):
    """The batcher is closed, or was closed without draining while the request was queued."""


class ItemTooLargeError(BatcherError, ValueError):
    """The item's size (per the size function) is larger than the batch cap."""


class ItemSizeError(BatcherError, ValueError):
    """``size_fn`` raised for the item (the ``__cause__``), or returned no int >= 1 (0, a
    negative number, a float, a bool). Raised at once by the submitting call; the request is
    counted as submitted and rejected, like an item too large."""


class ResultCountError(BatcherError):
    """The model returned a number of results different from the number of items it was given."""


class PaddingError(BatcherError):
    """``pad_fn`` failed to fill the bucket it was asked to: it raised an ``Exception`` (the
    ``__cause__``), or returned a wrong number of items: not a sequence, or (items counted one
    unit each) not the bucket size, or (items with a size function) fewer items than the batch
    had. The model was not called; every caller of the batch gets its own ``PaddingError``."""


class BatchFailedError(BatcherError):
    """The model raised for the whole batch.

    Every caller in the batch gets its own ``BatchFailedError``; the model's exception is its
    ``__cause__`` and its ``cause`` attribute.
    """

    def __init__(self, cause: BaseException, batch_size: int) -> None:
        super().__init__(f"model failed on a batch of {batch_size}: {describe(cause)}")
        self.cause = cause
        self.batch_size = batch_size
        self.__cause__ = cause


class ConcurrentReadError(BatcherError, RuntimeError):
    """A task read a stream while another task was waiting for its next element. A stream has
    one reader at a time (as an async generator has: Python raises ``RuntimeError`` for a
    second concurrent ``anext``); the waiting reader is not disturbed and reads on. Raised at
    once to the second reader; the stream itself goes on."""


class EventLoopError(BatcherError, RuntimeError):
    """A batcher or a gate was used from another event loop than the one it is bound to (the
    loop of its first use): its timers, futures and tasks live on that loop. Make one per
    loop. A ``RuntimeError``, as asyncio's own for a future of another loop."""


class StreamBufferFullError(BatcherError):
    """The stream's reader fell behind: ``max_buffered_elements`` of its elements were waiting
    unread when the model produced another (``stream_overflow="fail"``). The stream ends with
    this error after the elements it had buffered; the batch goes on for the other callers."""


DESCRIBE_MAX_CHARS = 1000
"""The longest :func:`describe` text: an exception may carry a whole request (a prompt that
failed to encode), and a log line must not."""


def describe(exc: BaseException) -> str:
    """``repr(exc)``, cut to :data:`DESCRIBE_MAX_CHARS` characters (then ending ``... (N more
    characters)``), or a stand-in when the exception's own ``__repr__`` raises."""
    try:
        text = repr(exc)
    except Exception:
        return f"<{type(exc).__name__}: repr() failed>"
    if len(text) <= DESCRIBE_MAX_CHARS:
        return text
    return f"{text[:DESCRIBE_MAX_CHARS]}... ({len(text) - DESCRIBE_MAX_CHARS} more characters)"

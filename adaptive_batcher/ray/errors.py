"""The errors of ``adaptive_batcher.ray.batch``, typed as Ray Serve's and as ours.

``@serve.batch`` raises ``RuntimeError`` for an item larger than ``max_batch_size`` and
``RayServeException`` when a handler returns the wrong number of results; ours raises
``ItemTooLargeError`` and ``ResultCountError``. The errors here are both, so that code written
against either catches them. Without Ray installed, :class:`BatchSizeMismatchError` is a
``ResultCountError`` only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from adaptive_batcher.errors import (
    BatcherError,
    BatchFailedError,
    ItemTooLargeError,
    ResultCountError,
)

__all__ = ["BatchSizeMismatchError", "ItemTooLargeForBatchError", "serve_error"]


def _ray_serve_exception() -> type[Exception]:
    try:
        from ray.serve.exceptions import RayServeException
    except ImportError:
        return Exception
    return RayServeException


if TYPE_CHECKING:
    _ServeException = Exception
else:
    _ServeException = _ray_serve_exception()


class ItemTooLargeForBatchError(ItemTooLargeError, RuntimeError):
    """An item's size (``batch_size_fn([item])``) is larger than ``max_batch_size``.

    A ``RuntimeError`` as in Ray Serve, and our ``ItemTooLargeError`` (a ``ValueError``).
    """


class BatchSizeMismatchError(ResultCountError, _ServeException):
    """The handler returned (or, streaming, yielded) a number of results other than the number
    of callers in the batch. Also a ``RayServeException`` when Ray is installed."""


def serve_error(error: BatcherError) -> Exception:
    """What a caller of ``@serve.batch`` would have been raised instead of ``error``.

    The model's own exception for ``BatchFailedError`` (when it is an ``Exception``), the two
    errors above for ours, and ``error`` itself otherwise (deadlines, a full queue, closing).
    """
    if isinstance(error, BatchFailedError):
        cause = error.cause
        return cause if isinstance(cause, Exception) else error
    if isinstance(error, ResultCountError) and not isinstance(error, BatchSizeMismatchError):
        return BatchSizeMismatchError(f"Batched function doesn't preserve batch size: {error}")
    if isinstance(error, ItemTooLargeError) and not isinstance(error, RuntimeError):
        return ItemTooLargeForBatchError(
            f"Size of item is greater than max_batch_size: {error}. Increase max_batch_size "
            "or check the batch_size_fn."
        )
    return error

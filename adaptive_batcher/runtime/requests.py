"""The runtime's queued request: the engine's request, the caller's future and item; and the
size of an item in cap units."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from adaptive_batcher._validate import check_integral
from adaptive_batcher.core.batcher_core import BatcherCore
from adaptive_batcher.core.engine import Request, RequestState
from adaptive_batcher.errors import DeadlineExceededError, ItemSizeError, describe

__all__ = ["QueuedRequest", "expired_error", "item_size"]


class QueuedRequest(Request[asyncio.Future[Any]]):
    """A request the runtime queued: the engine's request, with its caller's future as the
    ``handle``, plus the caller's item and its own deadline (``own_deadline_s``: the one
    ``deadline_ms`` gave, before SLO-aware shedding shortened ``deadline_s``; None: none).
    Streaming requests extend it (:mod:`adaptive_batcher.runtime.streaming`)."""

    __slots__ = ("item", "own_deadline_s")

    def __init__(
        self,
        item: Any,
        future: asyncio.Future[Any],
        arrival_s: float,
        size: int,
        deadline_s: float | None,
    ) -> None:
        # the engine's fields set directly, not via super().__init__: this runs once per request
        self.handle = future
        self.arrival_s = arrival_s
        self.size = size
        self.deadline_s = deadline_s
        self.own_deadline_s = deadline_s
        self.state = RequestState.QUEUED
        self.item = item


def expired_error(request: Request[Any]) -> DeadlineExceededError:
    """The error of a request that did not start before its deadline: the caller's own
    (``deadline_ms``), or the SLO's shedding (``shed_late``) where that came first."""
    own = request.own_deadline_s if isinstance(request, QueuedRequest) else request.deadline_s
    deadline = request.deadline_s
    if own is not None and (deadline is None or deadline >= own):
        return DeadlineExceededError("request did not start before its deadline")
    return DeadlineExceededError(
        "request shed: it could not start in time to meet the SLO (shed_late)"
    )


def item_size(size_fn: Callable[[Any], int], item: Any, core: BatcherCore[Any]) -> int:
    """``size_fn(item)``, an int >= 1.

    Raises:
        ItemSizeError: ``size_fn`` raised (the cause) or gave no int >= 1; ``core`` counts the
            request as submitted and rejected.
    """
    try:
        size = size_fn(item)
    except Exception as exc:
        error = ItemSizeError(f"size_fn raised for this item: {describe(exc)}")
        raise core.refuse(error) from exc
    if type(size) is not int:  # numpy integers too (operator.index); plain ints stay cheap
        try:
            size = check_integral("size_fn(item)", size)
        except TypeError as exc:
            raise core.refuse(ItemSizeError(str(exc))) from None
    if size < 1:
        raise core.refuse(ItemSizeError(f"size_fn must return an int >= 1, got {size!r}"))
    return size

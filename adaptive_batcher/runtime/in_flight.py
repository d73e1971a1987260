"""What a batcher has started and not yet finished: the registry a close waits on."""

from __future__ import annotations

import asyncio
from typing import Any

from adaptive_batcher.core.engine import Batch

__all__ = ["InFlight"]


class InFlight:
    """A batcher's work in flight, on its event loop.

    Attributes:
        tasks: each batch task not yet ended -> its batch.
        unstarted: batches dispatched whose task has not started running them yet.
        running: the requests (still pending when it started) of each batch running now.
        warming: warm-up model calls not yet ended.
    """

    __slots__ = ("running", "tasks", "unstarted", "warming")

    def __init__(self) -> None:
        self.tasks: dict[asyncio.Task[None], Batch[Any]] = {}
        self.unstarted: set[Batch[Any]] = set()
        self.running: list[list[Any]] = []
        self.warming: set[asyncio.Future[Any]] = set()

    @property
    def busy(self) -> bool:
        """True while a batch task or a warm-up call has not ended."""
        return bool(self.tasks or self.warming)

    def owns(self, task: asyncio.Future[Any] | None) -> bool:
        """True when ``task`` is one of these batch tasks or warm-up calls (the model's own)."""
        return task in self.tasks or task in self.warming

    def track_warmup(self, call: asyncio.Future[Any]) -> None:
        """Count ``call``, a warm-up model call, as in flight until it ends."""
        self.warming.add(call)
        call.add_done_callback(self.warming.discard)

    def all_tasks(self) -> set[asyncio.Future[Any]]:
        """The batch tasks and warm-up calls not yet ended."""
        return {*self.tasks, *self.warming}

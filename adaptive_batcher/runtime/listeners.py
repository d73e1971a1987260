"""The batch listeners of a batcher: told of each batch that ran, once it has ended."""

from __future__ import annotations

from collections.abc import Callable

from adaptive_batcher._log import get_logger
from adaptive_batcher._validate import check_callable
from adaptive_batcher.errors import describe
from adaptive_batcher.runtime.loop import raise_in_loop
from adaptive_batcher.runtime.stats import BatchRecord

__all__ = ["BatchListener", "BatchListeners"]

BatchListener = Callable[[BatchRecord], None]
"""``listener(record)``: told of each batch that ran, on the event loop, once it has ended."""

_log = get_logger()


class BatchListeners:
    """The listeners of the batcher named ``name``; false while there is none."""

    __slots__ = ("_listeners", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self._listeners: list[BatchListener] = []

    def __bool__(self) -> bool:
        return bool(self._listeners)

    def add(self, listener: BatchListener) -> None:
        """Raises: TypeError: ``listener`` is not callable."""
        self._listeners.append(check_callable("listener", listener))

    def remove(self, listener: BatchListener) -> None:
        """Raises: ValueError: ``listener`` was not added."""
        try:
            self._listeners.remove(listener)
        except ValueError:
            raise ValueError("listener was not added to this batcher") from None

    def tell(self, record: BatchRecord) -> None:
        """Call each listener; whatever one raises is logged (``batch_listener.failed``) and
        serving goes on (a ``KeyboardInterrupt`` or ``SystemExit`` is raised in the loop
        afterwards, from a loop callback, as for the model)."""
        for listener in tuple(self._listeners):
            try:
                listener(record)
            except BaseException as exc:  # a listener must never stop serving
                _log.error(
                    "batch_listener.failed",
                    batcher=self.name,
                    batch_id=record.batch_id,
                    error=describe(exc),
                )
                if isinstance(exc, KeyboardInterrupt | SystemExit):
                    raise_in_loop(exc)

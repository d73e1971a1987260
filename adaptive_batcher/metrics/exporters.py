"""One exporter per metrics target: the Prometheus registry or OpenTelemetry meter provider an
exporter publishes into, mapped to the one collector or instrument set that serves it.

Every ``register_prometheus`` and ``instrument_otel`` (of batchers and of LLM gates) keeps one
exporter per target, so that a second source added to the same target joins the exporter
already there (a registry refuses two collectors of the same metric names; a meter keeps one
instrument per name). The map holds its targets weakly: a target dropped by its owner takes its
exporter with it.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["ExporterPerTarget"]

Target = TypeVar("Target")
Exporter = TypeVar("Exporter")


class ExporterPerTarget(Generic[Target, Exporter]):
    """The exporter of each target, made by ``make(target)`` on first use (thread-safe).

    Args:
        make: makes and attaches the exporter of a new target (e.g. makes a collector and
            registers it); if it raises, nothing is kept and the error propagates.
        missing: the message of the ``ValueError`` for a target that has no exporter.
    """

    def __init__(self, make: Callable[[Target], Exporter], missing: str) -> None:
        self._make = make
        self._missing = missing
        self._lock = threading.Lock()
        self._exporters: weakref.WeakKeyDictionary[Target, Exporter] = weakref.WeakKeyDictionary()

    def of(self, target: Target) -> Exporter:
        """``target``'s exporter, made now if it has none."""
        with self._lock:
            exporter = self._exporters.get(target)
            if exporter is None:
                exporter = self._make(target)
                self._exporters[target] = exporter
            return exporter

    def existing(self, target: Target) -> Exporter:
        """``target``'s exporter.

        Raises:
            ValueError: it has none (nothing was exported to it).
        """
        exporter = self._exporters.get(target)
        if exporter is None:
            raise ValueError(self._missing)
        return exporter

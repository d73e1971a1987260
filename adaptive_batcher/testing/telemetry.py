"""A scripted telemetry source, so code that reads telemetry is tested without a GPU."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence

from adaptive_batcher.telemetry.base import TelemetrySample

__all__ = ["FakeTelemetry"]


class FakeTelemetry:
    """Returns scripted readings and records how it was called; implements ``Telemetry``.

    Args:
        script: either a sequence of readings, returned in order with the last one repeated
            forever, or a callable ``(call_index) -> TelemetrySample`` (``call_index`` counts
            from 0). ValueError("script must hold at least one sample") for an empty sequence.
        raise_on: 0-based call indices on which :meth:`sample` raises
            ``RuntimeError("FakeTelemetry: scripted failure on call N")`` instead. A failing
            call still consumes its index (and its place in a scripted sequence).
        name: the source name (default ``"fake"``).

    Attributes:
        thread_ids: ``threading.get_ident()`` of every thread that called :meth:`sample`.
        close_calls: how many times :meth:`close` was called.
    """

    def __init__(
        self,
        script: Sequence[TelemetrySample] | Callable[[int], TelemetrySample],
        *,
        raise_on: Iterable[int] = (),
        name: str = "fake",
    ) -> None:
        if callable(script):
            self._script: Callable[[int], TelemetrySample] = script
        else:
            readings = tuple(script)
            if not readings:
                raise ValueError("script must hold at least one sample")
            self._script = lambda index: readings[min(index, len(readings) - 1)]
        self._raise_on = frozenset(raise_on)
        self.name = name
        self.thread_ids: set[int] = set()
        self.close_calls = 0
        self._calls = 0
        self._lock = threading.Lock()

    @property
    def calls(self) -> int:
        """How many times :meth:`sample` was called (raising calls included)."""
        with self._lock:
            return self._calls

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self.close_calls > 0

    def sample(self) -> TelemetrySample:
        """The next scripted reading; raises RuntimeError on the calls listed in ``raise_on``."""
        with self._lock:
            index = self._calls
            self._calls += 1
            self.thread_ids.add(threading.get_ident())
        if index in self._raise_on:
            raise RuntimeError(f"FakeTelemetry: scripted failure on call {index}")
        return self._script(index)

    def close(self) -> None:
        """Record the call; the fake keeps answering afterwards."""
        self.close_calls += 1

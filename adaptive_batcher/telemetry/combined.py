"""Several telemetry sources read as one: NVML for utilization, torch for allocator memory."""

from __future__ import annotations

import dataclasses
import threading

from adaptive_batcher._log import get_logger
from adaptive_batcher.telemetry._util import describe_error
from adaptive_batcher.telemetry.base import Telemetry, TelemetrySample, merge

__all__ = ["CombinedTelemetry"]

_log = get_logger()


class CombinedTelemetry:
    """Reads every source and merges the readings field by field; earlier sources win.

    ``name`` (and the ``source`` of each reading) is the sources' names joined by ``+``, e.g.
    ``"nvml+torch_cuda"``; ``time_s`` is the first source's. A source that raises does not spoil
    the others: its fields are unknown for that reading and the first such error per source is
    logged as the warning ``telemetry.sample_failed`` (keys ``source``, ``error``).

    Args:
        *sources: at least one source (ValueError "CombinedTelemetry needs at least one
            source" otherwise). They are closed by :meth:`close`.
    """

    def __init__(self, *sources: Telemetry) -> None:
        if not sources:
            raise ValueError("CombinedTelemetry needs at least one source")
        self.sources: tuple[Telemetry, ...] = sources
        self.name = "+".join(source.name for source in sources)
        self._lock = threading.Lock()
        self._warned: set[int] = set()

    def sample(self) -> TelemetrySample:
        """The merged reading of all sources; raises nothing."""
        readings = [self._read(index, source) for index, source in enumerate(self.sources)]
        return dataclasses.replace(merge(*readings), source=self.name)

    def _read(self, index: int, source: Telemetry) -> TelemetrySample:
        try:
            return source.sample()
        except Exception as exc:
            with self._lock:
                first = index not in self._warned
                self._warned.add(index)
            if first:
                _log.warning(
                    "telemetry.sample_failed", source=source.name, error=describe_error(exc)
                )
            return TelemetrySample(source=source.name)

    def close(self) -> None:
        """Close every source, even if one raises (logged as ``telemetry.close_failed``)."""
        for source in self.sources:
            try:
                source.close()
            except Exception as exc:
                _log.warning(
                    "telemetry.close_failed", source=source.name, error=describe_error(exc)
                )

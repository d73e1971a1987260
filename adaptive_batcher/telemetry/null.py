"""A telemetry source that knows nothing: for CPU-only deployments and as the safe default."""

from __future__ import annotations

import time
from collections.abc import Callable

from adaptive_batcher.telemetry.base import TelemetrySample

__all__ = ["NullTelemetry"]


class NullTelemetry:
    """Every reading is all-unknown; only ``time_s`` and ``source`` (``"null"``) are set.

    Args:
        clock: the monotonic clock that stamps ``time_s``, in seconds (default
            ``time.monotonic``).
    """

    name = "null"

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock

    def sample(self) -> TelemetrySample:
        """An all-unknown reading stamped with the clock; raises nothing."""
        return TelemetrySample(time_s=self._clock(), source=self.name)

    def close(self) -> None:
        """Nothing to release."""

"""The latency objective a batcher is asked to meet, set in code."""

from __future__ import annotations

import math
from dataclasses import dataclass

from adaptive_batcher._validate import check_real

__all__ = ["SLO"]


@dataclass(frozen=True, slots=True)
class SLO:
    """A latency service-level objective: ``percentile`` of end-to-end latency <= ``p99_ms``.

    End-to-end latency = queueing (the window) + preprocessing + compute. The controller aims at
    ``margin * p99_ms`` rather than the target itself, leaving room for arrival fluctuations (the
    80 % margin of the practitioners' sweep-knee-margin method; see docs/tuning.md).

    Attributes:
        p99_ms: the latency target in milliseconds (> 0), at ``percentile``.
        percentile: the percentile the target applies to, in (0, 100); 99 by default, so that
            the name reads true in the common case. ``SLO(p99_ms=50, percentile=95)`` means
            p95 <= 50 ms.
        preprocess_ms: time spent per request outside the batcher (decode, tokenise), ms (>= 0).
        margin: fraction of the target the controller aims at, in (0, 1]: the online
            controller steers latency to ``margin * p99_ms`` at every tick. Not the profiler's
            ``window_fraction`` (:func:`adaptive_batcher.profile.recommend`), which trims the
            recommended window once, offline, to a share of the slack left after compute.

    Every field takes any real number (ints, floats, numpy scalars; not bools) and is stored as
    a ``float``.

    Raises:
        TypeError: a field that is not a real number (message names the field).
        ValueError: on a value out of range (message names the field).
    """

    p99_ms: float
    percentile: float = 99.0
    preprocess_ms: float = 0.0
    margin: float = 0.8

    def __post_init__(self) -> None:
        for name in ("p99_ms", "percentile", "preprocess_ms", "margin"):
            object.__setattr__(self, name, check_real(f"SLO.{name}", getattr(self, name)))
        if not (math.isfinite(self.p99_ms) and self.p99_ms > 0):
            raise ValueError(f"SLO.p99_ms must be a finite number > 0, got {self.p99_ms!r}")
        if not 0.0 < self.percentile < 100.0:
            raise ValueError(f"SLO.percentile must be in (0, 100), got {self.percentile!r}")
        if not (math.isfinite(self.preprocess_ms) and self.preprocess_ms >= 0):
            raise ValueError(f"SLO.preprocess_ms must be >= 0, got {self.preprocess_ms!r}")
        if not 0.0 < self.margin <= 1.0:
            raise ValueError(f"SLO.margin must be in (0, 1], got {self.margin!r}")
        if self.preprocess_ms >= self.p99_ms:
            raise ValueError(
                f"SLO.preprocess_ms ({self.preprocess_ms}) must be below p99_ms ({self.p99_ms})"
            )

    @property
    def quantile(self) -> float:
        """The percentile as a fraction in (0, 1)."""
        return self.percentile / 100.0

    @property
    def target_ms(self) -> float:
        """The latency the controller aims at: ``margin * p99_ms``."""
        return self.margin * self.p99_ms

    @property
    def batcher_budget_ms(self) -> float:
        """Time left for queueing + compute inside the batcher: ``target_ms - preprocess_ms``."""
        return max(self.target_ms - self.preprocess_ms, 0.0)

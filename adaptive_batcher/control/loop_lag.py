"""The event loop's lag: how late the shell's heartbeat fires, short of a stall.

A request reaches :meth:`AdaptiveBatcher.submit` only when the loop gets to it, so a busy loop
spends part of the SLO before the batcher's clock starts, as preprocessing does. The shell's
heartbeat (every ``HEARTBEAT_S`` while requests are in the system) samples that lateness at
times that know nothing of the loop's work; :class:`LoopLag` keeps the recent samples (the core
passes none of a stall's: a stall is an outlier, not lag) and reads their upper quantile, which
the controller budgets for (:attr:`Observation.loop_lag_ms`). The simulator's loop has no lag.
Why and the figures: docs/policies.md, "The event loop's lag".
"""

from __future__ import annotations

import math
from collections import deque

__all__ = ["LAG_BUDGET_SHARE", "LAG_MEMORY", "LAG_MIN_SAMPLES", "LAG_QUANTILE", "LoopLag"]

LAG_MEMORY = 256
"""Heartbeats the lag is read from (about 5 s of a busy loop's)."""
LAG_MIN_SAMPLES = 32
"""Heartbeats needed before the lag is read (none fewer: 0)."""
LAG_QUANTILE = 0.99
"""The quantile of the recent lateness that is budgeted for."""
LAG_BUDGET_SHARE = 0.5
"""At most this share of the SLO's batcher budget is set aside for lag: a loop that lags more
leaves no window to steer, and a narrower one would only add loop work per request."""


class LoopLag:
    """Recent heartbeat lateness of the shell's event loop, seconds in, ms out."""

    def __init__(self) -> None:
        self._late_s: deque[float] = deque(maxlen=LAG_MEMORY)

    def note(self, late_s: float) -> None:
        """A heartbeat fired ``late_s`` seconds after it was due (negative, NaN or infinite:
        ignored)."""
        if 0.0 <= late_s < math.inf:
            self._late_s.append(late_s)

    def budgeted_ms(self, budget_ms: float) -> float:
        """The lag set aside from a batcher budget of ``budget_ms``: :meth:`quantile_ms`, at
        most ``LAG_BUDGET_SHARE`` of it (0 for a budget that is NaN)."""
        share = LAG_BUDGET_SHARE * budget_ms
        return min(self.quantile_ms(), share) if share > 0 else 0.0

    def quantile_ms(self) -> float:
        """The ``LAG_QUANTILE`` of the recent lateness, ms (nearest rank; 0 before
        ``LAG_MIN_SAMPLES`` heartbeats)."""
        count = len(self._late_s)
        if count < LAG_MIN_SAMPLES:
            return 0.0
        rank = min(count - 1, math.ceil(LAG_QUANTILE * count) - 1)
        return sorted(self._late_s)[rank] * 1e3

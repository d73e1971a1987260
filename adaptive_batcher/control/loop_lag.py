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

__all__ = [
    "LAG_BUDGET_SHARE",
    "LAG_MEMORY",
    "LAG_MEMORY_S",
    "LAG_MIN_SAMPLES",
    "LAG_QUANTILE",
    "LoopLag",
]

LAG_MEMORY = 256
"""Heartbeats the lag is read from, at most (about 5 s of a busy loop's)."""
LAG_MEMORY_S = 10.0
"""Heartbeats older than this, s, no longer count (a light load beats seldom: the lag of a
busy spell long past is no lag now)."""
LAG_MIN_SAMPLES = 32
"""Heartbeats needed in memory before the lag is read (none fewer: 0)."""
LAG_QUANTILE = 0.99
"""The quantile of the recent lateness that is budgeted for."""
LAG_BUDGET_SHARE = 0.5
"""At most this share of the SLO's batcher budget is set aside for lag: a loop that lags more
leaves no window to steer, and a narrower one would only add loop work per request."""


class LoopLag:
    """Recent heartbeat lateness of the shell's event loop: seconds in, ms out, on the shell's
    clock."""

    def __init__(self) -> None:
        self._beats: deque[tuple[float, float]] = deque(maxlen=LAG_MEMORY)  # (at_s, late_s)

    def note(self, late_s: float, now_s: float) -> None:
        """A heartbeat fired at ``now_s``, ``late_s`` seconds after it was due (a lateness
        that is negative, NaN or infinite: ignored)."""
        if 0.0 <= late_s < math.inf:
            self._beats.append((now_s, late_s))

    def budgeted_ms(self, budget_ms: float, now_s: float) -> float:
        """The lag set aside at ``now_s`` from a batcher budget of ``budget_ms``:
        :meth:`quantile_ms`, at most ``LAG_BUDGET_SHARE`` of the budget (0 for a budget that
        is NaN)."""
        return self._capped(self.quantile_ms(now_s), budget_ms)

    def typical_ms(self, budget_ms: float, now_s: float) -> float:
        """The median lateness at ``now_s``, at most what :meth:`budgeted_ms` sets aside, ms:
        the lag a request usually meets (a shed deadline's, which must fail only the requests
        that cannot make it)."""
        return self._capped(self.quantile_ms(now_s, 0.5), budget_ms)

    @staticmethod
    def _capped(lag_ms: float, budget_ms: float) -> float:
        share = LAG_BUDGET_SHARE * budget_ms
        return min(lag_ms, share) if share > 0 else 0.0

    def quantile_ms(self, now_s: float, quantile: float = LAG_QUANTILE) -> float:
        """The ``quantile`` (default ``LAG_QUANTILE``) of the lateness of the beats of the last
        ``LAG_MEMORY_S`` before ``now_s``, ms (nearest rank; 0 with fewer than
        ``LAG_MIN_SAMPLES``)."""
        beats = self._beats
        while beats and beats[0][0] < now_s - LAG_MEMORY_S:
            beats.popleft()
        count = len(beats)
        if count < LAG_MIN_SAMPLES:
            return 0.0
        rank = min(count - 1, max(0, math.ceil(quantile * count) - 1))
        return sorted(late for _, late in beats)[rank] * 1e3

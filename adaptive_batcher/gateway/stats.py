"""What :meth:`~adaptive_batcher.gateway.shell.LLMGate.stats` returns, and the timings the gate
records for it.

The gate records three times per request, each in seconds: the **TTFT** (arrival at the gate to
the first chunk carrying tokens, the queue included), the **TPOT** (``(last token - first
token) / (output tokens - 1)``, 0 for a one-token answer; of completed requests) and the
**queue wait** (arrival to admission; of admitted requests). Each goes into a sliding-window
histogram (the quantiles of :class:`LLMGateStats`) and a cumulative one (what the exporters
publish as histograms): :mod:`adaptive_batcher.metrics.histogram`, the batcher's own.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

from adaptive_batcher.llm.controller import GateDecision
from adaptive_batcher.llm.gate import GateCounts
from adaptive_batcher.llm.signals import EngineMetrics
from adaptive_batcher.llm.slo import TokenSLO
from adaptive_batcher.metrics.histogram import (
    CumulativeHistogram,
    HistogramSnapshot,
    Quantiles,
    SlidingHistogram,
)

__all__ = ["REJECT_REASONS", "GateTimings", "LLMGateStats", "TimeQuantiles"]

REJECT_REASONS: Final = ("ttft_unreachable", "queue_full", "closed")
"""Why an arrival was refused at once: its predicted TTFT missed the SLO
(:class:`~adaptive_batcher.llm.errors.TTFTUnreachableError`, HTTP 503), the queue was full
(:class:`~adaptive_batcher.llm.errors.GateQueueFullError`, HTTP 429), or the gate was closed,
or closed without draining while it waited
(:class:`~adaptive_batcher.errors.BatcherClosedError`)."""

WINDOW_S: Final = 10.0
"""The span of the sliding windows behind the quantiles, seconds (the batcher's too)."""


@dataclass(frozen=True, slots=True)
class TimeQuantiles:
    """Quantiles of one time over the sliding window, seconds (1 % resolution), and the number
    of samples behind them; the quantiles are NaN when ``count`` is 0."""

    count: int
    p50_s: float
    p90_s: float
    p99_s: float
    mean_s: float

    @classmethod
    def of(cls, quantiles: Quantiles) -> TimeQuantiles:
        """The reading of a :class:`~adaptive_batcher.metrics.histogram.Quantiles` (ms)."""
        return cls(
            quantiles.count,
            quantiles.p50_ms / 1e3,
            quantiles.p90_ms / 1e3,
            quantiles.p99_ms / 1e3,
            quantiles.mean_ms / 1e3,
        )


@dataclass(frozen=True, slots=True)
class LLMGateStats:
    """A frozen snapshot of an :class:`~adaptive_batcher.gateway.shell.LLMGate`.

    Attributes:
        name: the gate's name (log field and exporter label ``gate``).
        slo: the objective.
        counts: the requests by where they are or how they ended (``submitted`` is the sum of
            the other seven).
        limit: the in-flight limit in force.
        waiting: requests waiting in front of the engine now.
        in_flight: requests inside the engine now.
        ttft, tpot, queue_wait: quantiles over the last :data:`WINDOW_S` seconds.
        rejected_by_reason: {reason: requests refused at once}, the reasons of
            :data:`REJECT_REASONS`; they add up to ``counts.rejected``.
        decision: the controller's decision in force (knobs and TTFT forecast).
        engine: the latest reading of the engine's metrics, None without one.
        closed: True once :meth:`~adaptive_batcher.gateway.shell.LLMGate.aclose` began.
        ttft_histogram, tpot_histogram, queue_wait_histogram: the same times since the gate
            was made, cumulative at fixed bounds (seconds), for the exporters.
    """

    name: str
    slo: TokenSLO
    counts: GateCounts
    limit: int
    waiting: int
    in_flight: int
    ttft: TimeQuantiles
    tpot: TimeQuantiles
    queue_wait: TimeQuantiles
    rejected_by_reason: Mapping[str, int]
    decision: GateDecision
    engine: EngineMetrics | None
    closed: bool
    ttft_histogram: HistogramSnapshot
    tpot_histogram: HistogramSnapshot
    queue_wait_histogram: HistogramSnapshot


class _Timing:
    """One time, in a sliding window and in a cumulative histogram."""

    __slots__ = ("cumulative", "window")

    def __init__(self, window_s: float) -> None:
        self.window = SlidingHistogram(window_s, 20)
        self.cumulative = CumulativeHistogram()

    def record(self, value_s: float, now: float) -> None:
        value = max(value_s, 0.0)
        self.window.record(value, now)
        self.cumulative.record(value)

    def quantiles(self, now: float) -> TimeQuantiles:
        return TimeQuantiles.of(self.window.quantiles(now))


class GateTimings:
    """The gate's TTFT, TPOT and queue-wait samples and its refusals by reason.

    Recording is done on the event loop; reading (:meth:`quantiles`, the snapshots) is safe
    from another thread (a metrics scrape).

    Args:
        window_s: the span of the sliding windows, seconds (> 0).
    """

    def __init__(self, window_s: float = WINDOW_S) -> None:
        self.ttft = _Timing(window_s)
        self.tpot = _Timing(window_s)
        self.queue_wait = _Timing(window_s)
        self._rejected = dict.fromkeys(REJECT_REASONS, 0)

    def record_reject(self, reason: str) -> None:
        """One arrival refused for ``reason`` (one of :data:`REJECT_REASONS`)."""
        self._rejected[reason] = self._rejected.get(reason, 0) + 1

    def rejected_by_reason(self) -> Mapping[str, int]:
        """{reason: refusals} so far (a copy)."""
        return MappingProxyType(dict(self._rejected))


def tpot_s(first_s: float | None, last_s: float | None, output_tokens: int) -> float:
    """The TPOT of a completed request: ``(last - first) / (output_tokens - 1)`` seconds, 0 for
    an answer of at most one token, NaN when no token time is known."""
    if output_tokens <= 1:
        return 0.0
    if first_s is None or last_s is None:
        return math.nan
    return max(last_s - first_s, 0.0) / (output_tokens - 1)

"""What a Ray Serve replica tells the autoscaler about its batcher: load, cost and SLO attainment.

Ray Serve (2.60) calls a deployment's ``record_autoscaling_stats()`` on each replica, keeps the
readings of the last ``look_back_period_s`` and hands the autoscaling policy, per metric and
per replica, their mean (``AutoscalingContext.aggregated_metrics``). :class:`ReplicaReport`
makes those readings from :meth:`~adaptive_batcher.AdaptiveBatcher.stats`; the policy in
:mod:`adaptive_batcher.ray.autoscaling` reads them::

    @serve.deployment(autoscaling_config=autoscaling_config(min_replicas=1, max_replicas=8))
    class Model:
        def __init__(self) -> None:
            self.report = ReplicaReport()

        @batch(max_batch_size=32, slo=SLO(latency_ms=100))
        async def predict(self, items: list[str]) -> list[str]: ...

        async def record_autoscaling_stats(self) -> dict[str, float]:
            return self.report(self.predict.get_batcher(self).stats())

Rates are taken over the interval since the previous reading, from the batcher's cumulative
counters, so that Ray's mean over its look-back window is the rate over that window.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final

from adaptive_batcher.metrics.recorder import Counts
from adaptive_batcher.runtime.stats import BatcherStats

__all__ = [
    "ANSWERED_RPS",
    "ARRIVAL_RPS",
    "BUSY_FRACTION",
    "DEVICE_MS_PER_REQUEST",
    "ENDED_RPS",
    "MAX_BATCH_SIZE",
    "MEAN_BATCH_SIZE",
    "QUEUE_DEPTH",
    "SLO_QUANTILE",
    "SLO_UNREACHABLE",
    "WINDOW_MS",
    "WITHIN_SLO_RPS",
    "ReplicaReport",
]

QUEUE_DEPTH: Final = "ab_queue_depth"
"""Requests waiting in the batcher's queue now (not yet in a batch)."""
MAX_BATCH_SIZE: Final = "ab_max_batch_size"
"""The batch cap in force now, items (or size units)."""
WINDOW_MS: Final = "ab_window_ms"
"""The window in force now, ms."""
SLO_UNREACHABLE: Final = "ab_slo_unreachable"
"""1.0 while the controller finds the SLO out of reach even for a batch of one, else 0.0."""
SLO_QUANTILE: Final = "ab_slo_quantile"
"""The share of answers the SLO asks to be in time (0.99 for a p99 target); absent without an
SLO."""
ARRIVAL_RPS: Final = "ab_arrival_rps"
"""Requests submitted to the batcher per second, over the interval."""
ANSWERED_RPS: Final = "ab_answered_rps"
"""Requests that got their result per second (in time or late), over the interval."""
WITHIN_SLO_RPS: Final = "ab_within_slo_rps"
"""Requests answered within the SLO per second, over the interval (all answers without an
SLO)."""
ENDED_RPS: Final = "ab_ended_rps"
"""Requests that ended per second, whatever the outcome (answered, failed, refused, expired,
cancelled), over the interval."""
BUSY_FRACTION: Final = "ab_busy_fraction"
"""The share of the interval the model was running, per execution slot: device seconds over
``interval * max_concurrent_batches``; 1.0 is a saturated replica."""
MEAN_BATCH_SIZE: Final = "ab_mean_batch_size"
"""Items per batch over the interval; absent when no batch ran."""
DEVICE_MS_PER_REQUEST: Final = "ab_device_ms_per_request"
"""Device time per answered request over the interval, ms (the cost per request); absent when
none was answered."""


class ReplicaReport:
    """Turns successive :class:`~adaptive_batcher.BatcherStats` into the readings of one replica.

    Call it with the batcher's ``stats()`` each time Ray Serve asks (``record_autoscaling_stats``);
    it returns ``{metric name: value}`` with the names defined in this module. The first call
    has no previous reading, so it returns the instantaneous readings only (queue depth, window,
    cap, SLO); later calls add the rates over the time since the previous call.

    Args:
        clock: seconds, monotonic (default ``time.monotonic``); a test passes its own.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._last: tuple[float, Counts] | None = None

    def __call__(self, stats: BatcherStats) -> dict[str, float]:
        """The readings for ``stats``, a snapshot taken now.

        Returns:
            ``{metric name: value}``, every value a finite float (Ray Serve refuses others).
        """
        now = self._clock()
        readings = {
            QUEUE_DEPTH: float(stats.queue_depth),
            MAX_BATCH_SIZE: float(stats.max_batch_size),
            WINDOW_MS: float(stats.window_ms),
            SLO_UNREACHABLE: 1.0 if stats.slo_unreachable else 0.0,
        }
        if stats.slo is not None:
            readings[SLO_QUANTILE] = stats.slo.quantile
        last, self._last = self._last, (now, stats.counts)
        if last is not None and now > last[0]:
            readings.update(_rates(last[1], stats.counts, now - last[0], stats))
        return readings


def _rates(
    before: Counts, after: Counts, interval_s: float, stats: BatcherStats
) -> dict[str, float]:
    """The rates of ``after - before`` over ``interval_s`` seconds."""

    def per_s(name: str) -> float:
        return float(getattr(after, name) - getattr(before, name)) / interval_s

    ended = sum(per_s(n) for n in ("completed", "failed", "rejected", "expired", "cancelled"))
    busy_s = after.device_busy_s - before.device_busy_s
    rates = {
        ARRIVAL_RPS: per_s("submitted"),
        ANSWERED_RPS: per_s("completed"),
        WITHIN_SLO_RPS: per_s("within_slo"),
        ENDED_RPS: ended,
        BUSY_FRACTION: busy_s / (interval_s * stats.max_concurrent_batches),
    }
    batches = after.batches - before.batches
    if batches > 0:
        rates[MEAN_BATCH_SIZE] = (after.batch_items - before.batch_items) / batches
    answered = (after.completed + after.failed) - (before.completed + before.failed)
    if answered > 0:
        rates[DEVICE_MS_PER_REQUEST] = busy_s * 1e3 / answered
    return rates

"""The frozen snapshot ``AdaptiveBatcher.stats()`` returns."""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

from adaptive_batcher.metrics.histogram import Quantiles
from adaptive_batcher.metrics.recorder import Counts
from adaptive_batcher.slo import SLO

__all__ = ["BatcherStats"]


@dataclass(frozen=True, slots=True)
class BatcherStats:
    """A frozen snapshot of a batcher.

    Attributes:
        name: the batcher's name (log field ``batcher``).
        queue_depth: requests queued now; ``queued_units`` their total size in units.
        in_flight_batches: batches running now.
        counts: cumulative request and batch counters (:class:`~adaptive_batcher.metrics.Counts`).
        batch_sizes: {items per batch: number of batches}, cumulative.
        latency: end-to-end latency quantiles (ms) over the sliding window, with their sample count.
        window_ms, max_batch_size, max_concurrent_batches: the settings in force now.
        slo: the latency objective, if one was set.
        policy: the controller's policy chain (None: static settings, no controller).
        slo_unreachable: True while the SLO cannot be met even by a batch of one.
        decisions: controller decisions taken so far.
    """

    name: str
    queue_depth: int
    queued_units: int
    in_flight_batches: int
    counts: Counts
    batch_sizes: MappingProxyType[int, int]
    latency: Quantiles
    window_ms: float
    max_batch_size: int
    max_concurrent_batches: int
    slo: SLO | None
    policy: str | None
    slo_unreachable: bool
    decisions: int

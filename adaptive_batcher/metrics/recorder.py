"""Counters, latency quantiles and per-batch samples, shared by the runtime and the simulator."""

from __future__ import annotations

import math
from collections import Counter, deque
from dataclasses import dataclass
from types import MappingProxyType
from typing import NamedTuple

from adaptive_batcher.metrics.histogram import CumulativeHistogram, Quantiles, SlidingHistogram

__all__ = ["BatchSample", "Counts", "Recorder"]


ANSWER_SHARES = 64
"""How many recent streaming batches' answer shares a recorder keeps."""


class BatchSample(NamedTuple):
    """One finished batch: when it ended (s), items, size units, and model time (s)."""

    end_s: float
    items: int
    units: int
    service_s: float


@dataclass(frozen=True, slots=True)
class Counts:
    """Cumulative request and batch counts since the batcher started.

    ``completed`` counts requests that got a result, ``within_slo`` those of them whose latency
    met the SLO (timed from submission: within ``latency_ms - preprocess_ms``; all of them when
    no SLO is set), ``failed`` those that got an exception from the model, a result-count error,
    were running when a time-limited close gave up on them, whose batch's task something
    cancelled before it ran, or (a stream) whose reader fell ``max_buffered_elements`` behind,
    ``rejected`` those refused at submit (queue full, too large, closed) or that a close kept
    from starting (taken off the queue by a close without draining, or in a batch a time-limited
    close cancelled before it ran), ``expired`` deadline errors, ``cancelled`` callers that gave
    up (were cancelled) before any of these. Once every request has ended, ``submitted`` is the
    sum of the five outcome counts (``within_slo`` is part of ``completed``). Each count only
    goes up, and a request is counted once, when it ends: a stream when its stream ends (or its
    reader leaves after its first element, which counts it completed), its latency being the
    time to its first element. Every change goes through
    :class:`~adaptive_batcher.core.batcher_core.BatcherCore`.

    ``oom_errors`` counts every model call that ran out of memory (``is_oom``): a batch of
    several items, which is then split and re-run, and a single item, whose caller gets the
    error (it cannot be split); streaming batches too, each when it happens. Of those, the
    splitting of a batch judges each failed call once its halves have run: ``oom_size_errors``
    counts the calls put down to the batch's size (the memory guard's signal: every half ran
    out of memory, or none did), ``oom_isolated`` those traced to a request that runs out of
    memory alone (exactly one half failed, down to that request; or a request left the batch
    before its halves ran, which leaves the cause unknown); the rest are still being split.

    ``device_busy_s`` is the device cost: the summed wall time of every model call, seconds
    (split and failed calls included; concurrent batches add up, as device-seconds do).
    ``batches``, ``batch_items`` and ``batch_units`` count the model calls that returned
    results, and the requests and units (padding included) they held: a call that raised is
    not among them (its time is in ``device_busy_s``, its requests in ``failed``, or in the
    calls that re-ran its halves).
    """

    submitted: int
    completed: int
    within_slo: int
    failed: int
    rejected: int
    expired: int
    cancelled: int
    batches: int
    batch_items: int
    batch_units: int
    oom_errors: int
    window_batches: int = 0
    window_idle_s: float = 0.0
    device_busy_s: float = 0.0
    oom_isolated: int = 0
    oom_size_errors: int = 0

    @property
    def mean_batch_size(self) -> float:
        """Mean items per batch (NaN before the first batch)."""
        return self.batch_items / self.batches if self.batches else math.nan

    @property
    def device_ms_per_request(self) -> float:
        """Device cost: busy time per answered request, ms (NaN before the first answer)."""
        answered = self.completed + self.failed
        return self.device_busy_s * 1e3 / answered if answered else math.nan


class Recorder:
    """Collects what the controller and ``stats()`` need; O(1) per request.

    ``latency`` is the sliding-window histogram the controller and ``stats()`` read;
    ``latency_cumulative`` counts the same answers since the start at
    :data:`~adaptive_batcher.metrics.histogram.LATENCY_BOUNDS_S`, for exporters (None when
    built with ``exported=False``: a replay, which no exporter reads, skips that work).

    Args:
        latency_window_s: span of the sliding latency histogram, seconds.
        batch_samples: how many recent batches to keep for service-time fitting.
        exported: keep ``latency_cumulative`` for the Prometheus and OpenTelemetry exporters.
    """

    def __init__(
        self, latency_window_s: float = 10.0, batch_samples: int = 512, *, exported: bool = True
    ) -> None:
        self.latency = SlidingHistogram(latency_window_s, slices=20)
        self.latency_cumulative = CumulativeHistogram() if exported else None
        self.batches: deque[BatchSample] = deque(maxlen=batch_samples)
        self.batch_size_counts: Counter[int] = Counter()
        self.submitted = 0
        self.completed = 0
        self.within_slo = 0
        self.failed = 0
        self.rejected = 0
        self.expired = 0
        self.cancelled = 0
        self.batch_count = 0
        self.batch_items = 0
        self.batch_units = 0
        self.oom_errors = 0
        self.oom_isolated = 0
        self.oom_size_errors = 0
        # units of each recent size-caused OOM call, in order (None: unknown)
        self.oom_size_units: deque[int | None] = deque(maxlen=64)
        self.window_batches = 0
        self.window_idle_s = 0.0
        self.device_busy_s = 0.0
        # of each recent streaming batch, the share of its time that came before its first
        # answer (its callers' latency ends there; the slot stays busy to the stream's end)
        self.answer_shares: deque[float] = deque(maxlen=ANSWER_SHARES)

    @property
    def slo_latency_s(self) -> float:
        """The SLO's latency, seconds (inf: none); answers within it count as ``within_slo``,
        and the sliding histogram counts its share exactly."""
        return self.latency.limit_s

    @slo_latency_s.setter
    def slo_latency_s(self, limit_s: float) -> None:
        self.latency.set_limit(limit_s)

    def record_batch(
        self,
        end_s: float,
        items: int,
        units: int,
        service_s: float,
        window_idle_s: float = 0.0,
        answer_s: float | None = None,
    ) -> None:
        """A batch of ``items`` requests (``units`` size units) ran for ``service_s`` seconds;
        ``window_idle_s`` > 0 when its window waited that long after its last arrival;
        ``answer_s``: a streaming batch's time to its first answer, s (None: not a stream)."""
        self.batches.append(BatchSample(end_s, items, units, service_s))
        if answer_s is not None and service_s > 0.0:
            self.answer_shares.append(min(1.0, max(0.0, answer_s / service_s)))
        if window_idle_s > 0.0:
            self.window_batches += 1
            self.window_idle_s += window_idle_s
        self.batch_size_counts[items] += 1
        self.batch_count += 1
        self.batch_items += items
        self.batch_units += units

    def record_device_time(self, busy_s: float) -> None:
        """The device ran model calls for ``busy_s`` seconds (the cost of answering)."""
        self.device_busy_s += busy_s

    def record_latencies(self, latencies_s: list[float], failed: int, now: float) -> None:
        """Requests that got an answer at ``now`` after ``latencies_s``; ``failed`` of them errors.

        Successful answers within ``slo_latency_s`` count towards ``within_slo`` (goodput); a
        failure never counts as good, so they are counted as if they were the slowest.
        """
        within = self.latency.record_many(latencies_s, now, failed)
        if self.latency_cumulative is not None:
            self.latency_cumulative.record_many(latencies_s)
        self._count_answers(len(latencies_s), within, failed)

    def record_answers(self, arrivals_s: list[float], failed: int, now: float) -> None:
        """Requests that arrived at ``arrivals_s`` (non-decreasing, as in a FIFO batch) got an
        answer at ``now``; ``failed`` of them errors. Same counting as :meth:`record_latencies`,
        with no per-request Python work: the runtime's path for every batch."""
        within = self.latency.record_since(arrivals_s, now, failed)
        if self.latency_cumulative is not None:
            self.latency_cumulative.record_since(arrivals_s, now)
        self._count_answers(len(arrivals_s), within, failed)

    def record_waits(self, arrivals_s: list[float], now: float) -> None:
        """Latencies of requests that arrived at ``arrivals_s`` (non-decreasing) and got a
        first answer at ``now`` whose outcome is counted later (a stream's first element):
        the histograms only, no count."""
        self.latency.record_since(arrivals_s, now)
        if self.latency_cumulative is not None:
            self.latency_cumulative.record_since(arrivals_s, now)

    def _count_answers(self, answered: int, within: int, failed: int) -> None:
        """``within``: the successful answers within the SLO (the histogram counts them)."""
        self.completed += answered - failed
        self.failed += failed
        self.within_slo += within

    def counts(self) -> Counts:
        """A frozen copy of the counters."""
        return Counts(
            submitted=self.submitted,
            completed=self.completed,
            within_slo=self.within_slo,
            failed=self.failed,
            rejected=self.rejected,
            expired=self.expired,
            cancelled=self.cancelled,
            batches=self.batch_count,
            batch_items=self.batch_items,
            batch_units=self.batch_units,
            oom_errors=self.oom_errors,
            window_batches=self.window_batches,
            window_idle_s=self.window_idle_s,
            device_busy_s=self.device_busy_s,
            oom_isolated=self.oom_isolated,
            oom_size_errors=self.oom_size_errors,
        )

    def quantiles(self, now: float) -> Quantiles:
        """Latency quantiles over the sliding window ending at ``now``."""
        return self.latency.quantiles(now)

    def batch_size_histogram(self) -> MappingProxyType[int, int]:
        """Read-only copy of {items per batch: number of batches}."""
        return MappingProxyType(dict(self.batch_size_counts))

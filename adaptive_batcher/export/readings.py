"""What the exporters publish, and how it is read: the part common to Prometheus and OpenTelemetry.

Nothing here imports a metrics library. A :class:`Watchlist` holds the batchers an exporter
serves; :meth:`Watchlist.read` reads each of them when a scrape (or an OpenTelemetry collection)
asks, into a :class:`BatcherReading`. Almost everything comes from ``stats()`` and the recorder,
which the batcher keeps anyway; the only per-batch work an exporter adds is the
:class:`BatchTimings` listener (two bisections under a lock, once per batch), for the queue-wait
and execution-time histograms. Nothing is done per request.

Reading is safe from another thread than the batcher's event loop (a Prometheus HTTP server
thread, an OpenTelemetry reader thread): reads copy counters and never change the batcher's
state. Values read while a batch is being recorded may be one batch apart from each other.

:data:`METRICS` lists every metric with its name, type, unit, labels and meaning; the two
exporters use these names and ``docs/metrics.md`` documents them.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from adaptive_batcher.metrics.histogram import (
    LATENCY_BOUNDS_S,
    CumulativeHistogram,
    HistogramSnapshot,
    check_bounds,
)
from adaptive_batcher.runtime.batcher import AdaptiveBatcher
from adaptive_batcher.runtime.stats import BatcherStats, BatchRecord

__all__ = [
    "BATCH_SIZE_BOUNDS",
    "LATENCY_QUANTILES",
    "METRICS",
    "OUTCOMES",
    "BatchTimings",
    "BatcherReading",
    "MetricSpec",
    "Watchlist",
    "batch_size_histogram",
]

BATCH_SIZE_BOUNDS: tuple[float, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
"""Upper bounds (items) of the batch-size histogram; exact, from the recorder's count of
batches per size."""

LATENCY_QUANTILES: tuple[float, ...] = (0.5, 0.9, 0.95, 0.99)
"""The quantiles of the sliding latency window exported as gauges."""

OUTCOMES: tuple[str, ...] = ("completed", "failed", "rejected", "expired", "cancelled")
"""The ``outcome`` label values of the request counter: the five ends a request can have (see
:class:`~adaptive_batcher.metrics.Counts`); they add up to the submitted requests once every
request has ended."""

Kind = Literal["counter", "gauge", "histogram"]


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One exported metric.

    Attributes:
        name: the Prometheus name as exposed (counters with their ``_total``).
        otel_name: the OpenTelemetry instrument name.
        kind: ``counter``, ``gauge`` or ``histogram``.
        unit: the unit, in the UCUM form OpenTelemetry uses (``s``, ``1``, ``{request}``).
        labels: the label (attribute) names; ``batcher`` is the batcher's name.
        help: what it measures.
    """

    name: str
    otel_name: str
    kind: Kind
    unit: str
    labels: tuple[str, ...]
    help: str


def _spec(name: str, otel_name: str, kind: Kind, unit: str, help: str, *labels: str) -> MetricSpec:
    return MetricSpec(name, otel_name, kind, unit, ("batcher", *labels), help)


REQUEST_LATENCY = _spec(
    "adaptive_batcher_request_latency_seconds",
    "adaptive_batcher.request.latency",
    "histogram",
    "s",
    "Latency of answered requests, from submit to answer (results and per-item errors), "
    "since the batcher started.",
)
REQUEST_LATENCY_QUANTILE = _spec(
    "adaptive_batcher_request_latency_quantile_seconds",
    "adaptive_batcher.request.latency.quantile",
    "gauge",
    "s",
    "Latency quantiles of the answers in the batcher's sliding window (10 s), 1 % resolution: "
    "what the controller sees.",
    "quantile",
)
BATCH_QUEUE_WAIT = _spec(
    "adaptive_batcher_batch_queue_wait_seconds",
    "adaptive_batcher.batch.queue_wait",
    "histogram",
    "s",
    "Per batch: how long its oldest request waited for the batch to start (window plus any "
    "wait for a free slot).",
)
BATCH_EXECUTION = _spec(
    "adaptive_batcher_batch_execution_seconds",
    "adaptive_batcher.batch.execution",
    "histogram",
    "s",
    "Per batch: model time, padding and splits after an error included.",
)
BATCH_SIZE = _spec(
    "adaptive_batcher_batch_size",
    "adaptive_batcher.batch.size",
    "histogram",
    "{request}",
    "Per batch: requests in it, since the batcher started.",
)
QUEUE_DEPTH = _spec(
    "adaptive_batcher_queue_depth",
    "adaptive_batcher.queue.depth",
    "gauge",
    "{request}",
    "Requests queued now.",
)
QUEUE_UNITS = _spec(
    "adaptive_batcher_queue_units",
    "adaptive_batcher.queue.units",
    "gauge",
    "{unit}",
    "Size units of the requests queued now (size_fn; requests without one).",
)
WINDOW = _spec(
    "adaptive_batcher_window_seconds",
    "adaptive_batcher.window",
    "gauge",
    "s",
    "Batching window in force: the longest wait of the oldest queued request for company.",
)
MAX_BATCH_SIZE = _spec(
    "adaptive_batcher_max_batch_size",
    "adaptive_batcher.max_batch_size",
    "gauge",
    "{unit}",
    "Batch cap in force, in size units.",
)
MAX_CONCURRENT_BATCHES = _spec(
    "adaptive_batcher_max_concurrent_batches",
    "adaptive_batcher.max_concurrent_batches",
    "gauge",
    "{batch}",
    "Execution slots: batches that may run at once.",
)
BATCHES_IN_FLIGHT = _spec(
    "adaptive_batcher_batches_in_flight",
    "adaptive_batcher.batches.in_flight",
    "gauge",
    "{batch}",
    "Batches running now (slots in use).",
)
SLO_LATENCY = _spec(
    "adaptive_batcher_slo_latency_seconds",
    "adaptive_batcher.slo.latency",
    "gauge",
    "s",
    "The latency an answer must meet at the SLO's percentile, timed from submission: the SLO's "
    "less its preprocessing (only with an SLO).",
)
SLO_ATTAINMENT = _spec(
    "adaptive_batcher_slo_attainment_ratio",
    "adaptive_batcher.slo.attainment",
    "gauge",
    "1",
    "Share of the answers in the sliding window (10 s) whose latency met the SLO (only with an "
    "SLO and answers).",
)
SLO_UNREACHABLE = _spec(
    "adaptive_batcher_slo_unreachable",
    "adaptive_batcher.slo.unreachable",
    "gauge",
    "",
    "1 while the controller finds the SLO out of reach even for a batch of one (for a request "
    "that arrives while a batch runs), else 0.",
)
EXECUTOR = _spec(
    "adaptive_batcher_executor_info",
    "adaptive_batcher.executor",
    "gauge",
    "",
    "1 for where the model runs now: thread, inline, async, stream or cuda (one with "
    'executor="adaptive" moves from its thread to the event loop and back).',
    "executor",
)
REQUESTS_SUBMITTED = _spec(
    "adaptive_batcher_requests_submitted_total",
    "adaptive_batcher.requests.submitted",
    "counter",
    "{request}",
    "Requests submitted, refused ones included.",
)
REQUESTS = _spec(
    "adaptive_batcher_requests_total",
    "adaptive_batcher.requests",
    "counter",
    "{request}",
    "Requests that ended, by outcome: completed, failed (model error), rejected (refused at "
    "submit or by a close), expired (deadline or SLO shedding), cancelled (caller gave up).",
    "outcome",
)
REQUESTS_WITHIN_SLO = _spec(
    "adaptive_batcher_requests_within_slo_total",
    "adaptive_batcher.requests.within_slo",
    "counter",
    "{request}",
    "Completed requests whose latency met the SLO (all completed ones without an SLO).",
)
OOM_ERRORS = _spec(
    "adaptive_batcher_oom_errors_total",
    "adaptive_batcher.oom_errors",
    "counter",
    "{error}",
    "Model calls that ran out of memory.",
)
CONTROLLER_DECISIONS = _spec(
    "adaptive_batcher_controller_decisions_total",
    "adaptive_batcher.controller.decisions",
    "counter",
    "{decision}",
    "Controller decisions by reason tag (pid.slack, budget, window_unused, ...), since the "
    "controller in force started.",
    "reason",
)
DEVICE_BUSY = _spec(
    "adaptive_batcher_device_busy_seconds_total",
    "adaptive_batcher.device.busy",
    "counter",
    "s",
    "Sum of batch execution times: device time spent on this batcher's batches (overlapping "
    "batches each count).",
)

METRICS: tuple[MetricSpec, ...] = (
    REQUEST_LATENCY,
    REQUEST_LATENCY_QUANTILE,
    BATCH_QUEUE_WAIT,
    BATCH_EXECUTION,
    BATCH_SIZE,
    QUEUE_DEPTH,
    QUEUE_UNITS,
    WINDOW,
    MAX_BATCH_SIZE,
    MAX_CONCURRENT_BATCHES,
    BATCHES_IN_FLIGHT,
    SLO_LATENCY,
    SLO_ATTAINMENT,
    SLO_UNREACHABLE,
    EXECUTOR,
    REQUESTS_SUBMITTED,
    REQUESTS,
    REQUESTS_WITHIN_SLO,
    OOM_ERRORS,
    CONTROLLER_DECISIONS,
    DEVICE_BUSY,
)
"""Every exported metric, in the order exporters emit them."""


class BatchTimings:
    """A batch listener (see ``AdaptiveBatcher.add_batch_listener``) that counts each batch's
    queue wait and execution time into cumulative histograms, seconds.

    The listener runs on the event loop and a reader may run on another thread; a lock keeps
    each snapshot whole.

    Args:
        bounds_s: the histograms' upper bounds, seconds (default
            :data:`~adaptive_batcher.metrics.histogram.LATENCY_BOUNDS_S`).

    Raises:
        ValueError: empty, unsorted or non-finite bounds.
    """

    def __init__(self, bounds_s: tuple[float, ...] = LATENCY_BOUNDS_S) -> None:
        bounds = check_bounds("bounds_s", bounds_s)
        self._lock = threading.Lock()
        self._queue_wait = CumulativeHistogram(bounds)
        self._execution = CumulativeHistogram(bounds)

    def __call__(self, record: BatchRecord) -> None:
        with self._lock:
            self._queue_wait.record(record.queue_wait_s)
            self._execution.record(record.execution_s)

    def snapshot(self) -> tuple[HistogramSnapshot, HistogramSnapshot]:
        """``(queue wait, execution time)`` of the batches so far, seconds."""
        with self._lock:
            return self._queue_wait.snapshot(), self._execution.snapshot()


def batch_size_histogram(
    sizes: Mapping[int, int], bounds: tuple[float, ...] = BATCH_SIZE_BOUNDS
) -> HistogramSnapshot:
    """``{items per batch: batches}`` (``stats().batch_sizes``) as a cumulative histogram at
    ``bounds`` (items); exact, since every size is known."""
    ordered = sorted(sizes.items())
    cumulative = [sum(n for size, n in ordered if size <= bound) for bound in bounds]
    cumulative.append(sum(sizes.values()))
    return HistogramSnapshot(bounds, tuple(cumulative), float(sum(s * n for s, n in ordered)))


@dataclass(frozen=True, slots=True)
class BatcherReading:
    """One batcher, read at one scrape.

    Attributes:
        stats: its ``stats()``.
        latency: latencies of the answered requests since it started, seconds.
        batch_size: requests per batch since it started.
        queue_wait: per batch, the wait of its oldest request, seconds, since its exporter
            began watching it.
        execution: per batch, the model's time, seconds, since the same moment.
    """

    stats: BatcherStats
    latency: HistogramSnapshot
    batch_size: HistogramSnapshot
    queue_wait: HistogramSnapshot
    execution: HistogramSnapshot

    @property
    def name(self) -> str:
        """The batcher's name: the ``batcher`` label."""
        return self.stats.name

    @property
    def device_busy_s(self) -> float:
        """Device time spent on this batcher since it started, seconds: every model call's
        wall time (``Counts.device_busy_s``)."""
        return self.stats.counts.device_busy_s

    @property
    def outcomes(self) -> dict[str, int]:
        """Requests that ended, by outcome (the keys of :data:`OUTCOMES`)."""
        counts = self.stats.counts
        return {outcome: getattr(counts, outcome) for outcome in OUTCOMES}


class _Watched:
    """A batcher an exporter reads, with the timings listener it added to it."""

    __slots__ = ("batcher", "listeners", "timings")

    def __init__(self, batcher: AdaptiveBatcher[Any, Any], listeners: tuple[Any, ...]) -> None:
        self.batcher = batcher
        self.timings = BatchTimings()
        self.listeners = (self.timings, *listeners)

    def attach(self) -> None:
        for listener in self.listeners:
            self.batcher.add_batch_listener(listener)

    def detach(self) -> None:
        for listener in self.listeners:
            self.batcher.remove_batch_listener(listener)

    def read(self) -> BatcherReading:
        stats = self.batcher.stats()
        queue_wait, execution = self.timings.snapshot()
        cumulative = self.batcher.recorder.latency_cumulative
        assert cumulative is not None  # a runtime batcher's recorder is always exported
        latency = cumulative.snapshot()
        return BatcherReading(
            stats, latency, batch_size_histogram(stats.batch_sizes), queue_wait, execution
        )


class Watchlist:
    """The batchers one exporter serves, by name (the ``batcher`` label must tell them apart).

    Adding a batcher adds a :class:`BatchTimings` listener to it (and any ``listeners`` given);
    removing it takes them off again.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watched: dict[str, _Watched] = {}

    def add(self, batcher: AdaptiveBatcher[Any, Any], *listeners: Any) -> None:
        """Watch ``batcher``; a closed batcher of the same name is replaced (a restarted
        service's new batcher takes over its label).

        Raises:
            TypeError: ``batcher`` is not an ``AdaptiveBatcher``.
            ValueError: ``batcher`` is watched already, or an open batcher of its name is
                (give batchers distinct ``name`` arguments).
        """
        if not isinstance(batcher, AdaptiveBatcher):
            raise TypeError(f"batcher must be an AdaptiveBatcher, got {type(batcher).__name__}")
        with self._lock:
            old = self._watched.get(batcher.name)
            if old is not None and old.batcher is batcher:
                raise ValueError(f"batcher {batcher.name!r} is exported already")
            if old is not None and not old.batcher.closed:
                raise ValueError(
                    f"another open batcher named {batcher.name!r} is exported already; give "
                    "each batcher its own name (AdaptiveBatcher(name=...))"
                )
            watched = _Watched(batcher, listeners)
            watched.attach()
            if old is not None:
                old.detach()
            self._watched[batcher.name] = watched

    def remove(self, batcher: AdaptiveBatcher[Any, Any]) -> None:
        """Stop watching ``batcher``.

        Raises:
            ValueError: it is not watched.
        """
        with self._lock:
            watched = self._watched.get(getattr(batcher, "name", None))  # type: ignore[arg-type]
            if watched is None or watched.batcher is not batcher:
                raise ValueError("this batcher is not exported here")
            del self._watched[batcher.name]
            watched.detach()

    def __len__(self) -> int:
        return len(self._watched)

    def __contains__(self, batcher: object) -> bool:
        return any(w.batcher is batcher for w in list(self._watched.values()))

    def read(self) -> list[BatcherReading]:
        """A reading of every watched batcher, in the order they were added."""
        with self._lock:
            watched = list(self._watched.values())
        return [w.read() for w in watched]

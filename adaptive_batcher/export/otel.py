"""OpenTelemetry metrics for AdaptiveBatcher: observable instruments read at collection time.

Needs ``opentelemetry-api`` (and, to export anything, ``opentelemetry-sdk`` with a reader and
an exporter): ``pip install "adaptive-batcher[otel]"``. Importing this module without the API
raises ``ImportError`` saying so; ``import adaptive_batcher`` never imports it.

Use:

```python
from opentelemetry.sdk.metrics import MeterProvider
from adaptive_batcher.export.otel import instrument_otel

provider = MeterProvider(metric_readers=[reader])  # e.g. a PeriodicExportingMetricReader
instrument_otel(batcher, provider)
```

Counters and gauges are observable instruments whose callbacks read ``stats()`` when the SDK
collects (on its reader's thread; reading is safe there). The per-batch histograms (queue wait,
execution time, batch size) are recorded by a batch listener, once per batch each. Names,
units and attributes are those of :data:`~adaptive_batcher.export.readings.METRICS` (the
``otel_name`` column); every observation carries the ``batcher`` attribute.

One difference from the Prometheus exporter: the per-request latency histogram
(``adaptive_batcher.request.latency``) is not exported, since the OpenTelemetry API records one
value per call and has no way to hand over counts already bucketed, and recording each request
would put exporter work on the serving path. The latency quantiles of the sliding window
(``adaptive_batcher.request.latency.quantile``, attribute ``quantile``) stand in for it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from adaptive_batcher.export import readings as r
from adaptive_batcher.metrics.exporters import ExporterPerTarget
from adaptive_batcher.metrics.histogram import LATENCY_BOUNDS_S
from adaptive_batcher.runtime.batcher import AdaptiveBatcher
from adaptive_batcher.runtime.stats import BatchRecord

try:
    from opentelemetry.metrics import (
        CallbackOptions,
        Histogram,
        MeterProvider,
        Observation,
        get_meter_provider,
    )
except ImportError as exc:  # pragma: no cover - exercised in a subprocess by the tests
    raise ImportError(
        "adaptive_batcher.export.otel needs the opentelemetry-api package (and "
        'opentelemetry-sdk to export): pip install "adaptive-batcher[otel]"'
    ) from exc

__all__ = ["BatcherInstruments", "instrument_otel", "uninstrument_otel"]

_Read = Callable[[r.BatcherReading], Iterable[tuple[float, dict[str, str]]]]


def _one(get: Callable[[r.BatcherReading], float]) -> _Read:
    """A reading -> one value (none if NaN), with no attribute beyond ``batcher``."""

    def read(reading: r.BatcherReading) -> Iterable[tuple[float, dict[str, str]]]:
        value = float(get(reading))
        return [] if math.isnan(value) else [(value, {})]

    return read


def _by(label: str, get: Callable[[r.BatcherReading], Any]) -> _Read:
    """A reading -> one value per key of the mapping ``get`` returns, keyed by ``label``."""

    def read(reading: r.BatcherReading) -> Iterable[tuple[float, dict[str, str]]]:
        return [(float(v), {label: str(k)}) for k, v in get(reading).items()]

    return read


def _quantiles(reading: r.BatcherReading) -> Iterable[tuple[float, dict[str, str]]]:
    window = reading.stats.latency
    if window.count == 0:
        return []
    return [(window.quantile_ms(q) / 1e3, {"quantile": str(q)}) for q in r.LATENCY_QUANTILES]


_GAUGES: tuple[tuple[r.MetricSpec, _Read], ...] = (
    (r.REQUEST_LATENCY_QUANTILE, _quantiles),
    (r.QUEUE_DEPTH, _one(lambda x: x.stats.queue_depth)),
    (r.QUEUE_UNITS, _one(lambda x: x.stats.queued_units)),
    (r.WINDOW, _one(lambda x: x.stats.window_ms / 1e3)),
    (r.MAX_BATCH_SIZE, _one(lambda x: x.stats.max_batch_size)),
    (r.MAX_CONCURRENT_BATCHES, _one(lambda x: x.stats.max_concurrent_batches)),
    (r.BATCHES_IN_FLIGHT, _one(lambda x: x.stats.in_flight_batches)),
    (r.SLO_LATENCY, _one(lambda x: x.stats.slo.room_ms / 1e3 if x.stats.slo else math.nan)),
    (r.SLO_ATTAINMENT, _one(lambda x: x.stats.slo_attainment)),
    (r.SLO_UNREACHABLE, _one(lambda x: x.stats.slo_unreachable)),
    (r.EXECUTOR, _by("executor", lambda x: {x.stats.executor: 1})),
)
_COUNTERS: tuple[tuple[r.MetricSpec, _Read], ...] = (
    (r.REQUESTS_SUBMITTED, _one(lambda x: x.stats.counts.submitted)),
    (r.REQUESTS, _by("outcome", lambda x: x.outcomes)),
    (r.REQUESTS_WITHIN_SLO, _one(lambda x: x.stats.counts.within_slo)),
    (r.OOM_ERRORS, _one(lambda x: x.stats.counts.oom_errors)),
    (r.CONTROLLER_DECISIONS, _by("reason", lambda x: x.stats.decision_reasons)),
    (r.DEVICE_BUSY, _one(lambda x: x.device_busy_s)),
)


class BatcherInstruments:
    """The OpenTelemetry instruments of any number of batchers on one meter provider (the
    ``batcher`` attribute tells them apart). :func:`instrument_otel` makes one per provider.

    Args:
        meter_provider: where the instruments are created (default: the global provider,
            ``opentelemetry.metrics.get_meter_provider()``).
    """

    def __init__(self, meter_provider: MeterProvider | None = None) -> None:
        from adaptive_batcher import __version__

        provider = get_meter_provider() if meter_provider is None else meter_provider
        meter = provider.get_meter("adaptive_batcher", __version__)
        self._batchers = r.Watchlist()
        for spec, read in _GAUGES:
            meter.create_observable_gauge(
                spec.otel_name, [self._callback(read)], spec.unit, spec.help
            )
        for spec, read in _COUNTERS:
            meter.create_observable_counter(
                spec.otel_name, [self._callback(read)], spec.unit, spec.help
            )

        def histogram(spec: r.MetricSpec, bounds: tuple[float, ...]) -> Histogram:
            return meter.create_histogram(
                spec.otel_name,
                spec.unit,
                spec.help,
                explicit_bucket_boundaries_advisory=[float(b) for b in bounds],
            )

        self._queue_wait = histogram(r.BATCH_QUEUE_WAIT, LATENCY_BOUNDS_S)
        self._execution = histogram(r.BATCH_EXECUTION, LATENCY_BOUNDS_S)
        self._batch_size = histogram(r.BATCH_SIZE, r.BATCH_SIZE_BOUNDS)

    def add(self, batcher: AdaptiveBatcher[Any, Any]) -> None:
        """Instrument ``batcher`` too (it takes over the attribute value of a closed batcher
        of its name).

        Raises:
            TypeError: not an ``AdaptiveBatcher``.
            ValueError: instrumented here already, or an open batcher of the same name is.
        """
        self._batchers.add(batcher, self._recorder(getattr(batcher, "name", "")))

    def remove(self, batcher: AdaptiveBatcher[Any, Any]) -> None:
        """Stop observing ``batcher``: its listener goes, its callbacks report it no more.

        Raises:
            ValueError: it is not instrumented here.
        """
        self._batchers.remove(batcher)

    def __contains__(self, batcher: object) -> bool:
        return batcher in self._batchers

    def _recorder(self, name: str) -> Callable[[BatchRecord], None]:
        attributes = {"batcher": name}
        queue_wait, execution, size = self._queue_wait, self._execution, self._batch_size

        def record(batch: BatchRecord) -> None:
            queue_wait.record(batch.queue_wait_s, attributes)
            execution.record(batch.execution_s, attributes)
            size.record(batch.items, attributes)

        return record

    def _callback(self, read: _Read) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def callback(options: CallbackOptions) -> Iterator[Observation]:
            del options
            for reading in self._batchers.read():
                for value, extra in read(reading):
                    yield Observation(value, {"batcher": reading.name, **extra})

        return callback


_INSTRUMENTS: ExporterPerTarget[MeterProvider, BatcherInstruments] = ExporterPerTarget(
    BatcherInstruments, "no batcher was instrumented on this meter provider"
)


def instrument_otel(
    batcher: AdaptiveBatcher[Any, Any], meter_provider: MeterProvider | None = None
) -> BatcherInstruments:
    """Report ``batcher``'s metrics to ``meter_provider`` (default: the global provider).

    The first call for a provider creates the instruments (a :class:`BatcherInstruments`);
    later calls add their batcher to them (an OpenTelemetry meter keeps one instrument per
    name). Instrument before taking traffic: the per-batch histograms count the batches from
    this call on.

    Returns:
        The provider's instruments.

    Raises:
        TypeError: ``batcher`` is not an ``AdaptiveBatcher``.
        ValueError: ``batcher`` is instrumented already, or an open batcher of the same name is.
    """
    provider = get_meter_provider() if meter_provider is None else meter_provider
    instruments = _INSTRUMENTS.of(provider)
    instruments.add(batcher)
    return instruments


def uninstrument_otel(
    batcher: AdaptiveBatcher[Any, Any], meter_provider: MeterProvider | None = None
) -> None:
    """Stop reporting ``batcher`` to ``meter_provider`` (default: the global provider).

    Raises:
        ValueError: it was not instrumented there by :func:`instrument_otel`.
    """
    provider = get_meter_provider() if meter_provider is None else meter_provider
    _INSTRUMENTS.existing(provider).remove(batcher)

"""Prometheus metrics for AdaptiveBatcher: a custom collector, read at scrape time.

Needs ``prometheus-client`` (``pip install "adaptive-batcher[prometheus]"``); importing this
module without it raises ``ImportError`` saying so. ``import adaptive_batcher`` never imports it.

Use:

```python
from prometheus_client import make_asgi_app
from adaptive_batcher.export.prometheus import register_prometheus

register_prometheus(batcher)  # into prometheus_client's default registry
app.mount("/metrics", make_asgi_app())  # a FastAPI or Starlette app
```

Every metric carries a ``batcher`` label, the batcher's ``name``; one collector per registry
serves all the batchers registered into it. The metrics, their types and units are listed in
:data:`~adaptive_batcher.export.readings.METRICS` and in ``docs/metrics.md``.

A scrape calls ``stats()`` and copies the recorder's counters: the serving path does no work
for the exporter but one listener call per batch
(:class:`~adaptive_batcher.export.readings.BatchTimings`), none per request. Scraping from
another thread (``prometheus_client.start_http_server``) is safe.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from typing import Any, cast

from adaptive_batcher.export import readings as r
from adaptive_batcher.metrics.exporters import ExporterPerTarget
from adaptive_batcher.metrics.histogram import HistogramSnapshot
from adaptive_batcher.runtime.batcher import AdaptiveBatcher

try:
    from prometheus_client import REGISTRY, CollectorRegistry
    from prometheus_client.metrics_core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
        Metric,
    )
    from prometheus_client.registry import Collector
    from prometheus_client.utils import floatToGoString
except ImportError as exc:  # pragma: no cover - exercised in a subprocess by the tests
    raise ImportError(
        "adaptive_batcher.export.prometheus needs the prometheus-client package: "
        'pip install "adaptive-batcher[prometheus]"'
    ) from exc

__all__ = ["BatcherCollector", "register_prometheus", "unregister_prometheus"]

# the bucket bound as Prometheus writes it ("0.005", "1.0", "+Inf"); untyped in the client
_go_float = cast(Callable[[float], str], floatToGoString)


class BatcherCollector(Collector):
    """A Prometheus collector for any number of batchers (the ``batcher`` label tells them
    apart). :func:`register_prometheus` makes one per registry; use it directly to register into
    a registry by hand (``registry.register(BatcherCollector([batcher]))``).

    Args:
        batchers: batchers to export from the start.

    Raises:
        TypeError, ValueError: as :meth:`add`.
    """

    def __init__(self, batchers: Iterable[AdaptiveBatcher[Any, Any]] = ()) -> None:
        self._batchers = r.Watchlist()
        for batcher in batchers:
            self.add(batcher)

    def add(self, batcher: AdaptiveBatcher[Any, Any]) -> None:
        """Export ``batcher`` too (it takes over the label of a closed batcher of its name).

        Raises:
            TypeError: not an ``AdaptiveBatcher``.
            ValueError: exported here already, or an open batcher of the same name is.
        """
        self._batchers.add(batcher)

    def remove(self, batcher: AdaptiveBatcher[Any, Any]) -> None:
        """Stop exporting ``batcher``.

        Raises:
            ValueError: it is not exported here.
        """
        self._batchers.remove(batcher)

    def __contains__(self, batcher: object) -> bool:
        return batcher in self._batchers

    def describe(self) -> Iterable[Metric]:
        """The metric families, without samples (the registry checks names with these)."""
        return list(_families([]))

    def collect(self) -> Iterable[Metric]:
        """The metric families with a sample set per batcher, read now."""
        return list(_families(self._batchers.read()))


def _registered(registry: CollectorRegistry) -> BatcherCollector:
    collector = BatcherCollector()
    registry.register(collector)  # raises for metric names held by another collector
    return collector


_COLLECTORS: ExporterPerTarget[CollectorRegistry, BatcherCollector] = ExporterPerTarget(
    _registered, "no batcher was registered in this registry"
)


def register_prometheus(
    batcher: AdaptiveBatcher[Any, Any], registry: CollectorRegistry | None = None
) -> BatcherCollector:
    """Export ``batcher``'s metrics from ``registry`` (default: prometheus_client's ``REGISTRY``,
    what ``make_asgi_app()``, ``generate_latest()`` and ``start_http_server()`` serve).

    The first call for a registry registers a :class:`BatcherCollector` in it; later calls add
    their batcher to that collector. Register before taking traffic: the queue-wait and
    execution histograms count the batches from this call on (the other metrics count from the
    batcher's start).

    Returns:
        The registry's collector.

    Raises:
        TypeError: ``batcher`` is not an ``AdaptiveBatcher``.
        ValueError: ``batcher`` is registered already, or an open batcher of the same name is;
            or the registry already holds metrics of these names from another collector.
    """
    registry = REGISTRY if registry is None else registry
    collector = _COLLECTORS.of(registry)
    collector.add(batcher)
    return collector


def unregister_prometheus(
    batcher: AdaptiveBatcher[Any, Any], registry: CollectorRegistry | None = None
) -> None:
    """Stop exporting ``batcher`` from ``registry`` (default: ``REGISTRY``); its series vanish
    from the next scrape.

    Raises:
        ValueError: it was not registered there by :func:`register_prometheus`.
    """
    registry = REGISTRY if registry is None else registry
    _COLLECTORS.existing(registry).remove(batcher)


def _unit(spec: r.MetricSpec) -> str:
    base = spec.name.removesuffix("_total")
    for unit in ("seconds", "ratio"):
        if base.endswith(f"_{unit}"):
            return unit
    return ""


def _families(readings: list[r.BatcherReading]) -> Iterator[Metric]:
    yield _histogram(r.REQUEST_LATENCY, readings, lambda x: x.latency)
    yield _latency_quantiles(readings)
    yield _histogram(r.BATCH_QUEUE_WAIT, readings, lambda x: x.queue_wait)
    yield _histogram(r.BATCH_EXECUTION, readings, lambda x: x.execution)
    yield _histogram(r.BATCH_SIZE, readings, lambda x: x.batch_size)
    gauges: list[tuple[r.MetricSpec, Any]] = [
        (r.QUEUE_DEPTH, lambda x: x.stats.queue_depth),
        (r.QUEUE_UNITS, lambda x: x.stats.queued_units),
        (r.WINDOW, lambda x: x.stats.window_ms / 1e3),
        (r.MAX_BATCH_SIZE, lambda x: x.stats.max_batch_size),
        (r.MAX_CONCURRENT_BATCHES, lambda x: x.stats.max_concurrent_batches),
        (r.BATCHES_IN_FLIGHT, lambda x: x.stats.in_flight_batches),
        (r.SLO_LATENCY, lambda x: x.stats.slo.room_ms / 1e3 if x.stats.slo else math.nan),
        (r.SLO_ATTAINMENT, lambda x: x.stats.slo_attainment),
        (r.SLO_UNREACHABLE, lambda x: float(x.stats.slo_unreachable)),
    ]
    for spec, value in gauges:
        yield _gauge(spec, readings, value)
    yield _labelled(GaugeMetricFamily, r.EXECUTOR, readings, lambda x: {x.stats.executor: 1})
    yield _counter(r.REQUESTS_SUBMITTED, readings, lambda x: x.stats.counts.submitted)
    yield _labelled(CounterMetricFamily, r.REQUESTS, readings, lambda x: x.outcomes)
    yield _counter(r.REQUESTS_WITHIN_SLO, readings, lambda x: x.stats.counts.within_slo)
    yield _counter(r.OOM_ERRORS, readings, lambda x: x.stats.counts.oom_errors)
    yield _labelled(
        CounterMetricFamily, r.CONTROLLER_DECISIONS, readings, lambda x: x.stats.decision_reasons
    )
    yield _counter(r.DEVICE_BUSY, readings, lambda x: x.device_busy_s)


def _histogram(spec: r.MetricSpec, readings: list[r.BatcherReading], get: Any) -> Metric:
    family = HistogramMetricFamily(spec.name, spec.help, labels=spec.labels, unit=_unit(spec))
    for reading in readings:
        snapshot: HistogramSnapshot = get(reading)
        les = [_go_float(bound) for bound in snapshot.bounds] + ["+Inf"]
        family.add_metric(
            [reading.name], list(zip(les, snapshot.cumulative, strict=True)), snapshot.sum
        )
    return family


def _latency_quantiles(readings: list[r.BatcherReading]) -> Metric:
    spec = r.REQUEST_LATENCY_QUANTILE
    family = GaugeMetricFamily(spec.name, spec.help, labels=spec.labels, unit=_unit(spec))
    for reading in readings:
        window = reading.stats.latency
        if window.count == 0:  # no answers in the window: no quantiles
            continue
        for q in r.LATENCY_QUANTILES:
            family.add_metric([reading.name, _go_float(q)], window.quantile_ms(q) / 1e3)
    return family


def _gauge(spec: r.MetricSpec, readings: list[r.BatcherReading], get: Any) -> Metric:
    family = GaugeMetricFamily(spec.name, spec.help, labels=spec.labels, unit=_unit(spec))
    for reading in readings:
        value = float(get(reading))
        if not math.isnan(value):  # NaN: nothing to say (no SLO, no answers)
            family.add_metric([reading.name], value)
    return family


def _counter(spec: r.MetricSpec, readings: list[r.BatcherReading], get: Any) -> Metric:
    family = CounterMetricFamily(spec.name, spec.help, labels=spec.labels, unit=_unit(spec))
    for reading in readings:
        family.add_metric([reading.name], float(get(reading)))
    return family


def _labelled(
    family_type: type[GaugeMetricFamily | CounterMetricFamily],
    spec: r.MetricSpec,
    readings: list[r.BatcherReading],
    get: Any,
) -> Metric:
    """One sample per key of the mapping ``get`` returns, labelled by ``spec``'s last label."""
    family = family_type(spec.name, spec.help, labels=spec.labels, unit=_unit(spec))
    for reading in readings:
        for label, value in get(reading).items():
            family.add_metric([reading.name, label], float(value))
    return family

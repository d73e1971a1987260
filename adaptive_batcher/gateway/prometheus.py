"""Prometheus metrics for :class:`~adaptive_batcher.gateway.shell.LLMGate`: a custom collector,
read at scrape time.

Needs ``prometheus-client`` (``pip install "adaptive-batcher[prometheus]"``); importing this
module without it raises ``ImportError`` saying so. Use:

```python
from prometheus_client import make_asgi_app
from adaptive_batcher.gateway.prometheus import register_prometheus

register_prometheus(gate)  # into prometheus_client's default registry
app.mount("/metrics", make_asgi_app())
```

Every metric is named ``adaptive_batcher_llm_*`` and carries a ``gate`` label, the gate's
``name``; one collector per registry serves all the gates registered into it. The metrics are
listed in :data:`~adaptive_batcher.gateway.readings.GATE_METRICS`. A scrape calls each gate's
``stats()``; the serving path does nothing for the exporter. Scraping from another thread is
safe.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import cast

from adaptive_batcher.gateway import readings as r
from adaptive_batcher.gateway.shell import LLMGate
from adaptive_batcher.gateway.stats import LLMGateStats, TimeQuantiles
from adaptive_batcher.metrics.exporters import ExporterPerTarget
from adaptive_batcher.metrics.histogram import HistogramSnapshot

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
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "adaptive_batcher.gateway.prometheus needs the prometheus-client package: "
        'pip install "adaptive-batcher[prometheus]"'
    ) from exc

__all__ = ["GateCollector", "register_prometheus", "unregister_prometheus"]

_go_float = cast(Callable[[float], str], floatToGoString)
_Get = Callable[[LLMGateStats], float]


class GateCollector(Collector):
    """A Prometheus collector for any number of gates (the ``gate`` label tells them apart).
    :func:`register_prometheus` makes one per registry; or register one by hand
    (``registry.register(GateCollector([gate]))``).

    Args:
        gates: gates to export from the start.

    Raises:
        TypeError, ValueError: as :meth:`add`.
    """

    def __init__(self, gates: Iterable[LLMGate] = ()) -> None:
        self._gates = r.GateList()
        for gate in gates:
            self.add(gate)

    def add(self, gate: LLMGate) -> None:
        """Export ``gate`` too (it takes over the label of a closed gate of its name).

        Raises:
            TypeError: not an ``LLMGate``.
            ValueError: exported here already, or an open gate of the same name is.
        """
        self._gates.add(gate)

    def remove(self, gate: LLMGate) -> None:
        """Stop exporting ``gate``.

        Raises:
            ValueError: it is not exported here.
        """
        self._gates.remove(gate)

    def __contains__(self, gate: object) -> bool:
        return gate in self._gates

    def describe(self) -> Iterable[Metric]:
        """The metric families, without samples (the registry checks names with these)."""
        return list(_families([]))

    def collect(self) -> Iterable[Metric]:
        """The metric families with a sample set per gate, read now."""
        return list(_families(self._gates.read()))


def _registered(registry: CollectorRegistry) -> GateCollector:
    collector = GateCollector()
    registry.register(collector)  # raises for metric names held by another collector
    return collector


_COLLECTORS: ExporterPerTarget[CollectorRegistry, GateCollector] = ExporterPerTarget(
    _registered, "no gate was registered in this registry"
)


def register_prometheus(gate: LLMGate, registry: CollectorRegistry | None = None) -> GateCollector:
    """Export ``gate``'s metrics from ``registry`` (default: prometheus_client's ``REGISTRY``).

    The first call for a registry registers a :class:`GateCollector` in it; later calls add
    their gate to that collector.

    Returns:
        The registry's collector.

    Raises:
        TypeError: ``gate`` is not an ``LLMGate``.
        ValueError: ``gate`` is registered already, or an open gate of the same name is; or the
            registry already holds metrics of these names from another collector.
    """
    registry = REGISTRY if registry is None else registry
    collector = _COLLECTORS.of(registry)
    collector.add(gate)
    return collector


def unregister_prometheus(gate: LLMGate, registry: CollectorRegistry | None = None) -> None:
    """Stop exporting ``gate`` from ``registry`` (default: ``REGISTRY``).

    Raises:
        ValueError: it was not registered there by :func:`register_prometheus`.
    """
    registry = REGISTRY if registry is None else registry
    _COLLECTORS.existing(registry).remove(gate)


def _unit(spec: r.GateMetric) -> str:
    return "seconds" if spec.name.removesuffix("_total").endswith("_seconds") else ""


def _admit_ttft(stats: LLMGateStats) -> float:
    limit = stats.decision.limits.admit_ttft_s
    return math.nan if limit is None else limit


def _prefill_pacing(stats: LLMGateStats) -> float:
    rate = stats.decision.limits.prefill_tokens_per_s
    return math.nan if rate is None else rate


def _families(readings: list[LLMGateStats]) -> Iterator[Metric]:
    yield _histogram(r.TTFT, readings, lambda s: s.ttft_histogram)
    yield _histogram(r.TPOT, readings, lambda s: s.tpot_histogram)
    yield _histogram(r.QUEUE_WAIT, readings, lambda s: s.queue_wait_histogram)
    yield _quantiles(r.TTFT_QUANTILE, readings, lambda s: s.ttft)
    yield _quantiles(r.TPOT_QUANTILE, readings, lambda s: s.tpot)
    gauges: list[tuple[r.GateMetric, _Get]] = [
        (r.IN_FLIGHT_LIMIT, lambda s: s.limit),
        (r.IN_FLIGHT, lambda s: s.in_flight),
        (r.WAITING, lambda s: s.waiting),
        (r.ADMIT_TTFT, _admit_ttft),
        (r.PREFILL_PACING, _prefill_pacing),
        (r.SLO_TTFT, lambda s: s.slo.ttft_s),
        (r.SLO_TPOT, lambda s: s.slo.tpot_s),
    ]
    for spec, get in gauges:
        yield _gauge(spec, readings, get)
    yield _counter(r.SUBMITTED, readings, lambda s: s.counts.submitted)
    yield _counter(r.ADMITTED, readings, lambda s: s.counts.admitted)
    yield _labelled_counter(r.REQUESTS, readings, r.outcomes)
    yield _labelled_counter(r.REJECTED, readings, lambda s: s.rejected_by_reason)


def _histogram(
    spec: r.GateMetric,
    readings: list[LLMGateStats],
    get: Callable[[LLMGateStats], HistogramSnapshot],
) -> Metric:
    family = HistogramMetricFamily(spec.name, spec.help, labels=spec.labels, unit=_unit(spec))
    for stats in readings:
        snapshot = get(stats)
        les = [_go_float(bound) for bound in snapshot.bounds] + ["+Inf"]
        family.add_metric(
            [stats.name], list(zip(les, snapshot.cumulative, strict=True)), snapshot.sum
        )
    return family


def _quantiles(
    spec: r.GateMetric,
    readings: list[LLMGateStats],
    get: Callable[[LLMGateStats], TimeQuantiles],
) -> Metric:
    family = GaugeMetricFamily(spec.name, spec.help, labels=spec.labels, unit=_unit(spec))
    for stats in readings:
        window = get(stats)
        if window.count == 0:  # nothing in the window: no quantiles
            continue
        values = (window.p50_s, window.p90_s, window.p99_s)
        for q, value in zip(r.QUANTILES, values, strict=True):
            family.add_metric([stats.name, _go_float(q)], value)
    return family


def _gauge(spec: r.GateMetric, readings: list[LLMGateStats], get: _Get) -> Metric:
    family = GaugeMetricFamily(spec.name, spec.help, labels=spec.labels, unit=_unit(spec))
    for stats in readings:
        value = float(get(stats))
        if not math.isnan(value):
            family.add_metric([stats.name], value)
    return family


def _counter(spec: r.GateMetric, readings: list[LLMGateStats], get: _Get) -> Metric:
    family = CounterMetricFamily(spec.name, spec.help, labels=spec.labels, unit=_unit(spec))
    for stats in readings:
        family.add_metric([stats.name], float(get(stats)))
    return family


def _labelled_counter(
    spec: r.GateMetric,
    readings: list[LLMGateStats],
    get: Callable[[LLMGateStats], Mapping[str, int]],
) -> Metric:
    family = CounterMetricFamily(spec.name, spec.help, labels=spec.labels, unit=_unit(spec))
    for stats in readings:
        for label, value in get(stats).items():
            family.add_metric([stats.name, label], float(value))
    return family

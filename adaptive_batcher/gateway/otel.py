"""OpenTelemetry metrics for :class:`~adaptive_batcher.gateway.shell.LLMGate`: observable
instruments read at collection time.

Needs ``opentelemetry-api`` (and ``opentelemetry-sdk`` with a reader and an exporter to export
anything): ``pip install "adaptive-batcher[otel]"``; importing this module without the API
raises ``ImportError`` saying so. Use:

```python
from opentelemetry.sdk.metrics import MeterProvider
from adaptive_batcher.gateway.otel import instrument_otel

instrument_otel(gate, MeterProvider(metric_readers=[reader]))
```

Gauges and counters are observable instruments whose callbacks read ``stats()`` when the SDK
collects. Names, units and attributes are those of
:data:`~adaptive_batcher.gateway.readings.GATE_METRICS` (its ``otel_name`` column); every
observation carries the ``gate`` attribute. As for the batcher's exporter, the three
histograms (TTFT, TPOT, queue wait) are not exported: the OpenTelemetry API records one value
per call and cannot take counts already bucketed, and recording per request would put exporter
work on the serving path; their window quantiles (TTFT and TPOT) stand in.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping

from adaptive_batcher.gateway import readings as r
from adaptive_batcher.gateway.shell import LLMGate
from adaptive_batcher.gateway.stats import LLMGateStats, TimeQuantiles
from adaptive_batcher.metrics.exporters import ExporterPerTarget

try:
    from opentelemetry.metrics import (
        CallbackOptions,
        MeterProvider,
        Observation,
        get_meter_provider,
    )
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "adaptive_batcher.gateway.otel needs the opentelemetry-api package (and "
        'opentelemetry-sdk to export): pip install "adaptive-batcher[otel]"'
    ) from exc

__all__ = ["GateInstruments", "instrument_otel", "uninstrument_otel"]

_Read = Callable[[LLMGateStats], Iterable[tuple[float, dict[str, str]]]]


def _one(get: Callable[[LLMGateStats], float | None]) -> _Read:
    def read(stats: LLMGateStats) -> Iterable[tuple[float, dict[str, str]]]:
        value = get(stats)
        if value is None or math.isnan(float(value)):
            return []
        return [(float(value), {})]

    return read


def _quantiles(get: Callable[[LLMGateStats], TimeQuantiles]) -> _Read:
    def read(stats: LLMGateStats) -> Iterable[tuple[float, dict[str, str]]]:
        window = get(stats)
        if window.count == 0:
            return []
        values = (window.p50_s, window.p90_s, window.p99_s)
        return [(v, {"quantile": str(q)}) for q, v in zip(r.QUANTILES, values, strict=True)]

    return read


def _by(label: str, get: Callable[[LLMGateStats], Mapping[str, int]]) -> _Read:
    def read(stats: LLMGateStats) -> Iterable[tuple[float, dict[str, str]]]:
        return [(float(v), {label: str(k)}) for k, v in get(stats).items()]

    return read


_GAUGES: tuple[tuple[r.GateMetric, _Read], ...] = (
    (r.TTFT_QUANTILE, _quantiles(lambda s: s.ttft)),
    (r.TPOT_QUANTILE, _quantiles(lambda s: s.tpot)),
    (r.IN_FLIGHT_LIMIT, _one(lambda s: s.limit)),
    (r.IN_FLIGHT, _one(lambda s: s.in_flight)),
    (r.WAITING, _one(lambda s: s.waiting)),
    (r.ADMIT_TTFT, _one(lambda s: s.decision.limits.admit_ttft_s)),
    (r.PREFILL_PACING, _one(lambda s: s.decision.limits.prefill_tokens_per_s)),
    (r.SLO_TTFT, _one(lambda s: s.slo.ttft_s)),
    (r.SLO_TPOT, _one(lambda s: s.slo.tpot_s)),
)
_COUNTERS: tuple[tuple[r.GateMetric, _Read], ...] = (
    (r.SUBMITTED, _one(lambda s: s.counts.submitted)),
    (r.ADMITTED, _one(lambda s: s.counts.admitted)),
    (r.REQUESTS, _by("outcome", r.outcomes)),
    (r.REJECTED, _by("reason", lambda s: s.rejected_by_reason)),
)


class GateInstruments:
    """The OpenTelemetry instruments of any number of gates on one meter provider (the
    ``gate`` attribute tells them apart). :func:`instrument_otel` makes one per provider.

    Args:
        meter_provider: where the instruments are created (default: the global provider).
    """

    def __init__(self, meter_provider: MeterProvider | None = None) -> None:
        from adaptive_batcher import __version__

        provider = get_meter_provider() if meter_provider is None else meter_provider
        meter = provider.get_meter("adaptive_batcher.gateway", __version__)
        self._gates = r.GateList()
        for spec, read in _GAUGES:
            meter.create_observable_gauge(
                spec.otel_name, [self._callback(read)], spec.unit, spec.help
            )
        for spec, read in _COUNTERS:
            meter.create_observable_counter(
                spec.otel_name, [self._callback(read)], spec.unit, spec.help
            )

    def add(self, gate: LLMGate) -> None:
        """Instrument ``gate`` too.

        Raises:
            TypeError: not an ``LLMGate``.
            ValueError: instrumented here already, or an open gate of the same name is.
        """
        self._gates.add(gate)

    def remove(self, gate: LLMGate) -> None:
        """Stop observing ``gate``.

        Raises:
            ValueError: it is not instrumented here.
        """
        self._gates.remove(gate)

    def __contains__(self, gate: object) -> bool:
        return gate in self._gates

    def _callback(self, read: _Read) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def callback(options: CallbackOptions) -> Iterator[Observation]:
            del options
            for stats in self._gates.read():
                for value, extra in read(stats):
                    yield Observation(value, {"gate": stats.name, **extra})

        return callback


_INSTRUMENTS: ExporterPerTarget[MeterProvider, GateInstruments] = ExporterPerTarget(
    GateInstruments, "no gate was instrumented on this meter provider"
)


def instrument_otel(gate: LLMGate, meter_provider: MeterProvider | None = None) -> GateInstruments:
    """Report ``gate``'s metrics to ``meter_provider`` (default: the global provider).

    The first call for a provider creates the instruments; later calls add their gate.

    Returns:
        The provider's instruments.

    Raises:
        TypeError: ``gate`` is not an ``LLMGate``.
        ValueError: ``gate`` is instrumented already, or an open gate of the same name is.
    """
    provider = get_meter_provider() if meter_provider is None else meter_provider
    instruments = _INSTRUMENTS.of(provider)
    instruments.add(gate)
    return instruments


def uninstrument_otel(gate: LLMGate, meter_provider: MeterProvider | None = None) -> None:
    """Stop reporting ``gate`` to ``meter_provider`` (default: the global provider).

    Raises:
        ValueError: it was not instrumented there by :func:`instrument_otel`.
    """
    provider = get_meter_provider() if meter_provider is None else meter_provider
    _INSTRUMENTS.existing(provider).remove(gate)

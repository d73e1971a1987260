"""The gate's OpenTelemetry instruments, read by the SDK's InMemoryMetricReader."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from adaptive_batcher.gateway.otel import instrument_otel, uninstrument_otel
from adaptive_batcher.gateway.readings import GATE_METRICS
from tests.gateway.fakes import Clock, FakeEngine, every_ending, make_gate

Points = dict[str, dict[tuple[tuple[str, Any], ...], Any]]


def collect(reader: InMemoryMetricReader) -> Points:
    points: Points = {}
    data = reader.get_metrics_data()
    assert data is not None
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    attributes = tuple(sorted(point.attributes.items()))
                    points.setdefault(metric.name, {})[attributes] = point
    return points


def point(points: Points, name: str, **attributes: str) -> Any:
    return points[name][tuple(sorted(attributes.items()))]


async def test_collections_show_the_gates_counts_and_gauges() -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    clock = Clock()
    fake = FakeEngine()
    gate = make_gate(fake, limit=1, clock=clock, max_queue=1)
    instruments = instrument_otel(gate, provider)
    assert gate in instruments
    async with gate:
        await every_ending(gate, fake, clock)
        points = collect(reader)
    requests = "adaptive_batcher.llm.requests"
    assert point(points, requests, gate="llm", outcome="completed").value == 2
    assert point(points, requests, gate="llm", outcome="cancelled").value == 1
    assert point(points, "adaptive_batcher.llm.requests.submitted", gate="llm").value == 6
    rejected = "adaptive_batcher.llm.requests.rejected"
    assert point(points, rejected, gate="llm", reason="queue_full").value == 1
    assert point(points, "adaptive_batcher.llm.in_flight_limit", gate="llm").value == 1
    ttft = point(points, "adaptive_batcher.llm.ttft_quantile", gate="llm", quantile="0.99")
    assert ttft.value == pytest.approx(0.5, rel=0.011)
    reported = {spec.otel_name for spec in GATE_METRICS if spec.kind != "histogram"}
    # early rejection and prefill pacing off
    off = {
        "adaptive_batcher.llm.admit_ttft",
        "adaptive_batcher.llm.prefill_pacing_tokens_per_second",
    }
    assert reported - set(points) == off
    uninstrument_otel(gate, provider)
    assert gate not in instruments
    with pytest.raises(ValueError, match="not exported here"):
        uninstrument_otel(gate, provider)
    with pytest.raises(ValueError, match="no gate was instrumented"):
        uninstrument_otel(gate, MeterProvider())

"""The OpenTelemetry instruments, read by the SDK's InMemoryMetricReader: the counters equal
the batcher's counts, the per-batch histograms hold every batch."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from adaptive_batcher import SLO, AdaptiveBatcher
from adaptive_batcher.export.otel import instrument_otel, uninstrument_otel
from adaptive_batcher.export.readings import LATENCY_BOUNDS_S, METRICS
from adaptive_batcher.testing import run_in_virtual_time
from tests.export.helpers import SERVICE_S, mixed_traffic, model

Points = dict[str, dict[tuple[tuple[str, Any], ...], Any]]


def collect(reader: InMemoryMetricReader) -> Points:
    """{instrument name: {sorted attributes: data point}}."""
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


def test_collections_show_the_batchers_counts_and_batches() -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])

    async def main() -> tuple[Any, Points]:
        batcher = AdaptiveBatcher(
            model, window_ms=2.0, max_batch_size=4, max_queue_size=4, name="mlp"
        )
        instrument_otel(batcher, provider)
        async with batcher:
            await mixed_traffic(batcher)
            return batcher.stats(), collect(reader)

    stats, points = run_in_virtual_time(main())
    counts = stats.counts
    assert counts.submitted == 23 and counts.completed == 18
    for outcome in ("completed", "failed", "rejected", "expired", "cancelled"):
        got = point(points, "adaptive_batcher.requests", batcher="mlp", outcome=outcome).value
        assert got == getattr(counts, outcome), outcome
    assert point(points, "adaptive_batcher.requests.submitted", batcher="mlp").value == 23
    assert point(points, "adaptive_batcher.requests.within_slo", batcher="mlp").value == 18
    sizes = point(points, "adaptive_batcher.batch.size", batcher="mlp")
    assert (sizes.count, sizes.sum, sizes.min, sizes.max) == (6, 19, 1, 4)
    execution = point(points, "adaptive_batcher.batch.execution", batcher="mlp")
    assert execution.count == 6 and execution.sum == pytest.approx(6 * SERVICE_S)
    assert execution.explicit_bounds == LATENCY_BOUNDS_S
    busy = point(points, "adaptive_batcher.device.busy", batcher="mlp").value
    assert busy == pytest.approx(execution.sum)
    waits = point(points, "adaptive_batcher.batch.queue_wait", batcher="mlp")
    # three batches wait out the 2 ms window, the burst's second one the first one's call
    assert waits.count == 6 and waits.sum == pytest.approx(3 * 0.002 + SERVICE_S)
    assert point(points, "adaptive_batcher.window", batcher="mlp").value == 0.002
    assert point(points, "adaptive_batcher.max_batch_size", batcher="mlp").value == 4
    assert point(points, "adaptive_batcher.queue.depth", batcher="mlp").value == 0
    p99 = point(points, "adaptive_batcher.request.latency.quantile", batcher="mlp", quantile="0.99")
    assert p99.value == pytest.approx(stats.latency.p99_ms / 1e3)
    assert "adaptive_batcher.slo.attainment" not in points  # no SLO


def test_every_instrument_but_the_request_histogram_is_reported() -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])

    async def main() -> Points:
        batcher = AdaptiveBatcher(model, slo=SLO(latency_ms=50.0), name="slo")
        instrument_otel(batcher, provider)
        async with batcher:
            for _ in range(20):
                await batcher.submit_many([1.0, 2.0])
                await asyncio.sleep(0.03)
        return collect(reader)

    points = run_in_virtual_time(main())
    expected = {spec.otel_name for spec in METRICS} - {"adaptive_batcher.request.latency"}
    assert set(points) == expected
    assert point(points, "adaptive_batcher.slo.attainment", batcher="slo").value == 1.0
    assert point(points, "adaptive_batcher.slo.latency", batcher="slo").value == 0.05
    decisions = points["adaptive_batcher.controller.decisions"]
    assert sum(p.value for p in decisions.values()) > 0
    executor = points["adaptive_batcher.executor"]
    assert {k: p.value for k, p in executor.items()} == {
        (("batcher", "slo"), ("executor", "async")): 1
    }


def test_batchers_share_a_provider_and_leave_it() -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])

    async def main() -> None:
        first = AdaptiveBatcher(model, window_ms=0.0, name="first")
        second = AdaptiveBatcher(model, window_ms=0.0, name="second")
        instruments = instrument_otel(first, provider)
        assert instrument_otel(second, provider) is instruments
        with pytest.raises(ValueError, match="another open batcher named 'first'"):
            instrument_otel(AdaptiveBatcher(model, name="first"), provider)
        async with first, second:
            await first.submit(1.0)
            await second.submit_many([1.0, 2.0])
            uninstrument_otel(second, provider)
            await second.submit(3.0)  # no longer observed: its listener is gone too
            points = collect(reader)
        submitted = points["adaptive_batcher.requests.submitted"]
        assert {dict(k)["batcher"]: p.value for k, p in submitted.items()} == {"first": 1}
        sizes = points["adaptive_batcher.batch.size"]
        # cumulative temporality: the second batcher's histogram point stays, with one batch
        assert point(points, "adaptive_batcher.batch.size", batcher="second").count == 1
        assert len(sizes) == 2
        assert second not in instruments and first in instruments
        with pytest.raises(ValueError, match="not exported here"):
            uninstrument_otel(second, provider)

    run_in_virtual_time(main())
    with pytest.raises(ValueError, match="no batcher was instrumented on this meter provider"):
        uninstrument_otel(AdaptiveBatcher(model), MeterProvider())

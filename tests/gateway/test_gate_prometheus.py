"""The gate's Prometheus collector: a scrape shows the names, types and counts of the gate."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from adaptive_batcher.gateway import LLMGate
from adaptive_batcher.gateway.prometheus import (
    GateCollector,
    register_prometheus,
    unregister_prometheus,
)
from adaptive_batcher.gateway.readings import GATE_METRICS
from adaptive_batcher.metrics.histogram import LATENCY_BOUNDS_S
from tests.export.helpers import parse, value
from tests.gateway.fakes import Clock, FakeEngine, every_ending, make_gate


async def test_a_scrape_shows_the_gates_counts_and_histograms() -> None:
    registry = CollectorRegistry()
    clock = Clock()
    fake = FakeEngine()
    gate = make_gate(fake, limit=1, clock=clock, max_queue=1)
    register_prometheus(gate, registry)
    async with gate:
        await every_ending(gate, fake, clock)
        samples = parse(generate_latest(registry).decode())
    g = {"gate": "llm"}
    expected = {"completed": 2, "rejected": 1, "expired": 1, "failed": 1, "cancelled": 1}
    for outcome, count in expected.items():
        assert value(samples, "adaptive_batcher_llm_requests_total", **g, outcome=outcome) == count
    assert value(samples, "adaptive_batcher_llm_requests_submitted_total", **g) == 6
    assert value(samples, "adaptive_batcher_llm_requests_admitted_total", **g) == 4
    rejected = "adaptive_batcher_llm_requests_rejected_total"
    assert value(samples, rejected, **g, reason="queue_full") == 1
    assert value(samples, rejected, **g, reason="ttft_unreachable") == 0
    assert value(samples, "adaptive_batcher_llm_in_flight_limit", **g) == 1
    assert value(samples, "adaptive_batcher_llm_in_flight", **g) == 0
    assert value(samples, "adaptive_batcher_llm_waiting", **g) == 0
    assert value(samples, "adaptive_batcher_llm_slo_ttft_seconds", **g) == 0.3
    assert "adaptive_batcher_llm_admit_ttft_seconds" not in samples  # no early rejection
    assert "adaptive_batcher_llm_prefill_pacing_tokens_per_second" not in samples  # no pacing
    # TTFT: 0.25 s for the first, 0.5 s for the last; the one failed before any token
    assert value(samples, "adaptive_batcher_llm_ttft_seconds_count", **g) == 2
    assert value(samples, "adaptive_batcher_llm_ttft_seconds_sum", **g) == pytest.approx(0.75)
    buckets = samples["adaptive_batcher_llm_ttft_seconds_bucket"]
    cumulative = [buckets[(("gate", "llm"), ("le", str(b)))] for b in LATENCY_BOUNDS_S]
    assert cumulative == sorted(cumulative)
    assert buckets[(("gate", "llm"), ("le", "0.2"))] == 0
    assert buckets[(("gate", "llm"), ("le", "0.3"))] == 1
    assert buckets[(("gate", "llm"), ("le", "+Inf"))] == 2
    quantile = samples["adaptive_batcher_llm_ttft_quantile_seconds"]
    assert quantile[(("gate", "llm"), ("quantile", "0.99"))] == pytest.approx(0.5, rel=0.011)
    assert value(samples, "adaptive_batcher_llm_queue_wait_seconds_count", **g) == 4


async def test_every_listed_metric_is_exposed_with_its_type() -> None:
    registry = CollectorRegistry()
    clock = Clock()
    fake = FakeEngine()
    gate = make_gate(fake, limit=1, clock=clock, max_queue=1)
    GateCollector([gate])  # a collector made by hand does not register itself
    register_prometheus(gate, registry)
    async with gate:
        await every_ending(gate, fake, clock)
        text = generate_latest(registry).decode()
    families = {f.name: f.type for f in text_string_to_metric_families(text)}
    for spec in GATE_METRICS:
        if spec.name.endswith(("admit_ttft_seconds", "prefill_pacing_tokens_per_second")):
            continue  # shown only while early rejection, or prefill pacing, is on
        base = spec.name.removesuffix("_total")
        assert spec.kind in (families.get(base), families.get(spec.name)), spec.name
        assert f"# TYPE {spec.name} {spec.kind}" in text or (
            spec.kind == "counter" and f"# TYPE {base}_total counter" in text
        )
        assert spec.name.startswith("adaptive_batcher_llm_")
        assert spec.labels[0] == "gate"
        if spec.unit == "s":
            assert base.endswith("_seconds"), spec.name


async def test_gates_share_a_registry_and_leave_it() -> None:
    registry = CollectorRegistry()
    first = make_gate(FakeEngine())
    second = LLMGate(FakeEngine().engine, first.slo, name="code", max_in_flight=4)
    collector = register_prometheus(first, registry)
    assert register_prometheus(second, registry) is collector
    assert first in collector and second in collector
    samples = parse(generate_latest(registry).decode())
    assert value(samples, "adaptive_batcher_llm_in_flight_limit", gate="code") == 4
    with pytest.raises(ValueError, match="exported already"):
        register_prometheus(first, registry)
    same_name = make_gate(FakeEngine())
    with pytest.raises(ValueError, match="another open gate named 'llm'"):
        register_prometheus(same_name, registry)
    await first.aclose()
    register_prometheus(same_name, registry)  # a closed gate's label is taken over
    assert first not in collector
    unregister_prometheus(second, registry)
    samples = parse(generate_latest(registry).decode())
    assert ("gate", "code") not in {
        label for labels in samples["adaptive_batcher_llm_in_flight_limit"] for label in labels
    }
    with pytest.raises(ValueError, match="not exported here"):
        unregister_prometheus(second, registry)
    with pytest.raises(ValueError, match="no gate was registered"):
        unregister_prometheus(second, CollectorRegistry())
    with pytest.raises(TypeError, match="gate must be an LLMGate"):
        register_prometheus("llm", registry)  # type: ignore[arg-type]
    await second.aclose()
    await same_name.aclose()


async def test_the_prefill_pacing_rate_in_force_is_a_gauge() -> None:
    registry = CollectorRegistry()
    gate = make_gate(FakeEngine(), prefill_tokens_per_s=5000.0)
    register_prometheus(gate, registry)
    samples = parse(generate_latest(registry).decode())
    rate = value(samples, "adaptive_batcher_llm_prefill_pacing_tokens_per_second", gate="llm")
    assert rate == 5000.0
    await gate.aclose()

"""Observation builders for table tests."""

from __future__ import annotations

from typing import Any

from adaptive_batcher.control.types import Bounds, Decision, Observation
from adaptive_batcher.slo import SLO
from adaptive_batcher.telemetry.base import TelemetrySample


def linear_ms(fixed_ms: float = 4.0, per_unit_ms: float = 0.05) -> Any:
    """A service-time model: ``fixed_ms + per_unit_ms * n``."""
    return lambda n: fixed_ms + per_unit_ms * n


def observe(**changes: Any) -> Observation:
    """An observation of a healthy batcher: SLO 50 ms p99 (target 40 ms), cap 64, window 2 ms,
    1000 req/s, p99 20 ms, service 4 ms + 0.05 ms per item; override any field."""
    defaults: dict[str, Any] = {
        "now_s": 10.0,
        "interval_s": 0.25,
        "current": Decision(2.0, 64, "start"),
        "bounds": Bounds(0.0, 50.0, 1, 256),
        "slo": SLO(latency_ms=50.0),
        "latency_ms": 20.0,
        "p50_ms": 10.0,
        "mean_ms": 11.0,
        "latency_samples": 250,
        "arrival_rate_rps": 1000.0,
        "throughput_rps": 1000.0,
        "goodput_rps": 1000.0,
        "batches": 25,
        "mean_batch_size": 10.0,
        "fill_ratio": 10 / 64,
        "service_median_ms": linear_ms(),
        "service_samples": 200,
        "telemetry": TelemetrySample(),
    }
    defaults.update(changes)
    return Observation(**defaults)


class Fixed:
    """A policy that always proposes ``decision`` (change it between ticks to move it)."""

    name = "fixed"

    def __init__(self, decision: Decision) -> None:
        self.decision = decision

    def reset(self, current: Decision) -> None:
        del current

    def decide(self, observation: Observation) -> Decision:
        del observation
        return self.decision

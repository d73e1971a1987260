"""CumulativeHistogram: exact counts at fixed bounds, the layout Prometheus exposes."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adaptive_batcher.metrics import CumulativeHistogram, HistogramSnapshot
from adaptive_batcher.metrics.histogram import LATENCY_BOUNDS_S


def _exact(values: list[float], bounds: tuple[float, ...]) -> tuple[int, ...]:
    return (*(sum(1 for v in values if v <= b) for b in bounds), len(values))


def test_counts_are_cumulative_at_the_bounds() -> None:
    histogram = CumulativeHistogram((0.01, 0.1, 1.0))
    histogram.record_many([0.005, 0.01, 0.05, 0.5, 0.5, 3.0])
    histogram.record(0.1)
    snapshot = histogram.snapshot()
    assert snapshot == HistogramSnapshot((0.01, 0.1, 1.0), (2, 4, 6, 7), pytest.approx(4.165))
    assert snapshot.count == 7
    assert snapshot.per_bucket == (2, 2, 2, 1)


@settings(max_examples=300, deadline=None)
@given(
    waits=st.lists(st.floats(0.0, 100.0), min_size=0, max_size=300),
    now=st.floats(1.0, 1e6),
)
def test_recording_sorted_arrivals_counts_like_each_latency(waits: list[float], now: float) -> None:
    """The runtime's per-batch path (bisections of the arrivals) gives the counts of the
    latencies one by one, but for a latency within float rounding of a bound."""
    arrivals = sorted(now - w for w in waits)
    latencies = [now - a for a in arrivals]
    by_batch = CumulativeHistogram()
    by_batch.record_since(arrivals, now)
    snapshot = by_batch.snapshot()
    exact = _exact(latencies, LATENCY_BOUNDS_S)
    assert snapshot.count == len(waits)
    for bound, got, want in zip(LATENCY_BOUNDS_S, snapshot.cumulative, exact, strict=False):
        on_the_edge = sum(1 for v in latencies if abs(v - bound) <= 1e-9 * max(1.0, now))
        assert abs(got - want) <= on_the_edge
    assert snapshot.sum == pytest.approx(sum(latencies), rel=1e-9, abs=1e-6 * max(1.0, now))


def test_batches_accumulate_and_overflow_lands_in_inf() -> None:
    histogram = CumulativeHistogram((0.001, 0.01))
    histogram.record_since([0.0, 9.0, 9.995, 9.9995], now=10.0)
    histogram.record_since([19.9999], now=20.0)
    assert histogram.snapshot().cumulative == (2, 3, 5)
    assert histogram.snapshot().sum == pytest.approx(10.0 + 1.0 + 0.005 + 0.0005 + 0.0001)


@pytest.mark.parametrize(
    ("bounds", "message"),
    [
        ((), "bounds must be a non-empty sequence"),
        ((0.1, math.inf), "bounds must be a non-empty sequence of finite numbers"),
        ((0.1, 0.1), "bounds must be strictly increasing"),
        ((1.0, 0.5), "bounds must be strictly increasing"),
    ],
)
def test_bounds_are_checked(bounds: tuple[float, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CumulativeHistogram(bounds)

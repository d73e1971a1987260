"""Sliding-window log-bucket histogram: ~1 % relative error, expiry by slices."""

from __future__ import annotations

import math
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adaptive_batcher.metrics import SlidingHistogram
from adaptive_batcher.metrics.histogram import _REPRESENTATIVE, GAMMA, _bucket

BOUND = (GAMMA - 1) / (GAMMA + 1) + 1e-9


@settings(max_examples=200, deadline=None)
@given(
    values=st.lists(st.floats(1e-5, 100.0), min_size=1, max_size=400),
    q=st.sampled_from([0.5, 0.9, 0.95, 0.99, 1.0]),
)
def test_quantiles_within_one_percent_of_exact(values: list[float], q: float) -> None:
    histogram = SlidingHistogram(window_s=10.0)
    for v in values:
        histogram.record(v, now=0.0)
    exact_ms = float(np.quantile(values, q, method="inverted_cdf")) * 1e3
    got_ms = histogram.quantile_ms(q, now=0.0)
    assert abs(got_ms - exact_ms) <= BOUND * exact_ms


def test_summary_matches_single_quantiles_and_counts() -> None:
    histogram = SlidingHistogram()
    values = [0.001 * i for i in range(1, 1001)]
    histogram.record_many(values, now=0.0)
    summary = histogram.quantiles(now=0.0)
    assert summary.count == 1000
    assert summary.p99_ms == histogram.quantile_ms(0.99, now=0.0)
    assert summary.p50_ms == pytest.approx(500, rel=0.01)
    assert summary.max_ms == pytest.approx(1000, rel=0.01)
    assert summary.mean_ms == pytest.approx(500.5, rel=1e-9)
    assert summary.quantile_ms(0.99) == summary.p99_ms


def test_old_samples_leave_the_window_slice_by_slice() -> None:
    histogram = SlidingHistogram(window_s=10.0, slices=10)
    histogram.record(1.0, now=0.0)  # slow sample at t=0
    for t in range(1, 10):
        histogram.record(0.001, now=float(t))
    assert histogram.quantile_ms(1.0, now=9.5) == pytest.approx(1000, rel=0.01)
    assert histogram.quantile_ms(1.0, now=10.5) == pytest.approx(1, rel=0.01)
    assert histogram.count(now=10.5) == 9
    assert histogram.count(now=1000.0) == 0
    assert math.isnan(histogram.quantiles(now=1000.0).p99_ms)


def test_tiny_and_huge_values_are_clamped_not_lost() -> None:
    histogram = SlidingHistogram()
    histogram.record(0.0, now=0.0)
    histogram.record(1e9, now=0.0)
    assert histogram.count(now=0.0) == 2


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"window_s": 0}, "window_s must be > 0, got 0"), ({"slices": 0}, "slices must be >= 1")],
)
def test_validation(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SlidingHistogram(**kwargs)  # type: ignore[arg-type]


def test_quantile_argument_validation() -> None:
    with pytest.raises(ValueError, match=r"q must be in \(0, 1\], got 0"):
        SlidingHistogram().quantile_ms(0, now=0.0)


def test_span_narrows_to_recent_slices() -> None:
    histogram = SlidingHistogram(window_s=10.0, slices=20)
    histogram.record(1.0, now=0.0)
    histogram.record(0.002, now=5.0)
    histogram.record(0.001, now=6.2)
    assert histogram.quantiles(now=6.3).count == 3
    recent = histogram.quantiles(now=6.3, span_s=2.0)
    assert recent.count == 2
    assert recent.max_ms == pytest.approx(2, rel=0.01)
    assert histogram.quantile_ms(1.0, now=6.3, span_s=0.5) == pytest.approx(1, rel=0.01)


@settings(max_examples=300, deadline=None)
@given(
    waits=st.lists(st.floats(0.0, 200.0), min_size=0, max_size=300),
    now=st.floats(1.0, 1e6),
)
def test_recording_sorted_arrivals_matches_recording_each_latency(
    waits: list[float], now: float
) -> None:
    """record_since (the runtime's per-batch path) counts like record_many, up to a sample that
    sits on a bucket boundary landing in the neighbouring bucket (float rounding)."""
    arrivals = sorted(now - w for w in waits)
    by_batch, one_by_one = SlidingHistogram(), SlidingHistogram()
    by_batch.record_since(arrivals, now)
    one_by_one.record_many([now - a for a in arrivals], now)
    assert by_batch.count(now) == len(arrivals)
    if not arrivals:
        return
    for q in (0.5, 0.9, 0.99, 1.0):
        assert by_batch.quantile_ms(q, now) == pytest.approx(
            one_by_one.quantile_ms(q, now), rel=GAMMA - 1 + 1e-9
        )
    assert by_batch.quantiles(now).mean_ms == pytest.approx(
        one_by_one.quantiles(now).mean_ms, rel=1e-6, abs=1e-6
    )


def test_recording_sorted_arrivals_puts_each_sample_in_its_bucket() -> None:
    now = 100.0
    waits_s = [5.0, 0.5, 0.5, 0.05, 0.005, 0.005, 0.005, 1e-7, 0.0]
    histogram = SlidingHistogram()
    histogram.record_since([now - w for w in waits_s], now)
    summary = histogram.quantiles(now)
    assert summary.count == len(waits_s)
    assert summary.max_ms == pytest.approx(5000, rel=0.01)
    assert summary.p50_ms == pytest.approx(5, rel=0.01)
    assert summary.mean_ms == pytest.approx(sum(waits_s) / len(waits_s) * 1e3, rel=1e-6)


def test_reading_does_not_move_the_window() -> None:
    """A read at a later time (a metrics scrape on another thread, its clock ahead of the loop's)
    leaves the samples of an earlier window in place for the next reader."""
    histogram = SlidingHistogram(window_s=10.0, slices=10)
    histogram.record(0.004, now=0.0)
    assert histogram.count(now=10.5) == 0
    assert histogram.quantiles(now=10.5).count == 0
    assert histogram.count(now=9.5) == 1
    assert histogram.quantile_ms(1.0, now=9.5) == pytest.approx(4, rel=0.01)


@settings(max_examples=200, deadline=None)
@given(
    steps=st.lists(
        st.tuples(st.floats(0.0, 3.0), st.floats(1e-4, 2.0), st.booleans()),
        min_size=1,
        max_size=60,
    ),
    probe=st.floats(0.0, 30.0),
)
def test_reads_between_records_change_nothing(
    steps: list[tuple[float, float, bool]], probe: float
) -> None:
    """Records at increasing times, with or without reads (at any time) in between, give the
    same quantiles at the end."""
    read_too, records_only = SlidingHistogram(window_s=4.0, slices=8), SlidingHistogram(4.0, 8)
    now = 0.0
    for gap, value, read in steps:
        now += gap
        if read:
            read_too.quantiles(now + probe)
            read_too.fraction_at_most(0.5, now + probe / 2)
        read_too.record(value, now)
        records_only.record(value, now)
    for at in (now, now + 1.0, now + 3.9, now + probe):
        assert read_too.quantiles(at) == records_only.quantiles(at) or (
            read_too.quantiles(at).count == 0 and records_only.quantiles(at).count == 0
        )


def test_fraction_at_most_counts_the_window_against_a_limit() -> None:
    histogram = SlidingHistogram(window_s=10.0, slices=10)
    assert math.isnan(histogram.fraction_at_most(0.1, now=0.0))
    histogram.record_many([0.01, 0.02, 0.05, 0.2], now=0.0)
    assert histogram.fraction_at_most(0.1, now=1.0) == 0.75
    assert histogram.fraction_at_most(0.015, now=1.0) == 0.25
    assert histogram.fraction_at_most(1.0, now=1.0) == 1.0
    assert histogram.fraction_at_most(0.001, now=1.0) == 0.0
    histogram.record(1.0, now=5.0)
    assert histogram.fraction_at_most(0.1, now=5.0, span_s=1.0) == 0.0
    assert histogram.fraction_at_most(0.1, now=10.5) == 0.0  # the first four have left


def test_the_share_within_a_set_limit_is_exact_near_it() -> None:
    """0.0497 s and 0.0502 s share a bucket reported as 50.1 ms: against a 50 ms limit the
    buckets alone count both late; the limit set in advance counts each as it is."""
    assert _REPRESENTATIVE[_bucket(0.0497)] == _REPRESENTATIVE[_bucket(0.0502)] > 0.05
    for how in ("record", "record_many", "record_since"):
        histogram = SlidingHistogram(window_s=10.0, slices=10)
        histogram.set_limit(0.05)
        latencies = [0.0497, 0.0499, 0.05, 0.0502]
        if how == "record":
            for latency in latencies:
                histogram.record(latency, now=1.0)
        elif how == "record_many":
            histogram.record_many(latencies, now=1.0)
        else:
            histogram.record_since(sorted(1.0 - v for v in latencies), now=1.0)
        assert histogram.fraction_at_most(0.05, now=1.0) == 0.75, how
        assert histogram.fraction_at_most(0.0498, now=1.0) == 0.0, how  # buckets: not this limit


def test_errors_never_count_within_the_limit() -> None:
    histogram = SlidingHistogram(window_s=10.0, slices=10)
    histogram.set_limit(0.05)
    histogram.record_since([0.99, 0.99], now=1.0, failed=1)  # 10 ms each, one an error
    histogram.record_many([0.01, 0.01], now=1.0, failed=2)
    assert histogram.fraction_at_most(0.05, now=1.0) == 0.25
    assert histogram.quantiles(now=1.0).count == 4  # their latencies still count


def test_a_changed_limit_is_exact_from_the_next_slice() -> None:
    histogram = SlidingHistogram(window_s=10.0, slices=10)
    histogram.record(0.0499, now=0.0)  # no limit yet: this slice is read from its buckets
    histogram.set_limit(0.05)
    histogram.record(0.0499, now=0.5)  # the same slice, now mixed: still its buckets
    histogram.record(0.0499, now=1.5)  # a new slice under the limit: exact
    assert histogram.fraction_at_most(0.05, now=1.5) == pytest.approx(1 / 3)
    histogram.set_limit(0.1)
    assert histogram.fraction_at_most(0.05, now=1.5) == pytest.approx(1 / 3)  # kept as counted
    histogram.record(0.0499, now=2.5)
    assert histogram.fraction_at_most(0.1, now=2.5) == 1.0
    histogram.clear()
    histogram.record(0.0999, now=3.0)
    assert histogram.fraction_at_most(0.1, now=3.0) == 1.0  # the limit outlives clear()


def test_the_maximum_is_exact_and_caps_the_quantiles() -> None:
    histogram = SlidingHistogram(window_s=10.0, slices=10)
    histogram.record_many([0.0497] * 99, now=1.0)
    summary = histogram.quantiles(now=1.0)
    assert summary.max_ms == pytest.approx(49.7)
    assert summary.p50_ms == summary.p99_ms == pytest.approx(49.7)  # not the bucket's 50.1
    assert histogram.quantile_ms(0.99, now=1.0) == pytest.approx(49.7)
    histogram.record_since([2.5], now=3.5)  # a later slice holds 1 s
    assert histogram.quantiles(now=3.5).max_ms == pytest.approx(1000.0)
    assert histogram.quantiles(now=3.5, span_s=0.4).max_ms == pytest.approx(1000.0)
    assert histogram.quantiles(now=11.5).max_ms == pytest.approx(1000.0)  # the first has left
    assert histogram.quantiles(now=11.5).p50_ms == pytest.approx(1000.0, rel=0.01)


def _full_window_quantile_ms(
    histogram: SlidingHistogram, q: float, now: float, span: float
) -> float:
    """The quantile from every bucket of the window's slices (no bucket range): the reference
    the range each slice keeps must reproduce exactly."""
    slices = histogram._live_slices(now, span)
    if not slices:
        return math.nan
    totals = np.asarray([histogram._counts[i] for i in slices], dtype=np.int64).sum(axis=0)
    total = int(totals.sum())
    if total == 0:
        return math.nan
    index = int(np.searchsorted(np.cumsum(totals), math.ceil(q * total), side="left"))
    largest_ms = max(histogram._max[i] for i in slices) * 1e3  # the exact maximum caps them
    return min(float(_REPRESENTATIVE[index] * 1e3), largest_ms)


def _full_window_fraction(
    histogram: SlidingHistogram, limit_s: float, now: float, span: float
) -> float:
    slices = histogram._live_slices(now, span)
    if not slices:
        return math.nan
    totals = np.asarray([histogram._counts[i] for i in slices], dtype=np.int64).sum(axis=0)
    total = int(totals.sum())
    if total == 0:
        return math.nan
    within = int(np.searchsorted(_REPRESENTATIVE, limit_s, side="right"))
    return float(totals[:within].sum()) / total


@settings(max_examples=200, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.floats(0.0, 1.5),
            st.lists(st.floats(1e-7, 50.0), min_size=1, max_size=8),
            st.sampled_from(["record", "record_many", "record_since"]),
        ),
        min_size=1,
        max_size=40,
    ),
    span=st.floats(0.1, 5.0),
)
def test_readings_from_the_bucket_range_equal_readings_from_every_bucket(
    steps: list[tuple[float, list[float], str]], span: float
) -> None:
    histogram = SlidingHistogram(window_s=4.0, slices=8)
    now = 0.0
    for gap, values, how in steps:
        now += gap
        if how == "record":
            histogram.record(values[0], now)
        elif how == "record_many":
            histogram.record_many(values, now)
        else:
            histogram.record_since(sorted(now - v for v in values), now)
        for at in (now, now + span):
            summary = histogram.quantiles(at, span_s=span)
            for q in (0.5, 0.9, 0.99, 1.0):
                expected = _full_window_quantile_ms(histogram, q, at, span)
                got = histogram.quantile_ms(q, at, span_s=span)
                assert got == expected or (math.isnan(got) and math.isnan(expected))
                if q in (0.5, 0.99):
                    listed = summary.quantile_ms(q)
                    assert listed == expected or (math.isnan(listed) and math.isnan(expected))
            for limit_s in (1e-6, 0.01, values[0], 100.0):
                fraction = histogram.fraction_at_most(limit_s, at, span_s=span)
                expected_fraction = _full_window_fraction(histogram, limit_s, at, span)
                assert fraction == expected_fraction or (
                    math.isnan(fraction) and math.isnan(expected_fraction)
                )


def test_readings_on_another_thread_while_recording_never_fail() -> None:
    """A metrics scrape reads on its own thread while the event loop records: readings may
    miss the latest samples, never raise (each slice's bucket range is read once)."""
    histogram = SlidingHistogram(window_s=1.0, slices=4)
    stop = threading.Event()
    errors: list[BaseException] = []

    def read() -> None:
        try:
            while not stop.is_set():
                histogram.quantiles(now_box[0] + 0.01, span_s=0.5)
                histogram.fraction_at_most(0.01, now_box[0])
                histogram.count(now_box[0])
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    now_box = [0.0]
    rng = np.random.default_rng(0)
    reader = threading.Thread(target=read)
    reader.start()
    try:
        for step in range(30_000):
            now_box[0] = step * 1e-4
            waits = np.sort(rng.lognormal(-5.0, 2.0, 3))[::-1]  # ranges widen both ways
            histogram.record_since((now_box[0] - waits).tolist(), now_box[0])
            histogram.record(float(rng.lognormal(-5.0, 2.0)), now_box[0])
    finally:
        stop.set()
        reader.join()
    assert not errors, errors[0]

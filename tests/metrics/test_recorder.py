"""Recorder: the per-batch answer counting of the runtime agrees with per-latency counting."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adaptive_batcher.metrics.recorder import Recorder


@settings(max_examples=200, deadline=None)
@given(
    waits=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=200),
    failed_fraction=st.floats(0.0, 1.0),
    slo_s=st.one_of(st.just(None), st.floats(0.001, 1.0)),
)
def test_record_answers_counts_like_record_latencies(
    waits: list[float], failed_fraction: float, slo_s: float | None
) -> None:
    now = 50.0
    arrivals = sorted(now - w for w in waits)
    failed = int(failed_fraction * len(arrivals))
    by_batch, one_by_one = Recorder(), Recorder()
    if slo_s is not None:
        by_batch.slo_latency_s = one_by_one.slo_latency_s = slo_s
    by_batch.record_answers(arrivals, failed, now)
    one_by_one.record_latencies([now - a for a in arrivals], failed, now)
    assert by_batch.completed == one_by_one.completed == len(arrivals) - failed
    assert by_batch.failed == one_by_one.failed == failed
    # a latency within float rounding of the SLO may count on either side of it
    near_limit = sum(1 for w in waits if slo_s is not None and abs(w - slo_s) < 1e-9)
    assert abs(by_batch.within_slo - one_by_one.within_slo) <= near_limit
    assert by_batch.quantiles(now).count == len(arrivals)


def test_record_answers_counts_goodput_against_the_slo() -> None:
    recorder = Recorder()
    recorder.slo_latency_s = 0.1
    now = 10.0
    recorder.record_answers([now - 0.3, now - 0.2, now - 0.05, now - 0.01], 1, now)
    assert (recorder.completed, recorder.failed) == (3, 1)
    assert recorder.within_slo == 1  # two answers within 100 ms, one of the four failed
    assert recorder.quantiles(now).max_ms == pytest.approx(300, rel=0.01)


def test_the_cumulative_latency_histogram_counts_every_answer_since_the_start() -> None:
    """Unlike the sliding window, ``latency_cumulative`` keeps answers that left the window."""
    recorder = Recorder(latency_window_s=1.0)
    recorder.record_answers([0.0, 0.0993], 0, now=0.1)
    recorder.record_latencies([0.002, 0.4], 1, now=5.0)
    assert recorder.latency_cumulative is not None
    snapshot = recorder.latency_cumulative.snapshot()
    assert snapshot.count == 4 == recorder.completed + recorder.failed
    assert recorder.quantiles(5.0).count == 2  # the first two have left the 1 s window
    by_bound = dict(zip(snapshot.bounds, snapshot.cumulative, strict=False))
    assert by_bound[0.001] == 1 and by_bound[0.002] == 2 and by_bound[0.1] == 3
    assert by_bound[0.5] == 4


def test_a_recorder_not_exported_counts_the_same_without_the_cumulative_histogram() -> None:
    """What a replay uses: every count and the sliding window as before, no exporter histogram."""
    exported, replay = Recorder(), Recorder(exported=False)
    for recorder in (exported, replay):
        recorder.slo_latency_s = 0.1
        recorder.record_answers([9.7, 9.8, 9.95], 1, now=10.0)
        recorder.record_latencies([0.02, 0.5], 0, now=10.0)
    assert replay.latency_cumulative is None and exported.latency_cumulative is not None
    assert replay.counts() == exported.counts()
    assert replay.quantiles(10.0) == exported.quantiles(10.0)

"""The event loop's lag: the recent heartbeat lateness, read at its 99th percentile and capped
at a share of the SLO's batcher budget."""

from __future__ import annotations

import math

import pytest

from adaptive_batcher.control.loop_lag import (
    LAG_BUDGET_SHARE,
    LAG_MEMORY,
    LAG_MEMORY_S,
    LAG_MIN_SAMPLES,
    LoopLag,
)


def beats(lag: LoopLag, late_s: float, count: int, start_s: float = 0.0) -> float:
    """``count`` heartbeats ``late_s`` late, one every 20 ms from ``start_s``; the last one's
    time."""
    now = start_s
    for index in range(count):
        now = start_s + 0.02 * index
        lag.note(late_s, now)
    return now


def test_no_lag_is_read_before_enough_heartbeats() -> None:
    lag = LoopLag()
    now = beats(lag, 0.004, LAG_MIN_SAMPLES - 1)
    assert lag.quantile_ms(now) == 0.0
    lag.note(0.004, now)
    assert lag.quantile_ms(now) == pytest.approx(4.0)


def test_the_lag_is_the_99th_percentile_of_the_recent_lateness() -> None:
    """200 beats: 197 at 0.5 ms and 3 at 3 ms: the 99th percentile (rank 198) is 3 ms; with
    one at 3 ms it is 0.5 ms (a rare late beat is no lag)."""
    lag = LoopLag()
    beats(lag, 0.0005, 197)
    now = beats(lag, 0.003, 3, start_s=4.0)
    assert lag.quantile_ms(now) == pytest.approx(3.0)
    rare = LoopLag()
    beats(rare, 0.0005, 199)
    now = beats(rare, 0.003, 1, start_s=4.0)
    assert rare.quantile_ms(now) == pytest.approx(0.5)


def test_the_typical_lag_is_the_median_capped_as_the_p99_is() -> None:
    """150 beats at 0.5 ms and 50 at 3 ms: the median is 0.5 ms, the p99 3 ms; both at most
    ``LAG_BUDGET_SHARE`` of the budget."""
    lag = LoopLag()
    beats(lag, 0.0005, 150)
    now = beats(lag, 0.003, 50, start_s=4.0)
    assert lag.typical_ms(40.0, now) == pytest.approx(0.5)
    assert lag.budgeted_ms(40.0, now) == pytest.approx(3.0)
    assert lag.typical_ms(0.8, now) == pytest.approx(LAG_BUDGET_SHARE * 0.8)
    assert lag.typical_ms(math.nan, now) == 0.0


def test_only_the_recent_beats_count() -> None:
    lag = LoopLag()
    beats(lag, 0.01, LAG_MEMORY)
    now = beats(lag, 0.001, LAG_MEMORY, start_s=6.0)
    assert lag.quantile_ms(now) == pytest.approx(1.0)


def test_beats_long_past_no_longer_count() -> None:
    """A busy spell under a light load, then the load drops and the loop beats seldom: the
    spell's lag is forgotten ``LAG_MEMORY_S`` on, whatever the number of beats since."""
    lag = LoopLag()
    now = beats(lag, 0.013, 100)
    assert lag.quantile_ms(now) == pytest.approx(13.0)
    assert lag.quantile_ms(now + LAG_MEMORY_S / 2) == pytest.approx(13.0)
    later = now + LAG_MEMORY_S + 0.1
    beats(lag, 0.001, 5, start_s=later)  # too few to read alone
    assert lag.quantile_ms(later + 0.1) == 0.0


def test_a_broken_reading_is_ignored() -> None:
    lag = LoopLag()
    for late_s in (-0.001, math.nan, math.inf):
        beats(lag, late_s, LAG_MIN_SAMPLES)
    assert lag.quantile_ms(1.0) == 0.0


def test_the_lag_set_aside_is_at_most_a_share_of_the_budget() -> None:
    lag = LoopLag()
    now = beats(lag, 0.003, LAG_MIN_SAMPLES)
    assert lag.budgeted_ms(40.0, now) == pytest.approx(3.0)
    assert lag.budgeted_ms(4.0, now) == pytest.approx(LAG_BUDGET_SHARE * 4.0)
    assert lag.budgeted_ms(math.nan, now) == 0.0

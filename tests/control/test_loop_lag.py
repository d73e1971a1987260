"""The event loop's lag: the recent heartbeat lateness, read at its 99th percentile and capped
at a share of the SLO's batcher budget."""

from __future__ import annotations

import math

import pytest

from adaptive_batcher.control.loop_lag import (
    LAG_BUDGET_SHARE,
    LAG_MEMORY,
    LAG_MIN_SAMPLES,
    LoopLag,
)


def test_no_lag_is_read_before_enough_heartbeats() -> None:
    lag = LoopLag()
    for _ in range(LAG_MIN_SAMPLES - 1):
        lag.note(0.004)
    assert lag.quantile_ms() == 0.0
    lag.note(0.004)
    assert lag.quantile_ms() == pytest.approx(4.0)


def test_the_lag_is_the_99th_percentile_of_the_recent_lateness() -> None:
    """200 beats: 197 at 0.5 ms and 3 at 3 ms: the 99th percentile (rank 198) is 3 ms; with
    one at 3 ms it is 0.5 ms (a rare late beat is no lag)."""
    lag = LoopLag()
    for _ in range(197):
        lag.note(0.0005)
    for _ in range(3):
        lag.note(0.003)
    assert lag.quantile_ms() == pytest.approx(3.0)
    rare = LoopLag()
    for _ in range(199):
        rare.note(0.0005)
    rare.note(0.003)
    assert rare.quantile_ms() == pytest.approx(0.5)


def test_only_the_recent_beats_count() -> None:
    lag = LoopLag()
    for _ in range(LAG_MEMORY):
        lag.note(0.01)
    for _ in range(LAG_MEMORY):
        lag.note(0.001)
    assert lag.quantile_ms() == pytest.approx(1.0)


def test_a_broken_reading_is_ignored() -> None:
    lag = LoopLag()
    for late_s in (-0.001, math.nan, math.inf):
        for _ in range(LAG_MIN_SAMPLES):
            lag.note(late_s)
    assert lag.quantile_ms() == 0.0


def test_the_lag_set_aside_is_at_most_a_share_of_the_budget() -> None:
    lag = LoopLag()
    for _ in range(LAG_MIN_SAMPLES):
        lag.note(0.003)
    assert lag.budgeted_ms(40.0) == pytest.approx(3.0)
    assert lag.budgeted_ms(4.0) == pytest.approx(LAG_BUDGET_SHARE * 4.0)
    assert lag.budgeted_ms(math.nan) == 0.0

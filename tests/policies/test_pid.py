"""PID policy: one observation in, one decision out; then short sequences for its PID practice.

The factory's batcher: SLO 50 ms (target and budget 40 ms), service 4 + 0.05 n ms, 1000 req/s,
bounds window 0-50 ms and cap 1-256. So the tail cap is 256 (2 * 16.8 ms <= 40), and at 1 req
per ms a window of W ms collects a batch of about 1 + W: the widest window whose predicted tail
latency 0.99 W + s(n + 2.33 sqrt(n)) fits 40 ms is about 33.9 ms (worked in test_first_decision).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from adaptive_batcher.control.types import Decision
from adaptive_batcher.policies import PID
from adaptive_batcher.slo import SLO
from tests.control.factories import observe


def service_median_ms(n: float) -> float:
    return 4.0 + 0.05 * round(n)


def test_holds_without_slo_or_service_estimator() -> None:
    assert PID().decide(observe(slo=None)).reason == "pid.hold"
    no_model = observe(service_median_ms=lambda n: math.nan)
    assert PID().decide(no_model) == no_model.current.with_(reason="pid.hold")


def test_first_decision_opens_the_window_as_far_as_the_budget_allows() -> None:
    decision = PID().decide(observe(latency_ms=20.0))
    assert decision.reason == "pid.plan"
    assert decision.max_batch_size == 256  # the largest cap whose two batches fit 40 ms
    window = decision.window_ms
    # by hand: at W = 33.85 the batch is 34.85, its 99th percentile 48.6 -> 49 units, 6.45 ms,
    # and the p99 request waits 0.99 of the window: 33.51 + 6.45 = 39.96 <= 40; at W = 34 it
    # is 33.66 + 6.45 > 40
    assert 33.8 <= window < 34.0
    tail = 1 + window + 2.33 * math.sqrt(1 + window)
    assert 0.99 * window + service_median_ms(tail) <= 40.0 + 0.01


def test_the_cap_fits_two_batches_within_the_slo_not_the_target() -> None:
    """resnet50 on an H200 (median times), SLO 20 ms, target 16 ms: a full batch behind a full
    batch of 128 takes 17.6 ms, within the SLO: 128's throughput (14.6k/s) meets a burst that
    64's (8.9k/s, the largest within the target) would queue for a tick."""
    sizes, times = [1, 32, 64, 128, 256], [3.68, 4.04, 7.22, 8.78, 16.65]
    resnet = observe(
        slo=SLO(latency_ms=20.0),
        service_median_ms=lambda n: float(np.interp(n, sizes, times)),
        arrival_rate_rps=2000.0,
    )
    decision = PID().decide(resnet)
    assert decision.max_batch_size == 128
    assert 0.0 < decision.window_ms < 16.0  # the window still plans for the target


def test_a_higher_arrival_rate_narrows_the_window_not_the_cap() -> None:
    light = PID().decide(observe(arrival_rate_rps=1000.0))
    busy = PID().decide(observe(arrival_rate_rps=4000.0))
    assert busy.window_ms < light.window_ms
    assert busy.max_batch_size == light.max_batch_size == 256


def test_plans_for_the_recent_peak_rate() -> None:
    steady = PID().decide(observe(arrival_rate_rps=1000.0))
    after_a_peak = PID().decide(observe(arrival_rate_rps=1000.0, arrival_rate_peak_rps=4000.0))
    assert after_a_peak.window_ms < steady.window_ms


def test_after_an_overload_the_window_plans_for_the_load_of_now() -> None:
    """A past peak no cap keeps up with (a burst) does not hold window 0: natural batches of
    a few requests would keep the device busy at the load of now."""
    after_burst = PID().decide(observe(arrival_rate_rps=1000.0, arrival_rate_peak_rps=50000.0))
    steady = PID().decide(observe(arrival_rate_rps=1000.0))
    assert after_burst.reason != "pid.overload"
    assert after_burst.window_ms == steady.window_ms > 0.0
    during = PID().decide(observe(arrival_rate_rps=50000.0, arrival_rate_peak_rps=50000.0))
    assert during.reason == "pid.overload"
    assert during.window_ms == 0.0


def test_the_window_is_planned_to_the_budget_widened_by_the_measured_slack() -> None:
    """The same tick with the measured tail's room (scale 1.2: a 48 ms window budget) plans a
    wider window at the same cap, and says why."""
    plain = PID().decide(observe())
    roomy = PID().decide(observe(window_budget_scale=1.2))
    assert roomy.reason == "pid.slack"
    assert roomy.window_ms > plain.window_ms + 5.0
    assert roomy.max_batch_size == plain.max_batch_size == 256  # the cap keeps to the SLO


def test_while_the_measured_tail_shows_room_no_trim_is_held() -> None:
    """A trim from an earlier overshoot gives way once the slack is above 1: the two do not
    stack (a trim under a widened budget read ``pid.trim`` while the window was planned wider
    than the bound)."""
    pid = PID()
    pid.decide(observe(latency_ms=30.0))
    pid.decide(observe(latency_ms=60.0))
    assert pid.output < 0.0
    roomy = pid.decide(observe(latency_ms=30.0, window_budget_scale=1.1))
    assert pid.output == 0.0 and roomy.reason == "pid.slack"


def test_the_setpoint_leaves_the_preprocessing_out() -> None:
    """The batcher measures from submission: with 10 ms of preprocessing under an SLO of 50
    ms its own p99 is aimed at 30 ms (0.8 * 50 - 10), and 35 ms (45 ms end to end, past the
    40 ms aim) trims the window. Before, the setpoint was 40 ms, and the feedback undid the
    preprocessing the plan had budgeted for."""
    slo = SLO(latency_ms=50.0, preprocess_ms=10.0)
    planned = PID().decide(observe(slo=slo, latency_ms=25.0))
    pid = PID()
    trimmed = pid.decide(observe(slo=slo, latency_ms=35.0))
    assert planned.reason == "pid.plan"
    assert pid.output < 0.0 and trimmed.reason == "pid.trim"
    assert trimmed.window_ms < planned.window_ms


def test_latency_over_target_trims_the_planned_window() -> None:
    pid = PID()
    planned = pid.decide(observe(latency_ms=30.0)).window_ms
    trimmed = pid.decide(observe(latency_ms=60.0))
    assert pid.output < 0
    assert trimmed.reason == "pid.trim"
    assert trimmed.window_ms < planned
    assert trimmed.max_batch_size == 256  # the cap is never the actuator


def test_output_stays_in_its_range_and_recovers_at_once() -> None:
    pid = PID()
    for _ in range(50):  # far over target for long: the output saturates at -1, no windup
        decision = pid.decide(observe(latency_ms=400.0))
    assert pid.output == -1.0
    assert decision.window_ms == 0.0
    assert decision.max_batch_size == 256  # a latency problem never collapses the cap
    pid.decide(observe(latency_ms=10.0))
    assert pid.output > -1.0  # one good tick moves it off the clamp
    for _ in range(50):  # long slack: the plan is trusted again, never beyond it
        decision = pid.decide(observe(latency_ms=10.0))
    assert pid.output == 0.0
    assert decision.window_ms == PID().decide(observe(latency_ms=10.0)).window_ms


def test_few_samples_do_not_move_the_output() -> None:
    pid = PID(min_samples=20)
    pid.decide(observe(latency_ms=400.0, latency_samples=5))
    assert pid.output == 0.0


def test_overload_takes_the_highest_throughput_cap_and_no_window() -> None:
    pid = PID()
    decision = pid.decide(observe(latency_ms=500.0, arrival_rate_rps=40000.0))
    assert (decision.window_ms, decision.max_batch_size, decision.reason) == (
        0.0,
        256,
        "pid.overload",
    )
    assert pid.output == 0.0  # no integration while the window is not what sets the latency


def test_after_an_overload_the_window_reopens_without_waiting_for_the_measure() -> None:
    pid = PID(settle_s=2.0)
    pid.decide(observe(now_s=10.0, latency_ms=500.0, arrival_rate_rps=40000.0))
    # the load is back to normal, but the latency span still holds the overload's samples
    back = pid.decide(observe(now_s=10.5, latency_ms=300.0))
    assert pid.output == 0.0
    assert back.window_ms == PID().decide(observe(latency_ms=20.0)).window_ms
    pid.decide(observe(now_s=12.5, latency_ms=300.0))  # settled: the feedback acts again
    assert pid.output < 0.0


def test_an_overshoot_after_a_stall_does_not_narrow_the_window() -> None:
    """A batch held out as an isolated outlier (a stall) queues what follows it; the window did
    not cause that latency, and narrowing it would only make more, emptier batches."""
    pid = PID(settle_s=2.0)
    planned = pid.decide(observe(now_s=10.0, latency_ms=30.0)).window_ms
    after_stall = pid.decide(observe(now_s=10.5, latency_ms=90.0, last_stall_s=9.8))
    assert pid.output == 0.0 and after_stall.window_ms == planned
    assert after_stall.reason == "pid.stall"  # the decision says why it held
    # once the stall has left the measurement span, an overshoot trims the window again
    pid.decide(observe(now_s=12.0, latency_ms=90.0, last_stall_s=9.8))
    assert pid.output < 0.0
    # and slack after a stall still counts (the hold is for overshoots only)
    recovering = PID(settle_s=2.0)
    recovering.decide(observe(now_s=10.0, latency_ms=90.0))
    assert recovering.output < 0.0
    before = recovering.output
    recovering.decide(observe(now_s=10.5, latency_ms=10.0, last_stall_s=10.4))
    assert recovering.output > before


def test_stalls_that_recur_relax_a_trim_made_before_them() -> None:
    """A trim made before the stalls were known is no measure of the window once stalls hold
    every tick: after ``settle_s`` of holds without a break it decays toward the plan (a
    narrow window's emptier batches meet more stalls). One stall's hold leaves it as it was."""
    pid = PID(settle_s=2.0)
    now = 10.0
    while pid.output > -1.0:  # an overshoot before any stall was seen trims to window 0
        pid.decide(observe(now_s=now, latency_ms=200.0))
        now += 0.25
    assert pid.decide(observe(now_s=now, latency_ms=200.0)).window_ms == 0.0
    held = [
        pid.decide(observe(now_s=now + 0.25 * k, latency_ms=90.0, last_stall_s=now + 0.25 * k))
        for k in range(1, 9)
    ]  # a stall every tick for 2 s: the hold goes on
    assert all(d.reason == "pid.stall" for d in held)
    assert pid.output == -1.0  # within settle_s of the first hold: nothing moves
    now += 0.25 * 8
    for _ in range(12):  # 3 s more of stalls
        now += 0.25
        decision = pid.decide(observe(now_s=now, latency_ms=90.0, last_stall_s=now))
    assert -0.5 < pid.output < 0.0 and decision.window_ms > 0.0
    assert decision.reason == "pid.stall"
    # a tick that the feedback reads again ends the run of holds: the next stall's hold
    # starts its own settle_s
    pid.decide(observe(now_s=now + 5.0, latency_ms=200.0, last_stall_s=now))
    trimmed = pid.output
    pid.decide(observe(now_s=now + 5.25, latency_ms=90.0, last_stall_s=now + 5.25))
    assert pid.output == trimmed


def test_a_run_of_holds_is_broken_by_a_tick_without_a_reading() -> None:
    """Holds before and after a tick with too few samples are two runs, not one: the second
    relaxes nothing until it has lasted ``settle_s`` itself."""
    pid = PID(settle_s=2.0)
    pid.output = -1.0
    pid.decide(observe(now_s=10.0, latency_ms=90.0, last_stall_s=10.0))  # a run begins
    pid.decide(observe(now_s=11.0, latency_ms=90.0, latency_samples=3))  # unread: it ends
    pid.decide(observe(now_s=12.5, latency_ms=90.0, last_stall_s=12.5))  # a new run begins
    assert pid.output == -1.0


def test_an_overshoot_after_a_loop_stall_holds_whatever_the_outliers() -> None:
    """A stall of the event loop (a timer that fired late) made the latency, not the window:
    the overshoot it leaves in the measure narrows nothing, even when outliers scale with the
    batch, and the decision says so."""
    pid = PID(settle_s=2.0)
    planned = pid.decide(observe(now_s=10.0, latency_ms=30.0)).window_ms
    held = pid.decide(
        observe(now_s=10.5, latency_ms=900.0, loop_stall_s=10.3, outlier_elasticity=1.0)
    )
    assert pid.output == 0.0 and held.window_ms == planned and held.reason == "pid.stall"
    later = pid.decide(observe(now_s=12.5, latency_ms=90.0, loop_stall_s=10.3))
    assert pid.output < 0.0 and later.reason == "pid.trim"


def test_an_overshoot_after_outliers_that_scale_with_the_batch_narrows_the_window() -> None:
    """Outliers whose excess grows with the batch (elasticity near 1: 10x spikes) are
    shortened by a narrower window's smaller batches: no hold for them. Pauses added whatever
    the batch (near 0), or outliers not yet measured (NaN), keep the hold."""
    for elasticity, holds in ((1.0, False), (0.0, True), (math.nan, True)):
        pid = PID(settle_s=2.0)
        pid.decide(observe(now_s=10.0, latency_ms=30.0))
        seen = observe(now_s=10.5, latency_ms=90.0, last_stall_s=9.8, outlier_elasticity=elasticity)
        pid.decide(seen)
        assert (pid.output == 0.0) is holds, elasticity


def test_a_stall_too_short_for_the_overshoot_does_not_hold_the_trim() -> None:
    """A model of 0.03 ms a batch meets a 0.5 ms pause now and then (a context switch): held
    out as a stall, but it cannot lift a tail 10 ms over its 40 ms target. The overshoot is the
    window's and narrows it; a stall of 150 ms, or one of unknown length, still holds."""
    for stalls, holds in (((9.8, 0.5),), False), (((9.8, 150.0),), True), ((), True):
        pid = PID(settle_s=2.0)
        pid.decide(observe(now_s=10.0, latency_ms=30.0))
        after = pid.decide(
            observe(now_s=10.5, latency_ms=50.0, last_stall_s=9.8, recent_stalls=stalls)
        )
        assert (after.reason == "pid.stall") is holds, stalls
        assert (pid.output == 0.0) is holds, stalls


def test_no_derivative_kick_when_the_slo_changes() -> None:
    with_d, without_d = PID(kd=0.5), PID(kd=0.0)
    for pid in (with_d, without_d):
        for _ in range(3):
            pid.decide(observe(latency_ms=45.0))
    before = (with_d.output, without_d.output)
    for pid in (with_d, without_d):  # same latency, new target: only P and I may move
        pid.decide(observe(latency_ms=45.0, slo=SLO(latency_ms=60.0)))
    assert with_d.output - before[0] == pytest.approx(without_d.output - before[1])


def test_derivative_damps_a_latency_ramp() -> None:
    damped, plain = PID(kd=0.5), PID(kd=0.0)
    for latency in (45.0, 50.0, 60.0):  # accelerating rise: second difference > 0
        damped.decide(observe(latency_ms=latency))
        plain.decide(observe(latency_ms=latency))
    assert damped.output < plain.output


def test_reset_trusts_the_plan_again() -> None:
    pid = PID()
    for _ in range(5):
        pid.decide(observe(latency_ms=400.0))
    pid.reset(Decision(0.0, 64))
    assert pid.output == 0.0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"kp": -1.0}, "PID.kp must be a finite number >= 0, got -1.0"),
        ({"kd": "0.1"}, "PID.kd must be a number, got str"),
        ({"min_samples": 0}, "PID.min_samples must be >= 1, got 0"),
        ({"settle_s": -1}, "PID.settle_s must be a finite number >= 0, got -1"),
    ],
)
def test_validation(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises((TypeError, ValueError), match=message):
        PID(**kwargs)  # type: ignore[arg-type]


def test_where_pauses_beyond_the_slo_are_priced_no_trim_is_held() -> None:
    """60 ms pauses on 3 % of batches overrun the 50 ms SLO at any window: the plan takes the
    window that answers the most, and a trim from the pauses' overshoot (the measured p99 at
    60 ms) would only narrow it. Before, the trim held the window near 0."""
    paused = {
        "arrival_rate_rps": 100.0,
        "service_p99_ms": lambda n: 4.0 + 0.05 * n + 60.0,
        "service_pauses_ms": (0.0,) * 194 + (60.0,) * 6,
    }
    pid = PID()
    pid.decide(observe(latency_ms=30.0, arrival_rate_rps=100.0))
    pid.decide(observe(latency_ms=60.0, arrival_rate_rps=100.0))
    assert pid.output < 0.0
    priced = pid.decide(observe(latency_ms=60.0, **paused))
    assert pid.output == 0.0 and priced.reason == "pid.pauses"
    assert priced.window_ms == pytest.approx(PID().decide(observe(**paused)).window_ms)
    assert priced.window_ms > 20.0

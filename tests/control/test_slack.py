"""TailSlack: the window's planning budget follows the room the measured tail leaves.

The factory's batcher: SLO 50 ms p99 (target 40 ms), 250 latency samples by default; a rise
needs 5 / (1 - 0.99) = 500 of them.
"""

from __future__ import annotations

import math

import pytest

from adaptive_batcher.control.slack import TailSlack
from adaptive_batcher.control.types import Decision
from tests.control.factories import observe

ROOMY = {"latency_ms": 30.0, "latency_samples": 1000}  # a quarter of the target to spare


def test_a_measured_tail_below_the_target_widens_the_budget_in_steps() -> None:
    slack = TailSlack()
    first = slack.update(observe(**ROOMY))
    assert first == pytest.approx(1.0 + 0.15 * 0.25)
    second = slack.update(observe(**ROOMY))
    assert second == pytest.approx(first * (1.0 + 0.15 * 0.25))


def test_the_scale_is_bounded() -> None:
    slack = TailSlack(max_scale=1.1)
    for _ in range(50):
        scale = slack.update(observe(**ROOMY))
    assert scale == 1.1


def test_no_rise_after_a_reset_until_the_span_holds_latencies_of_its_own() -> None:
    """After a new SLO the span holds latencies of settings planned for the old one: the scale
    may not rise on them for settle_s from the first tick after the reset."""
    slack = TailSlack()
    assert slack.update(observe(now_s=5.0, **ROOMY)) > 1.0  # no hold at the start
    slack.reset()
    assert slack.scale == 1.0
    assert slack.update(observe(now_s=8.0, **ROOMY)) == 1.0  # the first tick after it
    assert slack.update(observe(now_s=9.9, **ROOMY)) == 1.0
    assert slack.update(observe(now_s=10.0, **ROOMY)) > 1.0


def test_too_few_samples_for_the_percentile_hold_the_scale() -> None:
    """At 250 samples, two or three requests lie above the p99: no ground to widen on."""
    slack = TailSlack()
    assert slack.update(observe(latency_ms=30.0, latency_samples=250)) == 1.0
    assert slack.update(observe(latency_ms=30.0, latency_samples=499)) == 1.0


def test_an_overshoot_takes_the_scale_back_at_once_never_below_one() -> None:
    slack = TailSlack()
    for _ in range(20):
        slack.update(observe(**ROOMY))
    widened = slack.scale
    assert widened > 1.2
    after = slack.update(observe(latency_ms=44.0, latency_samples=100))  # 10 % over
    assert after == pytest.approx(widened * 40.0 / 44.0)
    assert slack.update(observe(latency_ms=400.0, latency_samples=100)) == 1.0


def test_a_stall_holds_the_scale_both_ways() -> None:
    slack = TailSlack()
    for _ in range(10):
        slack.update(observe(**ROOMY))
    held = slack.scale
    stalled = {"now_s": 10.0, "loop_stall_s": 9.0}  # the loop stood still a second ago
    assert slack.update(observe(latency_ms=400.0, **stalled)) == held
    assert slack.update(observe(latency_ms=30.0, latency_samples=1000, **stalled)) == held
    assert slack.update(observe(latency_ms=400.0, loop_stall_s=7.0)) == 1.0  # settled


def test_no_slo_or_no_measurement_holds_the_scale() -> None:
    slack = TailSlack()
    assert slack.update(observe(slo=None, latency_ms=1.0, latency_samples=10_000)) == 1.0
    assert slack.update(observe(latency_ms=math.nan, latency_samples=10_000)) == 1.0


def test_one_means_the_plan_alone() -> None:
    slack = TailSlack(max_scale=1.0)
    assert slack.update(observe(**ROOMY)) == 1.0


@pytest.mark.parametrize(
    ("name", "value"),
    [("max_scale", 0.9), ("gain", 0.0), ("rise_samples", 0.0), ("settle_s", -1.0)],
)
def test_arguments_out_of_range_are_refused_by_name(name: str, value: float) -> None:
    with pytest.raises(ValueError, match=f"TailSlack.{name}"):
        TailSlack(**{name: value})


def test_observation_window_budget() -> None:
    observation = observe(window_budget_scale=1.2)
    assert observation.window_budget_ms == pytest.approx(observation.budget_ms * 1.2)
    assert math.isnan(observe(slo=None).window_budget_ms)


def test_no_rise_while_the_window_in_force_is_a_feedback_trim() -> None:
    """Room under the target at a window the PID trimmed below its plan shows the trim's
    worth, not slack in the plan: on a busy event loop (latency the plan does not see) a rise
    there released a 2 ms trim to a 3.75 ms window against a 5 ms SLO, and the tail went back
    over it. An overshoot still takes the scale back; the next plan's window may rise."""
    slack = TailSlack()
    trimmed = Decision(2.0, 64, "pid.trim")
    assert slack.update(observe(current=trimmed, **ROOMY)) == 1.0
    for _ in range(10):
        slack.update(observe(current=Decision(2.0, 64, "pid.plan"), **ROOMY))
    widened = slack.scale
    assert widened > 1.2
    assert slack.update(observe(current=trimmed, **ROOMY)) == widened
    after = slack.update(observe(current=trimmed, latency_ms=44.0, latency_samples=100))
    assert after == pytest.approx(widened * 40.0 / 44.0)

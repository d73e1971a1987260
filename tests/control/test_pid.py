"""PID policy: one observation in, one decision out; then short sequences for its PID practice."""

from __future__ import annotations

import math

import pytest

from adaptive_batcher.control.types import Decision
from adaptive_batcher.policies import PID
from adaptive_batcher.slo import SLO
from tests.control.factories import observe

# SLO 50 ms -> target 40 ms, budget 40 ms; service 4 + 0.05 n ms; window span min(50, 40) = 40 ms


def test_holds_without_slo_or_samples() -> None:
    assert PID().decide(observe(slo=None)).reason == "pid.hold"
    assert PID().decide(observe(latency_samples=3)).reason == "pid.hold"
    assert PID().decide(observe(latency_ms=math.nan)).reason == "pid.hold"


@pytest.mark.parametrize(
    ("latency_ms", "window_ms", "max_batch_size", "reason"),
    [
        # slack: the cap first: the largest with 2 s(n) <= 40 is 256 (16.8 ms), leaving a
        # window range of 40 - 33.6 = 6.4 ms; e = 0.5, u = 2/6.4 + 0.15 * 0.5 = 0.3875
        (20.0, 0.3875 * 6.4, 256, "pid.slack"),
        # over target: e = -0.5, u = 0.3125 - 0.075 > 0: still slack, a smaller window
        (60.0, 0.2375 * 6.4, 256, "pid.slack"),
        # far over: e clipped at -2, u = 0.3125 - 0.3 = 0.0125: the window nearly closes
        (200.0, 0.0125 * 6.4, 256, "pid.slack"),
    ],
)
def test_first_decision(
    latency_ms: float, window_ms: float, max_batch_size: int, reason: str
) -> None:
    decision = PID().decide(observe(latency_ms=latency_ms))
    assert decision.window_ms == pytest.approx(window_ms)
    assert decision.max_batch_size == max_batch_size
    assert decision.reason == reason


def test_bumpless_start_from_window_in_force() -> None:
    pid = PID()
    pid.reset(Decision(5.0, 64))
    decision = pid.decide(observe(current=Decision(5.0, 64), latency_ms=40.0))  # zero error
    assert decision.window_ms == pytest.approx(5.0)


def test_tightening_shrinks_the_cap_once_the_window_is_closed() -> None:
    pid = PID()
    for _ in range(4):  # far over target: u goes negative, the cap budget shrinks
        decision = pid.decide(observe(current=Decision(0.0, 256), latency_ms=200.0))
    assert pid.output < 0
    assert decision.window_ms == 0.0
    assert decision.max_batch_size < 256
    assert decision.reason == "pid.tighten"


def test_anti_windup_output_is_clamped_and_recovers_at_once() -> None:
    pid = PID()
    for _ in range(50):  # long, large slack: the output saturates at 1, no hidden windup
        pid.decide(observe(latency_ms=1.0))
    assert pid.output == 1.0
    decision = pid.decide(observe(latency_ms=80.0))
    assert pid.output < 1.0  # one bad tick moves it off the clamp immediately
    assert decision.window_ms < 40.0


def test_overload_takes_the_highest_throughput_cap() -> None:
    pid = PID()
    for _ in range(3):
        decision = pid.decide(observe(latency_ms=500.0, arrival_rate_rps=40000.0))
    assert decision.max_batch_size == 256
    assert decision.window_ms == 0.0


def test_no_derivative_kick_when_the_slo_changes() -> None:
    with_d, without_d = PID(kd=0.5), PID(kd=0.0)
    for pid in (with_d, without_d):
        for _ in range(3):
            pid.decide(observe(latency_ms=30.0))
    before = (with_d.output, without_d.output)
    for pid in (with_d, without_d):  # same latency, new target: only P and I may move
        pid.decide(observe(latency_ms=30.0, slo=SLO(p99_ms=100.0)))
    assert with_d.output - before[0] == pytest.approx(without_d.output - before[1])


def test_derivative_damps_a_latency_ramp() -> None:
    damped, plain = PID(kd=0.5), PID(kd=0.0)
    for latency in (20.0, 25.0, 35.0):  # accelerating rise: second difference > 0
        damped.decide(observe(latency_ms=latency))
        plain.decide(observe(latency_ms=latency))
    assert damped.output < plain.output


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"kp": -1.0}, "PID.kp must be a finite number >= 0, got -1.0"),
        ({"kd": "0.1"}, "PID.kd must be a number, got str"),
        ({"min_samples": 0}, "PID.min_samples must be >= 1, got 0"),
    ],
)
def test_validation(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises((TypeError, ValueError), match=message):
        PID(**kwargs)  # type: ignore[arg-type]

"""Guards around a policy: one observation in, one corrected decision out."""

from __future__ import annotations

from typing import Any

import pytest
from structlog.testing import capture_logs

from adaptive_batcher.control.guards import (
    BucketGuard,
    BudgetGuard,
    MemoryGuard,
    PowerGuard,
    ShedGuard,
    UnusedWindowGuard,
)
from adaptive_batcher.control.types import Decision, Observation
from adaptive_batcher.telemetry.base import TelemetrySample
from tests.control.factories import linear_ms, observe


class Fixed:
    """A policy that always proposes the same decision."""

    name = "fixed"

    def __init__(self, decision: Decision) -> None:
        self.decision = decision

    def reset(self, current: Decision) -> None:
        del current

    def decide(self, observation: Observation) -> Decision:
        del observation
        return self.decision


def guarded(guard: Any, decision: Decision, **kwargs: Any) -> Any:
    return guard(Fixed(decision), **kwargs)


# -- unused window -----------------------------------------------------------------------


def test_unused_window_closes_and_stays_closed_until_load_grows() -> None:
    guard = guarded(UnusedWindowGuard, Decision(10.0, 64, "policy"))
    lonely = observe(current=Decision(10.0, 64), mean_batch_size=1.0, arrival_rate_rps=50.0)
    assert guard.decide(lonely) == Decision(0.0, 64, "window_unused")
    calm = observe(current=Decision(0.0, 64), mean_batch_size=1.0, arrival_rate_rps=60.0)
    assert guard.decide(calm).window_ms == 0.0  # still closed: load barely moved
    busier = observe(current=Decision(0.0, 64), mean_batch_size=1.0, arrival_rate_rps=100.0)
    assert guard.decide(busier).window_ms == 10.0  # load doubled: the policy may try again


@pytest.mark.parametrize(
    ("mean_batch", "batches", "window_after"),
    [(1.0, 25, 0.0), (4.0, 25, 10.0), (1.0, 2, 10.0)],  # too few batches: no verdict
)
def test_unused_window_table(mean_batch: float, batches: int, window_after: float) -> None:
    guard = guarded(UnusedWindowGuard, Decision(10.0, 64, "policy"))
    obs = observe(current=Decision(10.0, 64), mean_batch_size=mean_batch, batches=batches)
    assert guard.decide(obs).window_ms == window_after


# -- budget ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("proposed", "expected"),
    [
        (Decision(2.0, 64, "p"), Decision(2.0, 64, "p")),  # fits: untouched
        (Decision(30.0, 64, "p"), Decision(40.0 - 2 * 7.2, 64, "budget")),  # window cut
        (Decision(0.0, 256, "p"), Decision(0.0, 256, "p")),  # 2 * 16.8 = 33.6 <= 40
    ],
)
def test_budget_guard_table(proposed: Decision, expected: Decision) -> None:
    decision = guarded(BudgetGuard, proposed).decide(observe())
    assert decision.window_ms == pytest.approx(expected.window_ms)
    assert decision.max_batch_size == expected.max_batch_size
    assert decision.reason == expected.reason


def test_budget_guard_cuts_a_cap_that_cannot_fit() -> None:
    slow = linear_ms(4.0, 0.2)  # 256 -> 55 ms, 128 -> 29.6, 64 -> 16.8
    decision = guarded(BudgetGuard, Decision(0.0, 256, "p")).decide(observe(service_ms=slow))
    assert decision.max_batch_size == 64
    assert decision.reason == "budget"


def test_budget_guard_flags_unreachable_slo_once_and_degrades() -> None:
    guard = guarded(BudgetGuard, Decision(5.0, 64, "p"))
    too_slow = observe(service_ms=linear_ms(30.0, 0.0))  # 2 * 30 > 40 even for one item
    with capture_logs() as logs:
        first = guard.decide(too_slow)
        guard.decide(too_slow)
    assert first.window_ms == 0.0
    assert first.reason == "slo_unreachable"
    assert guard.slo_unreachable is True
    assert [e["event"] for e in logs] == ["controller.slo_unreachable"]
    guard.decide(observe())
    assert guard.slo_unreachable is False


# -- power -------------------------------------------------------------------------------


def test_power_guard_steps_back_when_an_increase_lowers_power() -> None:
    guard = guarded(PowerGuard, Decision(8.0, 64, "policy"), hold_ticks=2)
    before = observe(current=Decision(4.0, 64), throughput_rps=1000.0, mean_ms=10.0)
    assert guard.decide(before).window_ms == 8.0  # the increase goes through, power noted
    worse = observe(current=Decision(8.0, 64), throughput_rps=1000.0, mean_ms=14.0)
    assert guard.decide(worse) == Decision(4.0, 64, "power_backoff")
    held = guard.decide(observe(current=Decision(4.0, 64), mean_ms=10.0))
    assert held == Decision(4.0, 64, "power_hold")


def test_power_guard_keeps_an_increase_that_pays() -> None:
    guard = guarded(PowerGuard, Decision(8.0, 128, "policy"))
    guard.decide(observe(current=Decision(4.0, 64), throughput_rps=1000.0, mean_ms=10.0))
    better = observe(current=Decision(8.0, 128), throughput_rps=1500.0, mean_ms=11.0)
    assert guard.decide(better).reason == "policy"


# -- memory ------------------------------------------------------------------------------


def test_memory_guard_halves_after_oom_and_recovers_after_cooldown() -> None:
    guard = guarded(MemoryGuard, Decision(0.0, 128, "policy"), cooldown_s=5.0)
    hit = guard.decide(observe(now_s=10.0, current=Decision(0.0, 128), oom_errors=1))
    assert hit == Decision(0.0, 64, "out_of_memory")
    assert guard.decide(observe(now_s=12.0, current=Decision(0.0, 64))).max_batch_size == 64
    later = guard.decide(observe(now_s=16.0, current=Decision(0.0, 64)))
    assert later.max_batch_size == 80  # ceiling 64 * 1.25 after the cooldown


def test_memory_guard_shrinks_under_low_free_memory() -> None:
    guard = guarded(MemoryGuard, Decision(0.0, 128, "policy"))
    tight = TelemetrySample(mem_total_bytes=100, mem_free_bytes=5)
    decision = guard.decide(observe(current=Decision(0.0, 128), telemetry=tight))
    assert decision == Decision(0.0, 96, "memory_pressure")
    roomy = TelemetrySample(mem_total_bytes=100, mem_free_bytes=50)
    assert guard.decide(observe(current=Decision(0.0, 96), telemetry=roomy)).max_batch_size == 96


def test_memory_guard_ignores_unknown_memory() -> None:
    guard = guarded(MemoryGuard, Decision(0.0, 128, "policy"))
    assert guard.decide(observe(telemetry=TelemetrySample())).max_batch_size == 128


# -- buckets and shedding ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("warmed", "proposed_cap", "cap"),
    [({8, 32, 128}, 100, 32), ({8, 32, 128}, 4, 8), (set(), 100, 100), ({8, 32}, 32, 32)],
)
def test_bucket_guard_table(warmed: set[int], proposed_cap: int, cap: int) -> None:
    guard = BucketGuard(Fixed(Decision(0.0, proposed_cap, "p")), lambda: frozenset(warmed))
    assert guard.decide(observe()).max_batch_size == cap


def test_shed_guard_sets_the_latest_useful_start() -> None:
    """Cap 64 stays; a burst may put the request in a batch of 256 (the best within budget:
    2 * 16.8 <= 40 ms), so it must start within 50 - 1.1 * 16.8 ms."""
    decision = guarded(ShedGuard, Decision(0.0, 64, "p")).decide(observe())
    assert decision.max_batch_size == 64
    assert decision.shed_after_ms == pytest.approx(50.0 - 1.1 * 16.8)


def test_shed_guard_refuses_batches_too_slow_for_the_slo() -> None:
    slow = linear_ms(4.0, 0.2)  # 256 -> 55 ms: cannot meet 50 ms; 64 -> 16.8 ms fits 40 ms
    decision = guarded(ShedGuard, Decision(0.0, 256, "p")).decide(observe(service_ms=slow))
    assert decision.max_batch_size == 64


def test_shed_guard_under_overload_serves_the_most_within_the_slo() -> None:
    slow = linear_ms(4.0, 0.2)
    overload = observe(service_ms=slow, arrival_rate_rps=100000.0)
    decision = guarded(ShedGuard, Decision(0.0, 256, "p")).decide(overload)
    assert decision.max_batch_size == 64  # 2 * 16.8 <= 40, the best throughput that fits
    assert decision.shed_after_ms == pytest.approx(50.0 - 1.1 * 16.8)

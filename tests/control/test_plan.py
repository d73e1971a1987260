"""Plan: the realised-batch fixed point stops early only when that changes nothing."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from adaptive_batcher.control.plan import _FIXED_POINT_STEPS, Plan


def _six_steps(plan: Plan, window_ms: float, cap: int) -> float:
    """The fixed-point iteration run for all its steps (the reference)."""
    rate_per_ms = plan.rate_units_per_s / 1e3
    n = min(float(cap), 1.0 + rate_per_ms * window_ms)
    for _ in range(_FIXED_POINT_STEPS):
        cycle = max(window_ms, plan.service_ms(max(1, round(n))) / plan.slots)
        n = min(float(cap), 1.0 + rate_per_ms * cycle)
    return n


@settings(max_examples=300, deadline=None)
@given(
    rate=st.floats(0.0, 1e6),
    fixed_ms=st.floats(0.0, 50.0),
    per_unit_ms=st.floats(0.0, 2.0),
    window_ms=st.floats(0.0, 100.0),
    cap=st.integers(1, 1024),
    slots=st.integers(1, 4),
)
def test_batch_units_equals_the_full_iteration(
    rate: float, fixed_ms: float, per_unit_ms: float, window_ms: float, cap: int, slots: int
) -> None:
    def service(n: int) -> float:
        return fixed_ms + per_unit_ms * n

    plan = Plan(rate, 0, (cap,), service, service, slots=slots)
    assert plan.batch_units(window_ms, cap) == _six_steps(plan, window_ms, cap)

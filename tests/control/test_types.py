"""Decision and Bounds: fields of the wrong type are refused with a message naming them; numpy
scalars are numbers and ints, stored as plain floats and ints."""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np
import pytest

from adaptive_batcher.control.types import Bounds, Decision
from adaptive_batcher.slo import SLO
from tests.control.factories import observe


def exactly(message: str) -> str:
    return f"^{re.escape(message)}$"


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"window_ms": "5"}, TypeError, "Decision.window_ms must be a number, got str"),
        ({"window_ms": None}, TypeError, "Decision.window_ms must be a number, got NoneType"),
        ({"window_ms": True}, TypeError, "Decision.window_ms must be a number, got bool"),
        (
            {"window_ms": math.nan},
            ValueError,
            "Decision.window_ms must be a finite number >= 0, got nan",
        ),
        ({"max_batch_size": "8"}, TypeError, "Decision.max_batch_size must be an int, got str"),
        ({"max_batch_size": 2.5}, TypeError, "Decision.max_batch_size must be an int, got float"),
        (
            {"max_batch_size": math.nan},
            TypeError,
            "Decision.max_batch_size must be an int, got float",
        ),
        ({"max_batch_size": True}, TypeError, "Decision.max_batch_size must be an int, got bool"),
        ({"max_batch_size": 0}, ValueError, "Decision.max_batch_size must be >= 1, got 0"),
        ({"reason": None}, TypeError, "Decision.reason must be a str, got NoneType"),
        ({"reason": 3}, TypeError, "Decision.reason must be a str, got int"),
        ({"shed_after_ms": "5"}, TypeError, "Decision.shed_after_ms must be a number, got str"),
        ({"shed_after_ms": False}, TypeError, "Decision.shed_after_ms must be a number, got bool"),
        ({"shed_after_ms": math.nan}, ValueError, "Decision.shed_after_ms must be >= 0, got nan"),
    ],
)
def test_decision_fields_are_checked_by_name(
    kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=exactly(message)):
        Decision(**{"window_ms": 1.0, "max_batch_size": 4, **kwargs})


def test_decision_takes_numpy_scalars_as_plain_numbers() -> None:
    decision = Decision(np.float32(2.5), np.int64(8), "x", np.int32(40))  # type: ignore[arg-type]
    assert decision == Decision(2.5, 8, "x", 40.0)
    assert type(decision.window_ms) is float and type(decision.max_batch_size) is int
    assert type(decision.shed_after_ms) is float
    assert decision.with_(max_batch_size=np.int16(4)).max_batch_size == 4
    assert Decision(1.0, 4, shed_after_ms=math.inf).shed_after_ms == math.inf  # never shed


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"min_window_ms": "5"}, TypeError, "Bounds.min_window_ms must be a number, got str"),
        ({"max_window_ms": None}, TypeError, "Bounds.max_window_ms must be a number, got NoneType"),
        ({"max_window_ms": True}, TypeError, "Bounds.max_window_ms must be a number, got bool"),
        ({"min_batch_size": 1.0}, TypeError, "Bounds.min_batch_size must be an int, got float"),
        (
            {"max_batch_size": math.inf},
            TypeError,
            "Bounds.max_batch_size must be an int, got float",
        ),
        ({"max_batch_size": "64"}, TypeError, "Bounds.max_batch_size must be an int, got str"),
        (
            {"batch_sizes": "124"},
            TypeError,
            "Bounds.batch_sizes must be a sequence of ints, got str",
        ),
        ({"batch_sizes": 8}, TypeError, "Bounds.batch_sizes must be a sequence of ints, got int"),
        (
            {"batch_sizes": None},
            TypeError,
            "Bounds.batch_sizes must be a sequence of ints, got NoneType",
        ),
        ({"batch_sizes": (1, 2.5)}, TypeError, "Bounds.batch_sizes[1] must be an int, got float"),
        ({"batch_sizes": (0, 4)}, ValueError, "Bounds.batch_sizes[0] must be >= 1, got 0"),
        (
            {"batch_sizes": (4, 2)},
            ValueError,
            "Bounds.batch_sizes must be strictly increasing, got [4, 2]",
        ),
        (
            {"min_window_ms": math.nan},
            ValueError,
            "Bounds need 0 <= min_window_ms <= max_window_ms, got nan..100.0",
        ),
        (
            {"min_batch_size": 0},
            ValueError,
            "Bounds need 1 <= min_batch_size <= max_batch_size, got 0..256",
        ),
    ],
)
def test_bounds_fields_are_checked_by_name(
    kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=exactly(message)):
        Bounds(**kwargs)


def test_bounds_take_numpy_scalars_and_any_sequence_of_sizes() -> None:
    bounds = Bounds(
        np.int64(0),  # type: ignore[arg-type]
        np.float32(50.0),  # type: ignore[arg-type]
        np.int32(2),  # type: ignore[arg-type]
        np.int64(64),  # type: ignore[arg-type]
        [np.int64(2), 16, 64],  # type: ignore[arg-type]
    )
    assert bounds == Bounds(0.0, 50.0, 2, 64, (2, 16, 64))
    assert type(bounds.min_window_ms) is float and type(bounds.max_batch_size) is int
    assert bounds.batch_sizes == (2, 16, 64) and all(type(b) is int for b in bounds.batch_sizes)
    assert hash(bounds) == hash(Bounds(0.0, 50.0, 2, 64, (2, 16, 64)))  # a tuple, not the list
    assert Bounds(batch_sizes=range(1, 4)).batch_sizes == (1, 2, 3)


@pytest.mark.parametrize(
    ("units", "expected"), [(1, 2), (2, 2), (3, 16), (16, 16), (40, 64), (99, 64)]
)
def test_a_batch_runs_padded_to_the_smallest_bucket_that_holds_it(
    units: int, expected: int
) -> None:
    assert Bounds(0.0, 50.0, 2, 64, (2, 16, 64)).padded_size(units) == expected


def test_without_buckets_a_batch_runs_at_its_own_size() -> None:
    assert Bounds().padded_size(37) == 37


def test_the_floor_is_exempt_from_the_margin_by_its_share_of_the_room() -> None:
    """SLO 125 ms at margin 0.8 (reserve 25 ms): without a floor the aim is the SLO's own
    budget, 100 ms; a floor of 50 ms (share 0.4) exempts 0.16 of the reserve, 104 ms; a floor
    past the room exempts all of it, the room itself; with 5 ms of preprocessing the room is
    120 ms and the budget 95 ms. Caps keep the SLO's own budget."""
    slo = SLO(latency_ms=125.0)
    assert observe(slo=slo).aim_budget_ms == observe(slo=slo).target_ms == 100.0
    floored = observe(slo=slo, window_floor_ms=50.0, window_budget_scale=1.1)
    assert floored.aim_budget_ms == pytest.approx(104.0)
    assert floored.target_ms == pytest.approx(104.0)
    assert floored.window_budget_ms == pytest.approx(114.4)
    assert floored.budget_ms == 100.0
    assert observe(slo=slo, window_floor_ms=140.0).aim_budget_ms == pytest.approx(125.0)
    assert observe(slo=slo, window_floor_ms=140.0, window_budget_scale=1.2).window_budget_ms == (
        pytest.approx(125.0)  # never past the room
    )
    assert observe(slo=slo, window_floor_ms=0.0).aim_budget_ms == 100.0  # nothing to exempt
    preprocessed = SLO(latency_ms=125.0, preprocess_ms=5.0)  # room 120 ms, budget 95 ms
    floored = observe(slo=preprocessed, window_floor_ms=50.0)
    assert floored.aim_budget_ms == pytest.approx(95.0 + 0.2 * 120.0 * (50.0 / 120.0) ** 2)
    # the batcher's latency runs from submission: its setpoint leaves preprocessing out
    assert floored.target_ms == floored.aim_budget_ms
    assert math.isnan(observe(slo=None, window_floor_ms=50.0).aim_budget_ms)


def test_the_loop_lag_is_spent_before_submission_like_preprocessing() -> None:
    """SLO 125 ms with 5 ms of preprocessing and 3 ms of event-loop lag: the batcher's room is
    117 ms, its budget 92 ms, and the tail it measures is aimed at what is left; the floor's
    exemption is taken from the room that is left."""
    slo = SLO(latency_ms=125.0, preprocess_ms=5.0)
    lagged = observe(slo=slo, loop_lag_ms=3.0)
    assert (lagged.room_ms, lagged.budget_ms) == (117.0, 92.0)
    assert lagged.target_ms == lagged.aim_budget_ms == 92.0
    floored = observe(slo=slo, loop_lag_ms=3.0, window_floor_ms=50.0)
    assert floored.aim_budget_ms == pytest.approx(92.0 + 0.2 * 117.0 * (50.0 / 117.0) ** 2)
    assert observe(slo=slo, loop_lag_ms=3.0).plan().room_ms == 117.0
    assert math.isnan(observe(slo=None, loop_lag_ms=3.0).budget_ms)


def test_the_floor_is_two_batches_of_one() -> None:
    """The default observation's plan (4 ms + 0.05 ms per item, smallest cap 1): a batch of one
    waited out, then one's own: 2 * 4.05 ms, whatever the load."""
    observation = observe()
    plan = observation.plan()
    floor = observation.predicted_window_floor_ms()
    assert floor == pytest.approx(8.1) == plan.typical_latency_ms(0.0, 1)
    assert observe(arrival_rate_rps=8000.0).predicted_window_floor_ms() == pytest.approx(8.1)
    assert plan.typical_latency_ms(0.0, 64) > floor  # a larger cap's batches take longer
    assert math.isnan(observe(slo=None).predicted_window_floor_ms())
    kept = observation.with_plan_kept(window_floor_ms=floor)
    assert kept.plan() is plan and kept.window_floor_ms == floor
    scaled = kept.with_plan_kept(window_budget_scale=1.2)
    assert scaled.plan() is plan and (scaled.window_floor_ms, scaled.window_budget_scale) == (
        floor,
        1.2,
    )

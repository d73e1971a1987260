"""SLO: every field is type-checked first, with a message naming it; numpy scalars are numbers."""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np
import pytest

from adaptive_batcher import SLO
from adaptive_batcher.metrics.histogram import MIN_S
from adaptive_batcher.slo import SMALLEST_LATENCY_MS

FIELDS = ("latency_ms", "percentile", "preprocess_ms", "margin")


def exactly(message: str) -> str:
    return f"^{re.escape(message)}$"


@pytest.mark.parametrize("field", FIELDS)
@pytest.mark.parametrize(
    ("value", "kind"),
    [("50", "str"), (None, "NoneType"), (True, "bool"), (np.True_, "bool"), ([1], "list")],
)
def test_a_field_of_the_wrong_type_is_named(field: str, value: object, kind: str) -> None:
    kwargs: dict[str, Any] = {"latency_ms": 50.0, field: value}
    with pytest.raises(TypeError, match=exactly(f"SLO.{field} must be a number, got {kind}")):
        SLO(**kwargs)


def test_the_reported_case() -> None:
    with pytest.raises(TypeError, match=exactly("SLO.latency_ms must be a number, got str")):
        SLO(latency_ms="50")  # type: ignore[arg-type]


def test_numpy_scalars_are_numbers_and_are_stored_as_floats() -> None:
    slo = SLO(
        latency_ms=np.int64(50),  # type: ignore[arg-type]
        percentile=np.float32(95.0),  # type: ignore[arg-type]
        preprocess_ms=np.int32(5),  # type: ignore[arg-type]
        margin=np.float64(0.5),
    )
    assert slo == SLO(latency_ms=50.0, percentile=95.0, preprocess_ms=5.0, margin=0.5)
    assert all(type(getattr(slo, field)) is float for field in FIELDS)
    assert slo.target_ms == 25.0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"latency_ms": math.nan}, "SLO.latency_ms must be a finite number > 0, got nan"),
        ({"latency_ms": math.inf}, "SLO.latency_ms must be a finite number > 0, got inf"),
        ({"latency_ms": 0}, "SLO.latency_ms must be a finite number > 0, got 0.0"),
        (
            {"latency_ms": 1e-9},
            "SLO.latency_ms must be at least 0.001 ms (1 us, the smallest latency the "
            "histograms resolve), got 1e-09",
        ),
        ({"latency_ms": 50, "percentile": math.nan}, "SLO.percentile must be in [1, 100), got nan"),
        ({"latency_ms": 50, "percentile": 100}, "SLO.percentile must be in [1, 100), got 100.0"),
        ({"latency_ms": 50, "percentile": 0}, "SLO.percentile must be in [1, 100), got 0.0"),
        ({"latency_ms": 50, "percentile": -5}, "SLO.percentile must be in [1, 100), got -5.0"),
        (
            {"latency_ms": 50, "preprocess_ms": math.inf},
            "SLO.preprocess_ms must be a finite number >= 0, got inf",
        ),
        (
            {"latency_ms": 50, "preprocess_ms": -0.5},
            "SLO.preprocess_ms must be a finite number >= 0, got -0.5",
        ),
        ({"latency_ms": 50, "margin": np.float64(2.0)}, "SLO.margin must be in (0, 1], got 2.0"),
    ],
)
def test_values_out_of_range_keep_their_messages(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=exactly(message)):
        SLO(**kwargs)


def test_the_old_field_name_is_refused_with_the_new_one() -> None:
    message = (
        "SLO.p99_ms was renamed latency_ms (the latency target at `percentile`, ms): "
        "write SLO(latency_ms=...)"
    )
    with pytest.raises(TypeError, match=exactly(message)):
        SLO(p99_ms=50.0)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=exactly(message)):
        SLO(p99_ms=50.0, percentile=95.0)  # type: ignore[call-arg]


@pytest.mark.parametrize(("given", "meant"), [(0.99, "99"), (0.5, "50"), (0.999, "99.9")])
def test_a_quantile_given_for_a_percentile_is_refused_with_the_percentile(
    given: float, meant: str
) -> None:
    """Before: SLO(50, percentile=0.99) was accepted as a p0.99 target."""
    message = (
        f"SLO.percentile must be in [1, 100), got {given}: for the {meant}th percentile "
        f"write percentile={meant}"
    )
    with pytest.raises(ValueError, match=exactly(message)):
        SLO(50.0, percentile=given)
    assert SLO(50.0, percentile=float(meant)).quantile == pytest.approx(given)


def test_reading_the_old_attribute_names_the_new_one() -> None:
    """Before: Python's plain "'SLO' object has no attribute 'p99_ms'"."""
    with pytest.raises(AttributeError, match=r"SLO\.p99_ms was renamed latency_ms"):
        _ = SLO(latency_ms=50.0).p99_ms


def test_the_target_applies_at_its_percentile() -> None:
    p95 = SLO(latency_ms=50.0, percentile=95.0)
    assert (p95.latency_ms, p95.quantile, p95.target_ms) == (50.0, 0.95, 40.0)
    assert SLO(50.0) == SLO(latency_ms=50.0, percentile=99.0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"latency_ms": 50, "preprocess_ms": 45},
            "SLO.preprocess_ms (45.0) must be below target_ms = margin * latency_ms "
            "(0.8 * 50.0 = 40): it leaves -5 ms for the batcher",
        ),
        (
            {"latency_ms": 50, "preprocess_ms": 25, "margin": 0.5},
            "SLO.preprocess_ms (25.0) must be below target_ms = margin * latency_ms "
            "(0.5 * 50.0 = 25): it leaves 0 ms for the batcher",
        ),
    ],
)
def test_preprocessing_that_leaves_the_batcher_no_time_is_refused(
    kwargs: dict[str, Any], message: str
) -> None:
    """Before: accepted with a batcher budget of 0 ms (clamped), and a run found out only at
    the controller's first tick (the warning controller.slo_unreachable, budget_ms=0.0)."""
    with pytest.raises(ValueError, match=exactly(message)):
        SLO(**kwargs)


def test_preprocessing_below_the_target_leaves_the_rest_to_the_batcher() -> None:
    assert SLO(latency_ms=50.0, preprocess_ms=39.0).batcher_budget_ms == pytest.approx(1.0)
    assert SLO(latency_ms=50.0, preprocess_ms=45.0, margin=1.0).batcher_budget_ms == 5.0
    # preprocessing beyond the whole target keeps its own message
    with pytest.raises(
        ValueError, match=exactly("SLO.preprocess_ms (60.0) must be below latency_ms (50.0)")
    ):
        SLO(latency_ms=50.0, preprocess_ms=60.0)


def test_the_percentile_messages_give_the_range_that_is_accepted() -> None:
    """Before: 100 was refused as outside "(0, 100)", 0.5 as outside "[1, 100)": the accepted
    range is [1, 100), both ends exactly."""
    assert SLO(50.0, percentile=1.0).percentile == 1.0
    assert SLO(50.0, percentile=math.nextafter(100.0, 0.0)).percentile < 100.0
    for refused in (math.nextafter(1.0, 0.0), 100.0, 0.5):
        with pytest.raises(ValueError, match=r"^SLO\.percentile must be in \[1, 100\), got "):
            SLO(50.0, percentile=refused)


def test_a_negative_zero_preprocessing_time_is_stored_as_zero() -> None:
    """Before: kept as -0.0 (shown as ``preprocess_ms=-0.0`` in reprs and reports)."""
    slo = SLO(latency_ms=50.0, preprocess_ms=-0.0)
    assert slo.preprocess_ms == 0.0 and math.copysign(1.0, slo.preprocess_ms) == 1.0
    assert repr(slo) == repr(SLO(latency_ms=50.0))
    assert math.copysign(1.0, SLO(50.0, preprocess_ms=np.float64(-0.0)).preprocess_ms) == 1.0


def test_the_smallest_slo_is_the_histograms_floor() -> None:
    assert SMALLEST_LATENCY_MS / 1e3 == MIN_S
    assert SLO(latency_ms=SMALLEST_LATENCY_MS).latency_ms == SMALLEST_LATENCY_MS

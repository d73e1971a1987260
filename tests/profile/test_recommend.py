"""recommend: cap at the knee, window from the window fraction, the SLO budget check."""

from __future__ import annotations

import pytest

from adaptive_batcher import SLO, AdaptiveBatcher
from adaptive_batcher.control import Bounds
from adaptive_batcher.profile import (
    Knee,
    ProfileResult,
    ProfileRow,
    Recommendation,
    controller_bounds,
    recommend,
)
from tests.profile.fakes import RESNET50_H200, table_result

KNEE_MEDIAN_MS = 8.778  # resnet50 batch 128
KNEE_P99_MS = 8.807


def test_without_slo_cap_is_the_knee_and_window_is_80_percent_of_its_latency(
    resnet50: ProfileResult,
) -> None:
    rec = recommend(resnet50)
    assert rec.max_batch_size == 128
    assert rec.window_ms == pytest.approx(0.8 * KNEE_MEDIAN_MS)
    assert rec.slo_latency_ms is None
    assert rec.meets_slo is True
    assert rec.message is None
    assert rec.reasons[0].startswith("knee of the throughput curve at batch 128")
    assert any("take ~80 % of the knee's window" in reason for reason in rec.reasons)


def test_window_fraction_scales_the_window(resnet50: ProfileResult) -> None:
    rec = recommend(resnet50, window_fraction=0.5)
    assert rec.window_ms == pytest.approx(0.5 * KNEE_MEDIAN_MS)
    assert any(r.startswith("no SLO given: window = window_fraction 0.5 x") for r in rec.reasons)
    assert recommend(resnet50, window_fraction=1).window_ms == pytest.approx(KNEE_MEDIAN_MS)


def test_the_slos_margin_is_the_controllers_not_the_recommendations(
    resnet50: ProfileResult,
) -> None:
    """SLO.margin (the controller's aim) leaves the window alone; window_fraction sets it."""
    tight, loose = SLO(latency_ms=50.0, margin=0.5), SLO(latency_ms=50.0, margin=1.0)
    assert recommend(resnet50, tight).window_ms == recommend(resnet50, loose).window_ms
    rec = recommend(resnet50, loose, window_fraction=0.5)
    assert rec.window_ms == pytest.approx(0.5 * (50.0 - KNEE_P99_MS))
    assert rec.reasons[-1].startswith("window = window_fraction 0.5 x (budget 50 ms - compute")


def test_with_an_slo_that_fits_at_the_knee(resnet50: ProfileResult) -> None:
    rec = recommend(resnet50, SLO(latency_ms=50.0))
    assert rec.max_batch_size == 128
    assert rec.window_ms == pytest.approx(0.8 * (50.0 - KNEE_P99_MS))
    assert rec.slo_latency_ms == 50.0
    assert rec.meets_slo is True
    assert any("fits the budget: cap = 128" in reason for reason in rec.reasons)


def test_preprocessing_comes_out_of_the_budget(resnet50: ProfileResult) -> None:
    rec = recommend(resnet50, SLO(latency_ms=50.0, preprocess_ms=10.0))
    assert rec.window_ms == pytest.approx(0.8 * (50.0 - 10.0 - KNEE_P99_MS))
    assert any("SLO p99 50 ms - preprocess 10 ms = 40 ms" in reason for reason in rec.reasons)


def test_slo_that_cannot_hold_at_the_knee_takes_the_largest_cap_that_fits(
    resnet50: ProfileResult,
) -> None:
    # budget 10 - 2 = 8 ms: the knee (p99 8.807 ms) does not fit; batch 64 (7.452 ms) does
    rec = recommend(resnet50, SLO(latency_ms=10.0, preprocess_ms=2.0))
    assert rec.max_batch_size == 64
    assert rec.window_ms == pytest.approx(0.8 * (8.0 - 7.452))
    assert rec.meets_slo is True
    assert any(
        "exceeds the budget of 8 ms" in reason and "fits, 64 (p99 7.45 ms)" in reason
        for reason in rec.reasons
    )


def test_largest_fitting_cap_skips_a_slow_smaller_size(resnet50: ProfileResult) -> None:
    # budget 5 ms: batch 2 (p99 6.47 ms) does not fit but 32 (4.167 ms) does
    rec = recommend(resnet50, SLO(latency_ms=5.0))
    assert rec.max_batch_size == 32
    assert rec.window_ms == pytest.approx(0.8 * (5.0 - 4.167))


def test_cap_never_goes_above_the_knee_even_if_a_larger_size_fits() -> None:
    rows = [
        ProfileRow(1, 1.0, 1.0, 1000.0),
        ProfileRow(2, 5.0, 9.0, 400.0),
        ProfileRow(4, 2.0, 2.0, 2000.0),
    ]
    result = ProfileResult(tuple(rows), None, "cpu", "m", 1)
    rec = recommend(result, SLO(latency_ms=3.0), knee=Knee.at(rows[1], "kneedle"))
    assert rec.max_batch_size == 1


def test_slo_that_even_batch_1_cannot_meet(resnet50: ProfileResult) -> None:
    rec = recommend(resnet50, SLO(latency_ms=3.0))
    assert rec.meets_slo is False
    assert rec.max_batch_size == 1
    assert rec.window_ms == 0.0
    assert rec.slo_latency_ms == 3.0
    assert rec.message == rec.reasons[0]
    assert rec.message is not None
    assert rec.message.startswith(
        "SLO cannot be met: even batch 1 takes p99 3.82 ms of compute, over the budget of 3 ms"
    )


def test_out_of_memory_is_part_of_the_reasoning() -> None:
    result = table_result(RESNET50_H200[:8], oom_batch_size=256)
    rec = recommend(result)
    assert "batch 256 ran out of memory; the cap stays below it" in rec.reasons


def test_a_knee_at_the_largest_size_suggests_profiling_further() -> None:
    result = table_result(RESNET50_H200[:6])  # 1 .. 32: still launch-bound, no knee yet
    rec = recommend(result)
    assert rec.max_batch_size == 32
    assert "Kneedle found no knee" in rec.reasons[0]
    assert rec.reasons[1] == (
        "the knee is the largest batch size profiled (32): throughput may still rise beyond it; "
        "profile larger batch sizes to find out"
    )
    assert not any(
        "largest batch size profiled" in reason
        for reason in recommend(table_result(RESNET50_H200)).reasons
    )


def test_an_explicit_knee_is_used(resnet50: ProfileResult) -> None:
    rec = recommend(resnet50, knee=Knee.at(resnet50.row(64), "fraction_of_max"))
    assert rec.max_batch_size == 64
    assert rec.window_ms == pytest.approx(0.8 * 7.219)


def test_controller_bounds_are_the_bounds_a_batcher_takes(resnet50: ProfileResult) -> None:
    rec = recommend(resnet50, SLO(latency_ms=50.0))
    bounds = controller_bounds(rec)
    assert isinstance(bounds, Bounds)
    assert bounds == Bounds(0.0, rec.window_ms, 1, 128)
    assert rec.controller_bounds() == bounds
    assert bounds.max_window_ms == pytest.approx(0.8 * (50.0 - KNEE_P99_MS))
    with pytest.raises(TypeError, match=r"^recommendation must be a Recommendation, got dict$"):
        controller_bounds({})  # type: ignore[arg-type]


def test_a_batcher_starts_at_the_recommendation_within_its_bounds(
    resnet50: ProfileResult,
) -> None:
    for slo in (SLO(latency_ms=50.0), SLO(latency_ms=3.0)):  # the second cannot be met: window 0
        rec = recommend(resnet50, slo)
        batcher = AdaptiveBatcher(
            lambda items: items,
            max_batch_size=rec.max_batch_size,
            window_ms=rec.window_ms,
            slo=slo,
            bounds=rec.controller_bounds(),
        )
        stats = batcher.stats()
        assert (stats.window_ms, stats.max_batch_size) == (rec.window_ms, rec.max_batch_size)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"window_fraction": 0}, ValueError, "window_fraction must be a number in (0, 1], got 0"),
        (
            {"window_fraction": 1.5},
            ValueError,
            "window_fraction must be a number in (0, 1], got 1.5",
        ),
        ({"window_fraction": "0.8"}, TypeError, "window_fraction must be a number, got str"),
        ({"slo": 50.0}, TypeError, "slo must be an SLO or None, got float"),
        ({"knee": 128}, TypeError, "knee must be a Knee or None, got int"),
        (
            {"knee": Knee(100, 1.0, 1.0, 100.0, "kneedle")},
            ValueError,
            "knee batch size 100 is not among the profiled batch sizes "
            "[1, 2, 4, 8, 16, 32, 64, 128, 256, 512]",
        ),
    ],
)
def test_invalid_arguments(
    resnet50: ProfileResult, kwargs: dict[str, object], error: type[Exception], message: str
) -> None:
    with pytest.raises(error) as info:
        recommend(resnet50, **kwargs)  # type: ignore[arg-type]
    assert str(info.value) == message


def test_result_must_be_a_profile_with_rows() -> None:
    with pytest.raises(TypeError, match=r"^result must be a ProfileResult, got list$"):
        recommend([])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^cannot recommend") as info:
        recommend(ProfileResult((), 1, "cpu", "m", 1))
    assert str(info.value) == (
        "cannot recommend from a profile with no rows (batch size 1 already ran out of memory)"
    )


def test_recommendation_validation() -> None:
    rec = Recommendation(8, 2, None, True, ["a", "b"])  # type: ignore[arg-type]
    assert rec.reasons == ("a", "b")
    assert rec.window_ms == 2.0 and isinstance(rec.window_ms, float)
    with pytest.raises(ValueError, match=r"^Recommendation.max_batch_size must be >= 1, got 0$"):
        Recommendation(0, 1.0, None, True, ())
    with pytest.raises(ValueError, match=r"^Recommendation.window_ms must be a finite number >= 0"):
        Recommendation(1, -1.0, None, True, ())
    with pytest.raises(TypeError, match=r"^Recommendation.meets_slo must be a bool, got int$"):
        Recommendation(1, 1.0, None, 1, ())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^Recommendation.reasons must be a sequence of str"):
        Recommendation(1, 1.0, None, True, "why")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^Recommendation.reasons\[1\] must be a str, got int$"):
        Recommendation(1, 1.0, None, True, ("a", 2))  # type: ignore[arg-type]

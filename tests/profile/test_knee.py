"""find_knee: Kneedle on log2(batch size), and the fraction-of-max fallback."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest

from adaptive_batcher.profile import FALLBACK_FRACTION, Knee, ProfileResult, ProfileRow, find_knee
from tests.profile.fakes import BERT_BASE_SEQ128_H200, RESNET50_H200, table_result

POWERS = tuple(2**i for i in range(10))  # 1 .. 512


def _curve(latency_ms: Callable[[int], float], sizes: Sequence[int] = POWERS) -> list[ProfileRow]:
    return [ProfileRow(n, latency_ms(n), latency_ms(n), n / (latency_ms(n) / 1e3)) for n in sizes]


def test_resnet50_on_h200_knee_is_128(resnet50: ProfileResult) -> None:
    knee = find_knee(resnet50)
    assert knee == Knee(128, 8.778, 8.807, 14581.9, "kneedle")


def test_bert_on_h200_knee_is_128() -> None:
    knee = find_knee(table_result(BERT_BASE_SEQ128_H200))
    assert (knee.batch_size, knee.method) == (128, "kneedle")


def test_rows_are_accepted_as_well_as_a_result(resnet50: ProfileResult) -> None:
    assert find_knee(list(resnet50.rows)) == find_knee(resnet50)


def test_roofline_curve_knee_is_where_compute_takes_over() -> None:
    # launch-bound at 4 ms up to batch 64, then 1/16 ms per item: throughput saturates at 64
    knee = find_knee(_curve(lambda n: max(4.0, n / 16)))
    assert (knee.batch_size, knee.method) == (64, "kneedle")
    assert knee.items_per_s == pytest.approx(16000.0)


def test_fallback_when_throughput_keeps_doubling() -> None:
    # constant latency: throughput doubles with the batch, no knee inside the range;
    # the fallback picks the first size within 90 % of the max, i.e. the largest here
    knee = find_knee(_curve(lambda n: 4.0))
    assert (knee.batch_size, knee.method) == (512, "fraction_of_max")


def test_fallback_on_a_flat_curve_is_the_smallest_batch() -> None:
    knee = find_knee(_curve(lambda n: 4.0 * n))  # batching buys nothing
    assert (knee.batch_size, knee.method) == (1, "fraction_of_max")


def test_fallback_with_fewer_than_three_points() -> None:
    rows = [ProfileRow(1, 1.0, 1.0, 1000.0), ProfileRow(2, 1.05, 1.1, 1904.8)]
    assert find_knee(rows) == Knee(2, 1.05, 1.1, 1904.8, "fraction_of_max")
    assert find_knee(rows[:1]) == Knee(1, 1.0, 1.0, 1000.0, "fraction_of_max")


def test_fallback_fraction_is_the_first_size_reaching_that_share_of_the_max() -> None:
    rows = [
        ProfileRow(1, 1.0, 1.0, 1000.0),
        ProfileRow(2, 1.0, 1.0, 2000.0),
        ProfileRow(4, 1.25, 1.25, 3200.0),
    ]
    # 3 points, but Kneedle finds no interior knee on this curve
    assert find_knee(rows) == Knee(4, 1.25, 1.25, 3200.0, "fraction_of_max")
    assert find_knee(rows, fallback_fraction=0.6).batch_size == 2
    assert find_knee(rows, fallback_fraction=0.3) == Knee(1, 1.0, 1.0, 1000.0, "fraction_of_max")
    assert FALLBACK_FRACTION == 0.9


def test_knee_is_never_an_end_point_from_kneedle(resnet50: ProfileResult) -> None:
    # raw kneed (offline) reports a spurious knee at batch 1 on this S-shaped curve
    import numpy as np
    from kneed import KneeLocator

    x = np.log2(resnet50.batch_sizes)
    y = [row.items_per_s for row in resnet50.rows]
    raw = KneeLocator(x, y, curve="concave", direction="increasing")
    assert raw.knee == 0.0  # documents why find_knee filters end points
    assert find_knee(resnet50).batch_size == 128


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"sensitivity": 0.0}, ValueError, "sensitivity must be a finite number > 0, got 0.0"),
        (
            {"fallback_fraction": 1.5},
            ValueError,
            "fallback_fraction must be a number in (0, 1], got 1.5",
        ),
        (
            {"fallback_fraction": 0},
            ValueError,
            "fallback_fraction must be a number in (0, 1], got 0",
        ),
        ({"sensitivity": "1"}, TypeError, "sensitivity must be a number, got str"),
    ],
)
def test_invalid_arguments(
    resnet50: ProfileResult, kwargs: dict[str, object], error: type[Exception], message: str
) -> None:
    with pytest.raises(error) as info:
        find_knee(resnet50, **kwargs)  # type: ignore[arg-type]
    assert str(info.value) == message


def test_no_rows_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"^cannot find a knee: the profile has no rows$"):
        find_knee(ProfileResult((), 1, "cpu", "m", 1))
    with pytest.raises(ValueError, match=r"^cannot find a knee: the profile has no rows$"):
        find_knee([])


def test_wrong_types_are_errors() -> None:
    with pytest.raises(TypeError) as info:
        find_knee(42)  # type: ignore[arg-type]
    assert str(info.value) == (
        "profile must be a ProfileResult or a sequence of ProfileRow, got int"
    )
    with pytest.raises(TypeError, match=r"rows\[0\] must be a ProfileRow, got tuple"):
        find_knee(RESNET50_H200)  # type: ignore[arg-type]

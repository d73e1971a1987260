"""The online service-time model: monotone fit in range, optimistic beyond, memory of sizes."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adaptive_batcher.control.service_model import OPTIMISM, ServiceTimeModel, isotonic_fit
from adaptive_batcher.metrics.recorder import BatchSample

# resnet50 on an H200, ../shared/profiles/h200/batch_profile.csv (median ms)
RESNET = {1: 3.676, 4: 3.881, 8: 3.968, 16: 3.916, 32: 4.041, 64: 7.219, 128: 8.778, 256: 16.651}


def samples(table: dict[int, float], repeat: int = 4) -> list[BatchSample]:
    return [BatchSample(0.0, n, n, ms / 1e3) for n, ms in table.items() for _ in range(repeat)]


def test_nan_until_enough_samples() -> None:
    model = ServiceTimeModel(min_samples=8)
    model.update(samples({4: 4.0}, repeat=3), total_seen=3)
    assert math.isnan(model.predict_ms(4))


def test_in_range_fit_is_monotone_and_close_to_measurements() -> None:
    model = ServiceTimeModel(refit_every=1)
    batch = samples(RESNET)
    model.update(batch, total_seen=len(batch))
    predictions = [model.predict_ms(n) for n in range(1, 257)]
    assert all(b >= a for a, b in itertools.pairwise(predictions))
    assert model.predict_ms(256) == pytest.approx(16.651)
    assert model.predict_ms(128) == pytest.approx(8.778)
    assert model.predict_ms(16) == pytest.approx(3.916, rel=0.05)  # pooled with its neighbours


def test_extrapolation_beyond_the_data_is_optimistic() -> None:
    model = ServiceTimeModel(refit_every=1)
    batch = samples({16: 3.916, 32: 4.041})
    model.update(batch, total_seen=len(batch))
    expected_128 = 4.041 + OPTIMISM * 4.041 / 32 * (128 - 32)
    assert model.predict_ms(128) == pytest.approx(expected_128)
    assert model.predict_ms(128) < 8.778  # below the truth: the controller will try it
    assert model.predict_ms(1) == pytest.approx(3.916)  # flat below the smallest size seen


def test_sizes_seen_long_ago_stay_known() -> None:
    model = ServiceTimeModel(refit_every=1)
    small = samples({8: 4.0})
    model.update(small, total_seen=len(small))
    flood = [BatchSample(0.0, 256, 256, 0.0167)] * 600  # the recent window holds only 256s
    model.update(flood[-512:], total_seen=len(small) + len(flood))
    assert model.predict_ms(8) == pytest.approx(4.0)
    assert model.predict_ms(256) == pytest.approx(16.7)


def test_refits_only_every_n_batches() -> None:
    model = ServiceTimeModel(min_samples=1, refit_every=10)
    model.update([BatchSample(0.0, 4, 4, 0.004)] * 10, total_seen=10)
    first = model.predict_ms(4)
    model.update([BatchSample(0.0, 4, 4, 0.040)] * 5, total_seen=15)  # not yet due
    assert model.predict_ms(4) == first


def test_seed_profile_predicts_before_any_batch() -> None:
    model = ServiceTimeModel(seed=[(1, 3.7), (256, 16.7)])
    assert model.predict_ms(256) == pytest.approx(16.7)
    assert model.largest_within(10.0, [1, 32, 64, 256]) == 64


def test_validation() -> None:
    with pytest.raises(ValueError, match="must be >= 1"):
        ServiceTimeModel(min_samples=0)


@settings(max_examples=100, deadline=None)
@given(
    points=st.dictionaries(st.integers(1, 600), st.floats(0.5, 50.0), min_size=2, max_size=40),
    refits=st.integers(1, 3),
)
def test_predictions_made_at_a_refit_equal_one_call_per_size(
    points: dict[int, float], refits: int
) -> None:
    """A refit predicts every size inside the fitted range at once (one np.interp on an array);
    each value must be the one a call for that size alone gives, or decisions would change."""
    model = ServiceTimeModel(refit_every=1, min_samples=1)
    batch = samples(points, repeat=2)
    for k in range(refits):
        model.update(batch, total_seen=(k + 1) * len(batch))
    sizes, medians = model._sizes, model._medians
    for n in range(1, 650):
        if sizes[0] < n < sizes[-1]:
            assert model.predict_ms(n) == float(np.interp(n, sizes, medians))


def test_reservoir_medians_follow_new_samples() -> None:
    """Medians are kept between refits, and dropped when their size gets a new sample."""
    model = ServiceTimeModel(refit_every=1, min_samples=1)
    model.update([BatchSample(0.0, 8, 8, 0.004)] * 3, total_seen=3)
    assert model.predict_ms(8) == pytest.approx(4.0)
    model.update([BatchSample(0.0, 8, 8, 0.010)] * 5, total_seen=8)
    assert model.predict_ms(8) == pytest.approx(10.0)  # median of 3 x 4 ms and 5 x 10 ms


def _pooled_blocks_reference(values: list[float], weights: list[float]) -> list[float]:
    """Pool adjacent violators as the first implementation did (a list per block)."""
    blocks: list[list[float]] = []  # [weighted mean, weight, count]
    for value, weight in zip(values, weights, strict=True):
        blocks.append([float(value), float(weight), 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            mean, total, count = blocks.pop()
            previous = blocks[-1]
            combined = previous[1] + total
            previous[0] = (previous[0] * previous[1] + mean * total) / combined
            previous[1] = combined
            previous[2] += count
    fitted: list[float] = []
    for mean, _, count in blocks:
        fitted.extend([mean] * int(count))
    return fitted


@settings(max_examples=300, deadline=None)
@given(
    pairs=st.lists(st.tuples(st.floats(0.0, 100.0), st.floats(0.5, 32.0)), max_size=80),
)
def test_isotonic_fit_is_non_decreasing_and_pools_as_the_reference(
    pairs: list[tuple[float, float]],
) -> None:
    values, weights = [v for v, _ in pairs], [w for _, w in pairs]
    fitted = isotonic_fit(values, weights)
    assert fitted == _pooled_blocks_reference(values, weights)  # the same floats, exactly
    assert all(b >= a for a, b in itertools.pairwise(fitted))
    assert isotonic_fit(values) == _pooled_blocks_reference(values, [1.0] * len(values))

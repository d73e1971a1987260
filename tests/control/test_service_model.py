"""The online service-time model: monotone fit in range, optimistic beyond, memory of sizes."""

from __future__ import annotations

import itertools
import math

import pytest

from adaptive_batcher.control.service_model import OPTIMISM, ServiceTimeModel
from adaptive_batcher.metrics.recorder import BatchSample

# resnet50 on an H200, adaptive_batcher/data/h200/batch_profile.csv (median ms)
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

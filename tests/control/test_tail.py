"""The latency tail of a window-batched queue: ``U * max(window, X1 / slots) + X2``."""

from __future__ import annotations

import math

import numpy as np
import pytest

from adaptive_batcher.control.tail import (
    exceed_probability,
    in_flight_points_ms,
    latency_quantile_ms,
    lognormal_sigma,
)


def sampled_quantile(
    window_ms: float, in_flight: tuple[float, float], own: tuple[float, float], slots: int = 1
) -> float:
    """The same quantile (0.99) from two million seeded draws."""
    rng = np.random.default_rng(7)
    draws = 2_000_000
    (median_1, sigma_1), (median_2, sigma_2) = in_flight, own
    period = np.maximum(window_ms, median_1 * np.exp(sigma_1 * rng.standard_normal(draws)) / slots)
    latency = rng.random(draws) * period + median_2 * np.exp(sigma_2 * rng.standard_normal(draws))
    return float(np.quantile(latency, 0.99))


@pytest.mark.parametrize(
    ("window_ms", "in_flight", "own", "slots"),
    [
        (75.0, (55.0, 0.30), (57.0, 0.30), 1),  # a decode step, 30 % noise, window past it
        (0.0, (4.0, 0.05), (4.2, 0.05), 1),  # window 0, quiet noise: two batches, nearly
        (100.0, (5.0, 0.05), (5.0, 0.05), 1),  # the window dominates
        (20.0, (30.0, 0.10), (31.0, 0.10), 2),  # two slots
        (0.0, (50.0, 1.0), (50.0, 0.2), 1),  # a heavy-tailed batch in flight
    ],
)
def test_the_quantile_matches_sampling(
    window_ms: float, in_flight: tuple[float, float], own: tuple[float, float], slots: int
) -> None:
    expected = sampled_quantile(window_ms, in_flight, own, slots)
    got = latency_quantile_ms(window_ms, in_flight, own, 0.99, slots)
    assert got == pytest.approx(expected, rel=0.01)


def test_the_quantile_lies_below_the_sum_of_error_bars_when_the_noise_is_large() -> None:
    """The bound it replaces, ``max(window, X1 at p95) + X2 at p95``, is the latency of a
    request that arrives first behind a slow batch and rides a slow one: near the p99.99."""
    median, sigma = 55.0, 0.3
    p95 = median * math.exp(1.6449 * sigma)
    tail = latency_quantile_ms(75.0, (median, sigma), (median, sigma), 0.99)
    assert tail < 0.95 * (max(75.0, p95) + p95)  # 166.9 against 180.2 ms
    assert tail > 75.0 * 0.99 + median  # never below the window's share and a median batch


def test_a_higher_quantile_and_a_wider_window_give_more() -> None:
    noise = (20.0, 0.2)
    assert latency_quantile_ms(10.0, noise, noise, 0.999) > latency_quantile_ms(
        10.0, noise, noise, 0.99
    )
    assert latency_quantile_ms(30.0, noise, noise, 0.99) > latency_quantile_ms(
        10.0, noise, noise, 0.99
    )


def test_lognormal_sigma_from_a_quantile_and_the_median() -> None:
    assert lognormal_sigma(55.0 * math.exp(1.6449 * 0.3), 55.0, 1.6449) == pytest.approx(0.3)
    assert lognormal_sigma(55.0, 55.0, 1.6449) == 1e-3  # no spread: a floor, not 0
    assert lognormal_sigma(math.nan, 55.0, 1.6449) == 1e-3


@pytest.mark.parametrize("window_ms", [0.0, 10.0, 75.0])
def test_the_share_later_than_the_quantile_is_the_tail(window_ms: float) -> None:
    noise = (55.0, 0.3)
    tail = latency_quantile_ms(window_ms, noise, noise, 0.99)
    assert exceed_probability(window_ms, noise, noise, tail) == pytest.approx(0.01, rel=0.01)
    assert exceed_probability(window_ms, noise, noise, 1.02 * tail) < 0.01
    assert exceed_probability(window_ms, noise, noise, 0.98 * tail) > 0.01


def test_a_batch_timed_at_zero_has_no_noise() -> None:
    assert latency_quantile_ms(5.0, (0.0, 0.3), (0.0, 0.3), 0.99) == 5.0
    assert exceed_probability(5.0, (0.0, 0.3), (0.0, 0.3), 4.0) == 1.0
    assert exceed_probability(5.0, (0.0, 0.3), (0.0, 0.3), 6.0) == 0.0


@pytest.mark.parametrize("slots", [1, 2])
def test_points_computed_once_give_the_same_share(slots: int) -> None:
    in_flight, own = (30.0, 0.25), (33.0, 0.4)
    points = in_flight_points_ms(in_flight, slots)
    for window_ms in (0.0, 5.0, 20.0, 60.0):
        for latency_ms in (40.0, 80.0, 150.0):
            alone = exceed_probability(window_ms, in_flight, own, latency_ms, slots)
            shared = exceed_probability(window_ms, in_flight, own, latency_ms, slots, points)
            assert shared == alone

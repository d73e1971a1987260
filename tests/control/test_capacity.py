"""Caps from the service model: fits the budget, keeps up with demand, throughput under overload."""

from __future__ import annotations

import math

import pytest

from adaptive_batcher.control.capacity import (
    choose_cap,
    latency_cap,
    stability_cap,
    throughput_cap,
)
from adaptive_batcher.control.types import Bounds
from tests.control.factories import linear_ms, observe

# service 4 ms + 0.05 ms/item: 64 -> 7.2 ms (8.9k/s), 128 -> 10.4 ms (12.3k/s), 256 -> 16.8 ms


@pytest.mark.parametrize(
    ("budget_ms", "window_ms", "expected"),
    [
        (40.0, 0.0, 256),  # 2 * 16.8 = 33.6 <= 40
        (30.0, 0.0, 128),  # 2 * 10.4 = 20.8 <= 30 < 33.6
        (30.0, 10.0, 64),  # 10 + 2 * 7.2 = 24.4 <= 30 < 10 + 20.8
        (8.0, 0.0, None),  # even 2 * 4.05 > 8
    ],
)
def test_latency_cap(budget_ms: float, window_ms: float, expected: int | None) -> None:
    assert latency_cap(observe(), budget_ms, window_ms) == expected


@pytest.mark.parametrize(
    ("arrival_rps", "queue", "expected"),
    [
        (1000.0, 0, 8),  # 8 / 4.4 ms = 1.8k/s >= 1.15k
        (7000.0, 0, 64),  # 64 / 7.2 ms = 8.9k >= 8.05k; 32 / 5.6 ms = 5.7k is not
        (7000.0, 100, 128),  # + 100 queued over the 40 ms budget = 2.5k/s more demand
        (20000.0, 0, None),  # nothing reaches 23k/s: overload
    ],
)
def test_stability_cap_counts_arrivals_and_backlog(
    arrival_rps: float, queue: int, expected: int | None
) -> None:
    obs = observe(arrival_rate_rps=arrival_rps, queue_depth=queue)
    assert stability_cap(obs) == expected


def test_throughput_cap_prefers_caps_within_budget() -> None:
    obs = observe()
    assert throughput_cap(obs) == 256
    assert throughput_cap(obs, budget_ms=30.0) == 128


@pytest.mark.parametrize(
    ("arrival_rps", "budget_ms", "expected"),
    [
        (1000.0, 30.0, 128),  # keeps up; largest that fits
        (10000.0, 8.0, 128),  # nothing fits: the smallest that keeps up
        (50000.0, 30.0, 256),  # overload: highest throughput
    ],
)
def test_choose_cap(arrival_rps: float, budget_ms: float, expected: int) -> None:
    assert choose_cap(observe(arrival_rate_rps=arrival_rps), budget_ms, 0.0) == expected


def test_no_model_means_no_answer() -> None:
    obs = observe(service_ms=lambda n: math.nan)
    assert latency_cap(obs, 40.0, 0.0) is None
    assert stability_cap(obs) is None
    assert choose_cap(obs, 40.0, 0.0) is None


def test_candidates_follow_buckets() -> None:
    obs = observe(
        bounds=Bounds(0.0, 50.0, 1, 256, batch_sizes=(4, 48, 200)), service_ms=linear_ms(4.0, 0.05)
    )
    assert latency_cap(obs, 30.0, 0.0) == 200  # 2 * 14 = 28
    assert obs.bounds.cap_candidates() == [4, 48, 200]

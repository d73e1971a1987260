"""AIMD (Clipper): one observation in, one decision out."""

from __future__ import annotations

import math
from typing import Any

import pytest

from adaptive_batcher.control.types import Bounds, Decision, Observation
from adaptive_batcher.policies import AIMD, Policy
from adaptive_batcher.slo import SLO

SLO_50 = SLO(latency_ms=50.0)  # target_ms = 0.8 * 50 = 40 ms


CURRENT = Decision(2.0, 32)
DEFAULT_BOUNDS = Bounds()


def observe(
    current: Decision = CURRENT,
    bounds: Bounds = DEFAULT_BOUNDS,
    slo: SLO | None = SLO_50,
    latency_ms: float = 30.0,
    latency_samples: int = 100,
    fill_ratio: float = 1.0,
) -> Observation:
    return Observation(
        now_s=10.0,
        interval_s=0.5,
        current=current,
        bounds=bounds,
        slo=slo,
        latency_ms=latency_ms,
        latency_samples=latency_samples,
        fill_ratio=fill_ratio,
        batches=10,
        throughput_rps=1000.0,
        goodput_rps=1000.0,
    )


BUCKETS = Bounds(max_batch_size=64, batch_sizes=(1, 8, 16, 32, 64))

# (id, AIMD kwargs, observe kwargs, expected decision)
ROWS: list[tuple[str, dict[str, Any], dict[str, Any], Decision]] = [
    ("under target, full: +step", {}, {}, Decision(2.0, 33, "aimd.increase")),
    ("fill at the threshold counts", {}, {"fill_ratio": 0.8}, Decision(2.0, 33, "aimd.increase")),
    ("latency at target is not over", {}, {"latency_ms": 40.0}, Decision(2.0, 33, "aimd.increase")),
    ("step 8", {"step": 8}, {}, Decision(2.0, 40, "aimd.increase")),
    ("over: floor(32 * 0.9) = 28", {}, {"latency_ms": 41.0}, Decision(2.0, 28, "aimd.decrease")),
    (
        "over: floor(10 * 0.9) = 9 exactly",
        {},
        {"latency_ms": 41.0, "current": Decision(2.0, 10)},
        Decision(2.0, 9, "aimd.decrease"),
    ),
    (
        "over: a small cap still drops one unit",
        {},
        {"latency_ms": 41.0, "current": Decision(2.0, 5)},
        Decision(2.0, 4, "aimd.decrease"),
    ),
    (
        "over: backoff 0.5",
        {"backoff": 0.5},
        {"latency_ms": 41.0, "current": Decision(2.0, 33)},
        Decision(2.0, 16, "aimd.decrease"),
    ),
    (
        "over at cap 1 stays at the minimum",
        {},
        {"latency_ms": 90.0, "current": Decision(2.0, 1)},
        Decision(2.0, 1, "aimd.decrease"),
    ),
    (
        "over: never below min_batch_size",
        {},
        {"latency_ms": 90.0, "bounds": Bounds(min_batch_size=30)},
        Decision(2.0, 30, "aimd.decrease"),
    ),
    (
        "over with low fill still decreases",
        {},
        {"latency_ms": 90.0, "fill_ratio": 0.1},
        Decision(2.0, 28, "aimd.decrease"),
    ),
    ("fill low: hold", {}, {"fill_ratio": 0.5}, Decision(2.0, 32, "aimd.hold")),
    ("no batches (NaN fill): hold", {}, {"fill_ratio": math.nan}, Decision(2.0, 32, "aimd.hold")),
    ("no SLO: hold", {}, {"slo": None, "latency_ms": 999.0}, Decision(2.0, 32, "aimd.hold")),
    ("no samples: hold", {}, {"latency_samples": 0}, Decision(2.0, 32, "aimd.hold")),
    ("NaN latency: hold", {}, {"latency_ms": math.nan}, Decision(2.0, 32, "aimd.hold")),
    (
        "increase stops at max_batch_size",
        {},
        {"current": Decision(2.0, 256)},
        Decision(2.0, 256, "aimd.increase"),
    ),
    (
        "a cap in force above the bounds is clamped",
        {},
        {"slo": None, "current": Decision(2.0, 300)},
        Decision(2.0, 256, "aimd.hold"),
    ),
    ("fixed window", {"window_ms": 5.0}, {}, Decision(5.0, 33, "aimd.increase")),
    (
        "fixed window clamped into bounds",
        {"window_ms": 50.0},
        {"slo": None, "bounds": Bounds(max_window_ms=10.0)},
        Decision(10.0, 32, "aimd.hold"),
    ),
    (
        "window in force clamped into bounds",
        {},
        {"current": Decision(20.0, 32), "bounds": Bounds(max_window_ms=10.0)},
        Decision(10.0, 33, "aimd.increase"),
    ),
    (
        "buckets: one unit up stays on the bucket in force",
        {},
        {"bounds": BUCKETS},
        Decision(2.0, 32, "aimd.increase"),
    ),
    (
        "buckets: a step reaching the next bucket moves there",
        {"step": 32},
        {"bounds": BUCKETS},
        Decision(2.0, 64, "aimd.increase"),
    ),
    (
        "buckets: decrease lands on the bucket below floor(32 * 0.9)",
        {},
        {"bounds": BUCKETS, "latency_ms": 41.0},
        Decision(2.0, 16, "aimd.decrease"),
    ),
]


@pytest.mark.parametrize(
    ("policy_kwargs", "observation_kwargs", "expected"),
    [row[1:] for row in ROWS],
    ids=[row[0] for row in ROWS],
)
def test_one_tick(
    policy_kwargs: dict[str, Any], observation_kwargs: dict[str, Any], expected: Decision
) -> None:
    assert AIMD(**policy_kwargs).decide(observe(**observation_kwargs)) == expected


def test_additive_steps_accumulate_up_to_the_next_bucket() -> None:
    policy = AIMD()
    current = Decision(2.0, 32)
    caps = []
    for _ in range(32):
        current = policy.decide(observe(current=current, bounds=BUCKETS))
        caps.append(current.max_batch_size)
    assert caps == [32] * 31 + [64]


def test_continues_from_a_cap_changed_by_someone_else() -> None:
    policy = AIMD()
    policy.decide(observe(current=Decision(2.0, 32), bounds=BUCKETS))  # accumulated 33
    # a guard cut the cap to 8: AIMD continues from 8, not from its own 33
    assert policy.decide(observe(current=Decision(2.0, 8), bounds=BUCKETS)).max_batch_size == 8
    assert policy.decide(observe(current=Decision(2.0, 8))).max_batch_size == 10


def test_reset_sets_the_starting_cap() -> None:
    policy = AIMD(step=4)
    policy.reset(Decision(1.0, 16))
    policy.decide(observe(current=Decision(1.0, 16), bounds=BUCKETS))  # 20 -> bucket 16
    policy.reset(Decision(1.0, 32))
    assert policy.decide(observe(current=Decision(1.0, 32), bounds=BUCKETS)) == Decision(
        1.0, 32, "aimd.increase"
    )


def test_sawtooth_under_a_load_that_breaks_the_target_above_cap_40() -> None:
    policy = AIMD(step=2)
    current = Decision(0.0, 30)
    caps = []
    for _ in range(20):
        latency = 35.0 if current.max_batch_size <= 40 else 45.0
        current = policy.decide(observe(current=current, latency_ms=latency))
        caps.append(current.max_batch_size)
    assert caps[:6] == [32, 34, 36, 38, 40, 42]
    # floor(42 * 0.9) = 37, then up again; floor(41 * 0.9) = 36
    assert caps[6:13] == [37, 39, 41, 36, 38, 40, 42]
    assert max(caps) == 42 and min(caps[6:]) == 36


def test_is_a_policy_named_aimd() -> None:
    policy = AIMD()
    assert isinstance(policy, Policy)
    assert policy.name == "aimd"


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"step": 0}, ValueError, "AIMD.step must be >= 1, got 0"),
        ({"step": 1.5}, TypeError, "AIMD.step must be an int, got float"),
        ({"backoff": 1.0}, ValueError, "AIMD.backoff must be in (0, 1), got 1.0"),
        ({"backoff": 0}, ValueError, "AIMD.backoff must be a finite number > 0, got 0"),
        ({"fill_threshold": 1.5}, ValueError, "AIMD.fill_threshold must be in [0, 1], got 1.5"),
        (
            {"fill_threshold": -0.1},
            ValueError,
            "AIMD.fill_threshold must be a finite number >= 0, got -0.1",
        ),
        ({"window_ms": -1}, ValueError, "AIMD.window_ms must be a finite number >= 0, got -1"),
        ({"window_ms": "5"}, TypeError, "AIMD.window_ms must be a number, got str"),
    ],
)
def test_invalid_arguments(kwargs: dict[str, Any], error: type[Exception], message: str) -> None:
    with pytest.raises(error) as caught:
        AIMD(**kwargs)
    assert str(caught.value) == message


@pytest.mark.parametrize(
    ("cap", "expected_cap", "reason"),
    [
        (64, 65, "aimd.increase"),  # batch of 64 takes 4 + 0.5 * 64 = 36 ms <= SLO 50 ms
        (100, 90, "aimd.decrease"),  # 54 ms > 50 ms: cut 10 %
    ],
)
def test_clipper_rule_uses_batch_time_against_the_slo(
    cap: int, expected_cap: int, reason: str
) -> None:
    """With a service-time estimate, Clipper's own quantity decides: the batch's processing time."""
    obs = Observation(
        now_s=1.0,
        interval_s=0.25,
        current=Decision(0.0, cap),
        bounds=Bounds(0.0, 10.0, 1, 256),
        slo=SLO(latency_ms=50.0),
        latency_ms=400.0,  # end-to-end latency is ignored by Clipper's rule
        latency_samples=100,
        fill_ratio=1.0,
        service_median_ms=lambda n: 4.0 + 0.5 * n,
    )
    decision = AIMD().decide(obs)
    assert decision.max_batch_size == expected_cap
    assert decision.reason == reason

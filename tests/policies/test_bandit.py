"""Discounted bandits over (window, cap): reward, grid, exploration, convergence, switching."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from adaptive_batcher.control.types import Bounds, Decision, Observation
from adaptive_batcher.policies import Bandit, DiscountedThompson, DiscountedUCB, Policy
from adaptive_batcher.policies.bandit import Arm, ArmStats, BanditOptions, tick_reward
from adaptive_batcher.slo import SLO

SLO_50 = SLO(p99_ms=50.0)
CAPS, WINDOWS = (8, 32, 64), (0.0, 5.0)
SMALL: BanditOptions = {"caps": CAPS, "windows_ms": WINDOWS}  # six arms
BOUNDS = Bounds(max_batch_size=64)

# Two reward tables over the six arms; the best arm moves from (5, 32) to (0, 8).
TABLE_A: dict[Arm, float] = {
    (0.0, 8): 0.5, (5.0, 8): 0.6, (0.0, 32): 0.7, (5.0, 32): 1.0, (0.0, 64): 0.8, (5.0, 64): 0.4,
}  # fmt: skip
TABLE_B: dict[Arm, float] = {
    (0.0, 8): 1.0, (5.0, 8): 0.7, (0.0, 32): 0.6, (5.0, 32): 0.5, (0.0, 64): 0.3, (5.0, 64): 0.2,
}  # fmt: skip


START = Decision(0.0, 8)


def observe(
    current: Decision,
    *,
    bounds: Bounds = BOUNDS,
    slo: SLO | None = SLO_50,
    throughput_rps: float = 100.0,
    goodput_rps: float | None = None,
    latency_ms: float = 10.0,
    mean_ms: float = 5.0,
) -> Observation:
    return Observation(
        now_s=0.0,
        interval_s=1.0,
        current=current,
        bounds=bounds,
        slo=slo,
        latency_ms=latency_ms,
        mean_ms=mean_ms,
        latency_samples=100,
        throughput_rps=throughput_rps,
        goodput_rps=throughput_rps if goodput_rps is None else goodput_rps,
    )


def drive(
    policy: Bandit,
    tables: Sequence[Mapping[Arm, float]],
    start: Decision = START,
) -> list[Decision]:
    """One tick per table entry: the arm in force earns ``100 * table[arm]`` req/s, no misses."""
    current, decisions = start, []
    for table in tables:
        rps = 100.0 * table[(current.window_ms, current.max_batch_size)]
        current = policy.decide(observe(current, throughput_rps=rps))
        decisions.append(current)
    return decisions


def arm_of(decision: Decision) -> Arm:
    return decision.window_ms, decision.max_batch_size


# --- the reward ------------------------------------------------------------------------------

# (id, observe kwargs, scale, tick_reward kwargs, expected)
REWARD_ROWS: list[tuple[str, dict[str, Any], float, dict[str, float], float]] = [
    ("all on time, half the best rate", {}, 200.0, {}, 0.5),
    ("10 % late: 0.9 - 1 * 0.1", {"goodput_rps": 90.0}, 100.0, {}, 0.8),
    ("miss_penalty 2: 0.9 - 2 * 0.1", {"goodput_rps": 90.0}, 100.0, {"miss_penalty": 2.0}, 0.7),
    ("p99 over the SLO: 0.8 - 0.5", {"goodput_rps": 90.0, "latency_ms": 60.0}, 100.0, {}, 0.3),
    ("p99 at the SLO is not over", {"latency_ms": 50.0}, 100.0, {}, 1.0),
    ("NaN p99 is not over", {"latency_ms": math.nan}, 100.0, {}, 1.0),
    ("clipped at 0", {"goodput_rps": 50.0, "latency_ms": 60.0}, 100.0, {}, 0.0),
    ("clipped at 1", {"goodput_rps": 110.0}, 100.0, {}, 1.0),
    ("no SLO: power 100 / 0.005 s over 40000", {"slo": None}, 40_000.0, {}, 0.5),
    ("no SLO ignores lateness", {"slo": None, "goodput_rps": 0.0}, 20_000.0, {}, 1.0),
]


@pytest.mark.parametrize(
    ("observe_kwargs", "scale", "reward_kwargs", "expected"),
    [row[1:] for row in REWARD_ROWS],
    ids=[row[0] for row in REWARD_ROWS],
)
def test_tick_reward(
    observe_kwargs: dict[str, Any], scale: float, reward_kwargs: dict[str, float], expected: float
) -> None:
    observation = observe(Decision(0.0, 8), **observe_kwargs)
    assert tick_reward(observation, scale, **reward_kwargs) == pytest.approx(expected)


def test_rewards_are_scaled_by_the_best_throughput_so_far() -> None:
    policy = DiscountedUCB(caps=(8,), windows_ms=(0,), discount=1.0)
    policy.decide(observe(Decision(0.0, 8), throughput_rps=100.0, goodput_rps=90.0))  # 0.8
    policy.decide(observe(Decision(0.0, 8), throughput_rps=50.0))  # 50 / 100 = 0.5
    policy.decide(observe(Decision(0.0, 8), throughput_rps=200.0))  # the new best: 1.0
    stats = policy.stats((0.0, 8))
    assert stats.count == 3.0 and stats.total == pytest.approx(2.3) and stats.tried


@pytest.mark.parametrize(
    "observe_kwargs",
    [{"throughput_rps": 0.0}, {"slo": None, "mean_ms": math.nan}],
    ids=["no completed requests", "no SLO and no mean latency"],
)
def test_a_tick_without_information_is_ignored(observe_kwargs: dict[str, Any]) -> None:
    policy = DiscountedUCB(dwell_ticks=1, caps=CAPS, windows_ms=WINDOWS)
    decisions = [policy.decide(observe(Decision(5.0, 32), **observe_kwargs)) for _ in range(5)]
    assert decisions == [Decision(5.0, 32, "bandit.hold")] * 5
    assert all(policy.stats(arm) == ArmStats() for arm in policy.arms)


def test_counts_and_sums_are_discounted_every_informative_tick() -> None:
    policy = DiscountedUCB(caps=(8, 32), windows_ms=(0,), discount=0.5, dwell_ticks=1)
    policy.decide(observe(Decision(0.0, 8)))  # reward 1.0 to (0, 8)
    policy.decide(observe(Decision(0.0, 8), throughput_rps=0.0))  # no information: no decay
    policy.decide(observe(Decision(0.0, 32), throughput_rps=50.0))  # reward 0.5 to (0, 32)
    assert policy.stats((0.0, 8)) == ArmStats(0.5, 0.5, True)
    assert policy.stats((0.0, 32)) == ArmStats(1.0, 0.5, True)


# --- the grid --------------------------------------------------------------------------------

# (id, policy kwargs, bounds, expected caps, expected windows)
GRID_ROWS: list[tuple[str, dict[str, Any], Bounds, list[int], list[float]]] = [
    ("defaults: 4 of 9 caps, 5 windows", {}, Bounds(), [1, 8, 32, 256], [0, 2, 5, 10, 20]),
    (
        "all caps",
        {"max_caps": None, "windows_ms": (0, 2, 5)},
        Bounds(max_batch_size=20),
        [1, 2, 4, 8, 16, 20],
        [0, 2, 5],
    ),
    (
        "buckets, windows clamped to the range",
        {"max_caps": None, "windows_ms": (0, 1, 2, 5, 10, 20)},
        Bounds(min_window_ms=1.5, max_window_ms=6, max_batch_size=64, batch_sizes=(4, 16, 64)),
        [4, 16, 64],
        [1.5, 2, 5, 6],
    ),
    (
        "given caps moved onto buckets",
        {"caps": (3, 100, 500)},
        Bounds(batch_sizes=(1, 2, 4, 8, 16, 32, 64, 128, 256)),
        [2, 64, 256],
        [0, 2, 5, 10, 20],
    ),
    (
        "given caps are not thinned",
        {"caps": (1, 2, 4, 8, 16, 32), "windows_ms": (0,)},
        Bounds(),
        [1, 2, 4, 8, 16, 32],
        [0],
    ),
    (
        "given caps clamped to the range",
        {"caps": (1, 8, 1000), "windows_ms": (3,)},
        Bounds(min_batch_size=4, max_batch_size=64),
        [4, 8, 64],
        [3],
    ),
]


@pytest.mark.parametrize(
    ("policy_kwargs", "bounds", "caps", "windows"),
    [row[1:] for row in GRID_ROWS],
    ids=[row[0] for row in GRID_ROWS],
)
def test_grid(
    policy_kwargs: dict[str, Any], bounds: Bounds, caps: list[int], windows: list[float]
) -> None:
    policy = DiscountedUCB(**policy_kwargs)
    assert policy.arms == ()
    policy.decide(observe(Decision(0.0, 8), bounds=bounds, throughput_rps=0.0))
    assert policy.arms == tuple((w, c) for c in caps for w in windows)


@pytest.mark.parametrize("policy", [DiscountedUCB(), DiscountedThompson(seed=3)])
def test_every_decision_is_a_grid_arm_inside_the_bounds(policy: Bandit) -> None:
    bounds = Bounds(max_window_ms=8, max_batch_size=64, batch_sizes=(1, 4, 16, 64))
    current = Decision(3.0, 16)
    for tick in range(200):
        current = policy.decide(
            observe(current, bounds=bounds, throughput_rps=50.0 + (tick * 37) % 100)
        )
        assert arm_of(current) in policy.arms
        assert bounds.clamp(current) == current


def test_a_change_of_bounds_rebuilds_the_grid_and_keeps_what_was_learnt() -> None:
    policy = DiscountedUCB(dwell_ticks=1, caps=CAPS, windows_ms=WINDOWS)
    policy.decide(observe(Decision(5.0, 32)))
    decision = policy.decide(observe(Decision(5.0, 32), bounds=Bounds(max_batch_size=32)))
    assert policy.arms == ((0.0, 8), (5.0, 8), (0.0, 32), (5.0, 32))
    # tick 1 credited (5, 32); tick 2 credited the arm played next; both survive the rebuild
    assert policy.stats((5.0, 32)).count == pytest.approx(0.99)
    assert sum(policy.stats(arm).count for arm in policy.arms) == pytest.approx(1.99)
    assert arm_of(decision) in policy.arms


# --- matching, reset, choice ------------------------------------------------------------------

# (current in force, the arm credited): nearest cap by ratio, then nearest window
NEAREST_ROWS = [
    (Decision(5.0, 32), (5.0, 32)),
    (Decision(4.0, 30), (5.0, 32)),
    (Decision(1.0, 20), (0.0, 32)),  # 20/8 = 2.5 > 32/20 = 1.6
    (Decision(2.5, 16), (0.0, 8)),  # ratio tie 2 = 2: the first, smaller cap; window tie: first
    (Decision(50.0, 1000), (5.0, 64)),
]


@pytest.mark.parametrize(("current", "arm"), NEAREST_ROWS, ids=[str(r[0]) for r in NEAREST_ROWS])
def test_the_tick_is_credited_to_the_nearest_arm(current: Decision, arm: Arm) -> None:
    policy = DiscountedUCB(**SMALL)
    decision = policy.decide(observe(current, bounds=Bounds(max_batch_size=1000)))
    assert decision == Decision(arm[0], arm[1], "bandit.hold")
    assert [a for a in policy.arms if policy.stats(a).tried] == [arm]


@pytest.mark.parametrize("policy", [DiscountedUCB(**SMALL), DiscountedThompson(**SMALL)])
def test_each_arm_is_tried_once_first_nearest_first(policy: Bandit) -> None:
    decisions = drive(policy, [TABLE_A] * 18)  # six arms, three ticks each
    in_force = [arm_of(d) for d in [Decision(0.0, 8), *decisions[:17]]]
    assert Counter(in_force) == dict.fromkeys(TABLE_A, 3)
    # nearest untried first: same cap, then the next cap at the same window
    assert in_force[::3] == [(0.0, 8), (5.0, 8), (5.0, 32), (0.0, 32), (0.0, 64), (5.0, 64)]
    assert [d.reason for d in decisions[:17]] == ["bandit.hold"] * 2 + ["bandit.explore"] * 15


# (id, exploration c, expected next decision); after A: 0.8 once, B: 1.0 twice, no discount,
# n = 3: index A = 0.8 + c * sqrt(ln 3 / 1), index B = 1.0 + c * sqrt(ln 3 / 2); equal at c = 0.65
UCB_ROWS = [
    ("no padding: the better mean", 0.0, Decision(0.0, 32, "bandit.exploit")),
    ("small padding", 0.6, Decision(0.0, 32, "bandit.exploit")),
    ("padding wins for the less tried", 0.7, Decision(0.0, 8, "bandit.explore")),
]


@pytest.mark.parametrize(
    ("exploration", "expected"), [r[1:] for r in UCB_ROWS], ids=[r[0] for r in UCB_ROWS]
)
def test_ucb_index(exploration: float, expected: Decision) -> None:
    policy = DiscountedUCB(
        caps=(8, 32), windows_ms=(0,), discount=1.0, dwell_ticks=1, exploration=exploration
    )
    policy.decide(observe(Decision(0.0, 8), goodput_rps=90.0))  # 0.9 - 0.1 = 0.8
    policy.decide(observe(Decision(0.0, 32)))  # 1.0
    assert policy.decide(observe(Decision(0.0, 32))) == expected


@pytest.mark.parametrize("policy", [DiscountedUCB(**SMALL), DiscountedThompson(**SMALL)])
def test_reset_keeps_statistics_and_starts_from_the_current_arm(policy: Bandit) -> None:
    drive(policy, [TABLE_A] * 60)
    learnt = {arm: policy.stats(arm) for arm in policy.arms}
    policy.reset(Decision(1.0, 60))  # off the grid: the nearest arm is (0, 64)
    idle = observe(Decision(1.0, 60), throughput_rps=0.0)
    assert policy.decide(idle) == Decision(0.0, 64, "bandit.hold")
    assert {arm: policy.stats(arm) for arm in policy.arms} == learnt
    held = drive(policy, [TABLE_A] * 3, start=Decision(0.0, 64))
    assert [d.reason for d in held] == ["bandit.hold", "bandit.hold", "bandit.exploit"]
    assert arm_of(held[-1]) == (5.0, 32)


# --- learning ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "policy",
    [DiscountedUCB(**SMALL), DiscountedThompson(seed=0, **SMALL)],
    ids=["ucb", "thompson"],
)
def test_converges_to_the_best_arm_of_a_stationary_table(policy: Bandit) -> None:
    decisions = drive(policy, [TABLE_A] * 400)
    last = Counter(arm_of(d) for d in decisions[-100:])
    assert last.most_common(1)[0][0] == (5.0, 32)
    assert last[(5.0, 32)] >= 90


def ticks_to_new_best(decisions: Sequence[Decision], switch: int) -> int:
    """Ticks after ``switch`` until the new best arm is chosen as the best (exploited)."""
    return next(
        tick - switch
        for tick in range(switch, len(decisions))
        if arm_of(decisions[tick]) == (0.0, 8) and decisions[tick].reason == "bandit.exploit"
    )


@pytest.mark.parametrize(
    "policy",
    [DiscountedUCB(**SMALL), *(DiscountedThompson(seed=seed, **SMALL) for seed in range(4))],
    ids=["ucb", "thompson-0", "thompson-1", "thompson-2", "thompson-3"],
)
def test_discounting_follows_a_switch_of_the_best_arm(policy: Bandit) -> None:
    decisions = drive(policy, [TABLE_A] * 400 + [TABLE_B] * 600)
    assert Counter(arm_of(d) for d in decisions[300:400])[(5.0, 32)] >= 90
    assert ticks_to_new_best(decisions, 400) <= 300
    assert Counter(arm_of(d) for d in decisions[-200:])[(0.0, 8)] >= 180


def test_without_discount_the_switch_is_not_followed_in_as_many_ticks() -> None:
    discounted = drive(DiscountedUCB(**SMALL), [TABLE_A] * 1000 + [TABLE_B] * 300)
    plain = drive(
        DiscountedUCB(discount=1.0, caps=CAPS, windows_ms=WINDOWS),
        [TABLE_A] * 1000 + [TABLE_B] * 300,
    )
    assert ticks_to_new_best(discounted, 1000) <= 300
    assert all(arm_of(d) != (0.0, 8) or d.reason != "bandit.exploit" for d in plain[1000:])


def test_thompson_is_deterministic_for_a_seed() -> None:
    tables = [TABLE_A] * 150 + [TABLE_B] * 150
    first = drive(DiscountedThompson(seed=7, **SMALL), tables)
    again = drive(DiscountedThompson(seed=7, **SMALL), tables)
    other = drive(DiscountedThompson(seed=8, **SMALL), tables)
    assert first == again
    assert first != other


def test_no_slo_rewards_power() -> None:
    policy = DiscountedUCB(caps=(8, 32), windows_ms=(0,), dwell_ticks=1, exploration=0.0)
    # (0, 32): 100 req/s at 5 ms mean; (0, 8): 100 req/s at 10 ms mean -> half the power
    policy.decide(observe(Decision(0.0, 32), slo=None, mean_ms=5.0))
    decision = policy.decide(observe(Decision(0.0, 8), slo=None, mean_ms=10.0))
    assert policy.stats((0.0, 32)).mean == pytest.approx(1.0)
    assert policy.stats((0.0, 8)).mean == pytest.approx(0.5)
    assert decision == Decision(0.0, 32, "bandit.exploit")


# --- the interface and arguments -------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "name"),
    [(DiscountedUCB(), "bandit_ucb"), (DiscountedThompson(), "bandit_thompson")],
)
def test_is_a_named_policy(policy: Bandit, name: str) -> None:
    assert isinstance(policy, Policy)
    assert policy.name == name


def test_the_base_class_has_no_rule() -> None:
    with pytest.raises(TypeError, match="abstract"):
        Bandit()  # type: ignore[abstract]


@pytest.mark.parametrize(
    ("cls", "kwargs", "error", "message"),
    [
        (
            DiscountedUCB,
            {"discount": 0},
            ValueError,
            "DiscountedUCB.discount must be a finite number > 0, got 0",
        ),
        (
            DiscountedUCB,
            {"discount": 1.5},
            ValueError,
            "DiscountedUCB.discount must be in (0, 1], got 1.5",
        ),
        (
            DiscountedThompson,
            {"discount": 2},
            ValueError,
            "DiscountedThompson.discount must be in (0, 1], got 2",
        ),
        (
            DiscountedUCB,
            {"windows_ms": ()},
            ValueError,
            "DiscountedUCB.windows_ms must not be empty",
        ),
        (
            DiscountedUCB,
            {"windows_ms": (0, -1)},
            ValueError,
            "DiscountedUCB.windows_ms must be a finite number >= 0, got -1",
        ),
        (DiscountedUCB, {"caps": ()}, ValueError, "DiscountedUCB.caps must not be empty"),
        (DiscountedUCB, {"caps": (8, 0)}, ValueError, "DiscountedUCB.caps must be >= 1, got 0"),
        (
            DiscountedUCB,
            {"caps": (8.0,)},
            TypeError,
            "DiscountedUCB.caps must be an int, got float",
        ),
        (DiscountedUCB, {"max_caps": 1}, ValueError, "DiscountedUCB.max_caps must be >= 2, got 1"),
        (
            DiscountedUCB,
            {"dwell_ticks": 0},
            ValueError,
            "DiscountedUCB.dwell_ticks must be >= 1, got 0",
        ),
        (
            DiscountedUCB,
            {"dwell_ticks": 2.0},
            TypeError,
            "DiscountedUCB.dwell_ticks must be an int, got float",
        ),
        (
            DiscountedUCB,
            {"miss_penalty": -1},
            ValueError,
            "DiscountedUCB.miss_penalty must be a finite number >= 0, got -1",
        ),
        (
            DiscountedThompson,
            {"violation_penalty": math.inf},
            ValueError,
            "DiscountedThompson.violation_penalty must be a finite number >= 0, got inf",
        ),
        (
            DiscountedUCB,
            {"exploration": -0.1},
            ValueError,
            "DiscountedUCB.exploration must be a finite number >= 0, got -0.1",
        ),
        (
            DiscountedThompson,
            {"sigma": 0},
            ValueError,
            "DiscountedThompson.sigma must be a finite number > 0, got 0",
        ),
        (
            DiscountedThompson,
            {"prior_mean": 2},
            ValueError,
            "DiscountedThompson.prior_mean must be in [0, 1], got 2",
        ),
        (
            DiscountedThompson,
            {"prior_mean": -1},
            ValueError,
            "DiscountedThompson.prior_mean must be a finite number >= 0, got -1",
        ),
    ],
)
def test_invalid_arguments(
    cls: type[Bandit], kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error) as caught:
        cls(**kwargs)
    assert str(caught.value) == message

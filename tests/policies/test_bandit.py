"""Discounted bandits over fractions of the planned window: reward, safe arms, priors,
convergence, forgetting, and the bandits closed-loop on the simulator.

The factory's batcher (tests/control/factories.py): SLO 50 ms (budget 40 ms), service
4 + 0.05 n ms, 1000 req/s: plan cap 256, widest window about 33.9 ms; natural batching at
window 0 forms batches of about 5 (4.25 ms: 0.85 ms a request), the widest window batches of
about 35 (5.75 ms: 0.16 ms a request).
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import numpy as np
import pytest

from adaptive_batcher.control.types import Decision, Observation
from adaptive_batcher.policies import Bandit, DiscountedThompson, DiscountedUCB
from adaptive_batcher.policies.bandit import ArmStats, tick_reward
from adaptive_batcher.sim.service import Noisy, TableService
from adaptive_batcher.sim.simulator import SimConfig, Simulator
from adaptive_batcher.sim.workloads import Poisson
from adaptive_batcher.slo import SLO
from tests.control.factories import observe

WIDEST_MS = 33.9  # see the module docstring


def at(arm: float, **kwargs: Any) -> Observation:
    """A tick played at ``arm`` of the widest window (its device cost: the planned one)."""
    window = arm * WIDEST_MS
    n = 1.0 + max(window, 4.0 + 0.05 * (1.0 + window))
    cost = (4.0 + 0.05 * round(n)) / n
    defaults: dict[str, Any] = {"current": Decision(window, 256), "device_ms_per_request": cost}
    return observe(**{**defaults, **kwargs})


# --- the reward ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "reference_ms", "expected"),
    [
        ({"device_ms_per_request": 0.2}, 0.8, 0.75),  # saved 3/4 of the window-0 cost
        ({"device_ms_per_request": 0.8}, 0.8, 0.0),  # saved nothing
        ({"device_ms_per_request": 1.0}, 0.8, 0.0),  # dearer than window 0: clipped at 0
        ({"device_ms_per_request": 0.2, "goodput_rps": 990.0}, 0.8, 0.75 - 4 * 0.01),  # 1 % late
        ({"device_ms_per_request": 0.2, "goodput_rps": 500.0}, 0.8, 0.0),  # half late
        ({"slo": None, "mean_ms": 5.0}, 400_000.0, 0.5),  # no SLO: power 1000 / 0.005 s
    ],
)
def test_tick_reward(kwargs: dict[str, Any], reference_ms: float, expected: float) -> None:
    assert tick_reward(observe(**kwargs), reference_ms) == pytest.approx(expected)


def test_miss_penalty_weighs_the_late_share() -> None:
    late = observe(device_ms_per_request=0.2, goodput_rps=950.0)  # 5 % late
    assert tick_reward(late, 0.8, miss_penalty=1.0) == pytest.approx(0.70)
    assert tick_reward(late, 0.8, miss_penalty=20.0) == 0.0


# --- safe arms and priors ----------------------------------------------------------------------


@pytest.mark.parametrize("policy", [DiscountedUCB(), DiscountedThompson(seed=3)])
def test_every_decision_stays_inside_the_planned_window_at_the_plan_cap(policy: Bandit) -> None:
    rng = np.random.default_rng(0)
    for _ in range(300):
        rate = float(rng.uniform(200.0, 8000.0))
        decision = policy.decide(at(float(rng.choice(policy.arms)), arrival_rate_rps=rate))
        planned = observe(arrival_rate_rps=rate).plan()
        assert decision.max_batch_size == planned.cap(40.0) == 256
        assert decision.window_ms <= planned.widest_window_ms(40.0, 256) + 1e-9


def test_priors_come_from_the_plan_and_start_at_the_cheapest_arm() -> None:
    policy = DiscountedUCB()
    first = policy.decide(at(0.0))
    assert first.window_ms == pytest.approx(WIDEST_MS, abs=0.2)  # fraction 1: the cheapest
    priors = [policy.stats(arm).mean for arm in policy.arms]
    assert priors == sorted(priors)  # a wider window is predicted to save more
    assert priors[0] == pytest.approx(0.0, abs=0.05)
    assert priors[-1] == pytest.approx(1 - 0.164 / 0.85, abs=0.05)


def test_overload_holds_window_zero_at_the_highest_throughput_cap() -> None:
    policy = DiscountedUCB()
    decision = policy.decide(at(1.0, arrival_rate_rps=40_000.0))
    assert (decision.window_ms, decision.max_batch_size, decision.reason) == (
        0.0,
        256,
        "bandit.overload",
    )
    assert all(policy.stats(arm) == ArmStats() for arm in policy.arms)  # nothing learnt


def test_holds_until_the_service_estimator_is_ready() -> None:
    hold = DiscountedUCB().decide(observe(service_median_ms=lambda n: math.nan))
    assert hold.reason == "bandit.hold"


@pytest.mark.parametrize("kwargs", [{"throughput_rps": 0.0}, {"device_ms_per_request": math.nan}])
def test_a_tick_without_information_is_not_credited(kwargs: dict[str, Any]) -> None:
    policy = DiscountedUCB(dwell_ticks=1)
    policy.decide(at(1.0))
    before = {arm: policy.stats(arm) for arm in policy.arms}
    policy.decide(at(1.0, **kwargs))
    assert {arm: policy.stats(arm) for arm in policy.arms} == before


def test_counts_and_sums_are_discounted_every_informative_tick() -> None:
    policy = DiscountedUCB(discount=0.5, dwell_ticks=10, prior_weight=0.0, fractions=(1.0,))
    policy.decide(at(1.0))  # chooses the only arm, nothing to credit yet
    policy.decide(at(1.0, device_ms_per_request=0.4, goodput_rps=1000.0))
    policy.decide(at(1.0, throughput_rps=0.0))  # no information: no decay
    policy.decide(at(1.0, device_ms_per_request=0.2))
    reference = 4.25 / 5.25  # the plan's window-0 cost: batches of 5.25, 4.25 ms
    first, second = 1 - 0.4 / reference, 1 - 0.2 / reference
    assert policy.stats(1.0).count == pytest.approx(0.5 + 1.0)
    assert policy.stats(1.0).total == pytest.approx(0.5 * first + second, abs=0.01)


# --- learning: a cost table, and one that changes ----------------------------------------------


def play(policy: Bandit, table: dict[float, float], ticks: int) -> list[float]:
    """Each tick the arm in force costs ``table[arm]`` ms a request, all on time."""
    arms, current = [], 1.0
    for _ in range(ticks):
        decision = policy.decide(at(current, device_ms_per_request=table[current]))
        current = min(policy.arms, key=lambda arm: abs(arm * WIDEST_MS - decision.window_ms))
        arms.append(current)
    return arms


@pytest.mark.parametrize("make", [DiscountedUCB, lambda: DiscountedThompson(seed=1)])
def test_settles_on_the_cheapest_arm_when_the_model_was_wrong(make: Any) -> None:
    """The plan predicts the widest window is cheapest; here 0.5 is (say the device
    thrashes on larger batches): the bandit must find it from the measured cost."""
    table = {0.0: 0.8, 0.25: 0.5, 0.5: 0.2, 0.75: 0.6, 1.0: 0.7}
    arms = play(make(), table, 300)
    assert Counter(arms[-100:]).most_common(1)[0][0] == 0.5


@pytest.mark.parametrize("make", [DiscountedUCB, lambda: DiscountedThompson(seed=2)])
def test_relearns_when_the_costs_change(make: Any) -> None:
    policy = make()
    play(policy, {0.0: 0.8, 0.25: 0.5, 0.5: 0.2, 0.75: 0.6, 1.0: 0.7}, 200)
    later = play(policy, {0.0: 0.8, 0.25: 0.7, 0.5: 0.7, 0.75: 0.6, 1.0: 0.15}, 400)
    assert Counter(later[-100:]).most_common(1)[0][0] == 1.0


def test_late_answers_outweigh_savings() -> None:
    """An arm that saves the most but answers 5 % late must lose to one that is on time."""
    policy = DiscountedUCB()
    current = 1.0
    chosen = []
    for _ in range(200):
        late = current == 1.0
        kwargs = {"goodput_rps": 950.0} if late else {}
        decision = policy.decide(at(current, **kwargs))
        current = min(policy.arms, key=lambda arm: abs(arm * WIDEST_MS - decision.window_ms))
        chosen.append(current)
    assert Counter(chosen[-60:])[1.0] < 10


# --- closed loop on the simulator --------------------------------------------------------------


@pytest.mark.parametrize("make", [DiscountedUCB, lambda: DiscountedThompson(seed=0)])
def test_bandits_are_safe_to_run(make: Any) -> None:
    """resnet50 on an H200 at 30 % of capacity for 20 s: no shedding, every answer within the
    SLO, and device cost near what the widest planned window gives (the first generation shed
    18-28 % here while exploring)."""
    table = TableService.from_h200("resnet50")
    arrivals = Poisson(4600.0).generate(20.0, np.random.default_rng(4))
    seed = tuple((n, table.service_s(n, np.random.default_rng(0)) * 1e3) for n in (1, 32, 256))
    config = SimConfig(
        512, 0.0, slo=SLO(latency_ms=50.0), policy=make(), shed_late=True, service_profile=seed
    )
    result = Simulator(Noisy(table, cv=0.05), config).run(arrivals)
    static = Simulator(Noisy(table, cv=0.05), SimConfig(512, 0.0)).run(arrivals)
    assert result.expired == 0
    assert result.slo_attainment == 1.0
    assert result.device_ms_per_request < 0.5 * static.device_ms_per_request


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"discount": 0.0}, "DiscountedUCB.discount must be a finite number > 0"),
        ({"discount": 1.5}, "DiscountedUCB.discount must be in"),
        ({"fractions": ()}, "DiscountedUCB.fractions must not be empty"),
        ({"fractions": (0.5, 1.5)}, "DiscountedUCB.fractions must be in"),
        ({"dwell_ticks": 0}, "DiscountedUCB.dwell_ticks must be >= 1"),
        ({"prior_weight": -1.0}, "DiscountedUCB.prior_weight must be a finite number >= 0"),
        ({"exploration": -1.0}, "DiscountedUCB.exploration must be a finite number >= 0"),
    ],
)
def test_validation(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DiscountedUCB(**kwargs)


def test_thompson_validation() -> None:
    with pytest.raises(ValueError, match=r"DiscountedThompson\.sigma must be a finite number > 0"):
        DiscountedThompson(sigma=0.0)

"""N replicas behind a router: one replica replays as the simulator does; routers; totals."""

from __future__ import annotations

import numpy as np
import pytest

from adaptive_batcher.sim.cluster import (
    ClusterResult,
    ClusterSimulator,
    PowerOfTwoChoices,
    RoundRobin,
    replicas_for_slo,
)
from adaptive_batcher.sim.result import Outcome
from adaptive_batcher.sim.scenarios import CAPACITY, CONTENDERS, SCENARIOS
from adaptive_batcher.sim.service import TableService
from adaptive_batcher.sim.simulator import SimConfig, Simulator
from adaptive_batcher.sim.workloads import Arrivals, LognormalSizes, Poisson, Steps
from tests.sim.test_pinned_replays import figures

SCENARIO = SCENARIOS["poisson_30"]


def poisson(load: float, seconds: float, seed: int = 1, **kwargs: object) -> Arrivals:
    return Poisson(load * CAPACITY, **kwargs).generate(seconds, np.random.default_rng(seed))  # type: ignore[arg-type]


def cluster(
    config: SimConfig, replicas: int, router: object = None, seed: int = 1
) -> ClusterSimulator:
    return ClusterSimulator(
        SCENARIO.service(),
        config,
        replicas,
        router,
        seed=seed,
        judge_slo=SCENARIO.slo,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(
    ("config", "arrivals"),
    [
        (SimConfig(128, 2.0), poisson(0.3, 2.0)),
        (
            SimConfig(256, 3.0, max_concurrent_batches=2),
            poisson(0.1, 2.0, sizes=LognormalSizes(3.0, 0.8, 64)),
        ),
        (
            CONTENDERS["adaptive_pid_shed"](SCENARIO),
            Steps((0.3 * CAPACITY, 1.5 * CAPACITY, 0.3 * CAPACITY), 1.0).generate(
                3.0, np.random.default_rng(4)
            ),
        ),
        (SimConfig(256, 1.0, max_queue_size=300, deadline_ms=30.0), poisson(1.3, 1.5)),
    ],
    ids=["static", "sizes_two_slots", "pid_shed_steps", "deadlines_bounded_queue"],
)
def test_one_replica_replays_exactly_as_the_simulator(
    config: SimConfig, arrivals: Arrivals
) -> None:
    alone = Simulator(SCENARIO.service(), config, seed=1, judge_slo=SCENARIO.slo).run(arrivals)
    behind_a_router = cluster(config, 1, RoundRobin()).run(arrivals)
    assert figures(behind_a_router.replicas[0]) == figures(alone)
    total = figures(behind_a_router.total)
    assert {
        k: total[k]
        for k in (
            "requests",
            "completed",
            "expired",
            "rejected",
            "p99_ms",
            "device_busy_s",
            "requests_sha",
        )
    } == {
        k: figures(alone)[k]
        for k in (
            "requests",
            "completed",
            "expired",
            "rejected",
            "p99_ms",
            "device_busy_s",
            "requests_sha",
        )
    }


def test_round_robin_takes_replicas_in_turn() -> None:
    result = cluster(SimConfig(64, 2.0), 3, RoundRobin()).run(poisson(0.5, 0.5))
    assert np.array_equal(result.assigned, np.arange(result.total.requests) % 3)
    assert [r.requests for r in result.replicas] == [
        int(np.count_nonzero(result.assigned == i)) for i in range(3)
    ]


def test_power_of_two_never_takes_the_more_loaded_of_its_pair() -> None:
    router, rng = PowerOfTwoChoices(), np.random.default_rng(0)
    assert {router.choose([0, 100], rng) for _ in range(50)} == {0}
    picks = [router.choose([5, 0, 5, 5], rng) for _ in range(400)]
    assert picks.count(1) > 150  # in every pair that holds it (half of them), never otherwise...
    loads = [3, 1, 2]
    assert 0 not in {
        router.choose(loads, rng) for _ in range(200)
    }  # the most loaded loses every pair
    assert router.choose([7], rng) == 0


def test_the_total_adds_up_the_replicas() -> None:
    result = cluster(CONTENDERS["adaptive_pid_shed"](SCENARIO), 2).run(poisson(1.8, 2.0))
    total = result.total
    assert total.requests == sum(r.requests for r in result.replicas) == len(result.assigned)
    assert total.completed == sum(r.completed for r in result.replicas)
    assert total.expired == sum(r.expired for r in result.replicas)
    assert total.device_busy_s == pytest.approx(sum(r.device_busy_s for r in result.replicas))
    assert not np.any(total.outcome == Outcome.PENDING)
    for replica, own in enumerate(result.replicas):  # each request's end is its replica's
        mine = np.flatnonzero(result.assigned == replica)
        assert np.array_equal(total.done_s[mine], own.done_s)


def test_a_second_replica_rescues_an_overloaded_one() -> None:
    """1.8x one device's capacity: one replica sheds or misses; two meet the SLO."""
    arrivals = poisson(1.8, 3.0)
    needed, tried = replicas_for_slo(
        lambda n: cluster(CONTENDERS["adaptive_pid_shed"](SCENARIO), n).run(arrivals),
        attainment=0.99,
        max_replicas=4,
    )
    assert needed == 2
    assert [r.replica_count for r in tried] == [1, 2]
    assert tried[0].total.slo_attainment < 0.9 <= 0.99 <= tried[1].total.slo_attainment


def test_replicas_for_slo_says_none_when_the_target_is_out_of_reach() -> None:
    calls: list[int] = []

    def run_with(n: int) -> ClusterResult:
        calls.append(n)
        return cluster(SimConfig(512, 0.0), n).run(poisson(3.0, 1.0))

    needed, tried = replicas_for_slo(run_with, max_replicas=2)
    assert needed is None and calls == [1, 2] and len(tried) == 2


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"attainment": 0.0}, ValueError, r"attainment must be a number in \(0, 1\]"),
        ({"attainment": 1.5}, ValueError, r"attainment must be a number in \(0, 1\]"),
        ({"attainment": -0.5}, ValueError, r"attainment must be a number in \(0, 1\]"),
        ({"max_replicas": 0}, ValueError, "max_replicas"),
    ],
)
def test_replicas_for_slo_checks_its_arguments(
    kwargs: dict[str, float], error: type, message: str
) -> None:
    with pytest.raises(error, match=message):
        replicas_for_slo(lambda n: cluster(SimConfig(8, 0.0), n).run(poisson(0.1, 0.1)), **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(("replicas", "error"), [(0, ValueError), (1.5, TypeError)])
def test_replica_count_is_checked(replicas: object, error: type) -> None:
    with pytest.raises(error, match="replicas"):
        cluster(SimConfig(8, 0.0), replicas)  # type: ignore[arg-type]


def test_adaptive_replicas_keep_batches_full_as_replicas_are_added() -> None:
    """What per-replica controllers do together: spread over more replicas, a static window-0
    batcher's batches shrink and its device time per request grows with N, while the
    controllers widen their windows within the SLO and keep the cost per request nearly flat."""
    arrivals = poisson(1.8, 3.0)
    cost: dict[str, list[float]] = {}
    for name in ("triton_like", "adaptive_pid_shed"):
        config = CONTENDERS[name](SCENARIO)
        cost[name] = [cluster(config, n).run(arrivals).total.device_ms_per_request for n in (2, 4)]
    static_growth = cost["triton_like"][1] / cost["triton_like"][0]
    adaptive_growth = cost["adaptive_pid_shed"][1] / cost["adaptive_pid_shed"][0]
    assert adaptive_growth < 1.15 < 1.5 < static_growth


def test_a_cluster_replays_the_same_however_often_it_runs() -> None:
    """Each run starts from a copy of the router: round-robin begins at replica 0 every time."""
    simulator = cluster(SimConfig(64, 2.0), 3, RoundRobin())
    first, second = simulator.run(poisson(0.5, 0.2)), simulator.run(poisson(0.5, 0.2))
    assert np.array_equal(first.assigned, second.assigned)
    assert np.array_equal(first.total.done_s, second.total.done_s)


def test_replicas_for_slo_refuses_replays_without_an_slo() -> None:
    def run_with(n: int) -> ClusterResult:
        return ClusterSimulator(SCENARIO.service(), SimConfig(64, 2.0), n).run(poisson(0.5, 0.1))

    with pytest.raises(ValueError, match="needs an SLO attainment"):
        replicas_for_slo(run_with, max_replicas=2)


@pytest.mark.parametrize(("seed", "error"), [(-1, ValueError), (1.5, TypeError), (None, TypeError)])
def test_the_seed_is_checked_when_the_simulator_is_built(seed: object, error: type) -> None:
    with pytest.raises(error, match="seed"):
        cluster(SimConfig(8, 0.0), 2, seed=seed)  # type: ignore[arg-type]
    with pytest.raises(error, match="seed"):
        Simulator(SCENARIO.service(), SimConfig(8, 0.0), seed=seed)  # type: ignore[arg-type]


def test_cluster_arguments_of_the_wrong_type_are_refused() -> None:
    service, config = SCENARIO.service(), SimConfig(8, 0.0)
    with pytest.raises(TypeError, match="config must be a SimConfig"):
        ClusterSimulator(service, "static", 2)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="router must have a choose"):
        ClusterSimulator(service, config, 2, "round_robin")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="arrivals must be Arrivals"):
        ClusterSimulator(service, config, 2).run([0.0])  # type: ignore[arg-type]


class _Wayward:
    """A custom router that answers with an index no replica has."""

    name = "wayward"

    def choose(self, outstanding_units: list[int], rng: np.random.Generator) -> int:
        return 99


def test_a_router_choice_that_is_no_replica_is_a_clear_error() -> None:
    """Before: IndexError from inside the run."""
    simulator = ClusterSimulator(SCENARIO.service(), SimConfig(8, 0.0), 2, _Wayward())
    message = r"router _Wayward chose 99: not a replica index in 0\.\.1"
    with pytest.raises(ValueError, match=message):
        simulator.run(poisson(0.1, 0.05))


class _Yes(_Wayward):
    def choose(self, outstanding_units: list[int], rng: np.random.Generator) -> int:
        return True


class _Nameless:
    def choose(self, outstanding_units: list[int], rng: np.random.Generator) -> int:
        return 0


def test_a_bool_is_no_replica_index_and_a_router_needs_a_name() -> None:
    """Before: True served as replica 1; a router without a name failed after the whole run."""
    simulator = ClusterSimulator(SCENARIO.service(), SimConfig(8, 0.0), 2, _Yes())
    with pytest.raises(ValueError, match="router _Yes chose True"):
        simulator.run(poisson(0.1, 0.05))
    with pytest.raises(TypeError, match=r"and a name \(str\), got _Nameless"):
        ClusterSimulator(SCENARIO.service(), SimConfig(8, 0.0), 2, _Nameless())  # type: ignore[arg-type]


def test_classes_given_for_instances_are_refused_at_once() -> None:
    """Before: accepted, then a missing-argument TypeError from inside the first run."""
    with pytest.raises(TypeError, match=r"router must be an instance \(RoundRobin\(\)\)"):
        ClusterSimulator(SCENARIO.service(), SimConfig(8, 0.0), 2, RoundRobin)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="service must be an instance of TableService"):
        Simulator(TableService, SimConfig(8, 0.0))  # type: ignore[arg-type]

"""How many replicas an SLO needs, and what they cost, behind two routers (simulated).

Traffic beyond one device (resnet50 on the H200 table, SLO p99 50 ms): Poisson at 2.5x one
replica's capacity, and a sinusoid of mean 2.5x +-60 % (period 10 s). For each batcher and router,
:func:`~adaptive_batcher.sim.cluster.replicas_for_slo` finds the fewest replicas that answer 99 %
of the requests within the SLO; the table gives, at that count and at one replica more, the SLO
attainment, p99, mean batch and device time per request (the cost of serving the trace). Replay
figures are deterministic (same seeds, same results); only the wall time depends on the machine.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from adaptive_batcher.sim.cluster import (
    ClusterResult,
    ClusterSimulator,
    PowerOfTwoChoices,
    RoundRobin,
    Router,
    replicas_for_slo,
)
from adaptive_batcher.sim.result import Outcome
from adaptive_batcher.sim.scenarios import CAPACITY, CONTENDERS, SCENARIOS
from adaptive_batcher.sim.workloads import Arrivals, Diurnal, Poisson
from benchmarks.conftest import report_lines

SCENARIO = SCENARIOS["poisson_30"]  # the device and SLO
SECONDS = 10.0
WORKLOADS: dict[str, Arrivals] = {
    "poisson_250": Poisson(2.5 * CAPACITY).generate(SECONDS, np.random.default_rng(11)),
    "diurnal_250": Diurnal(2.5 * CAPACITY, 0.6, 10.0).generate(SECONDS, np.random.default_rng(12)),
}
BATCHERS = ("triton_like", "ray_serve_defaults", "adaptive_pid_shed")
ROUTERS: dict[str, type[Router]] = {"round_robin": RoundRobin, "power_of_two": PowerOfTwoChoices}
ROWS: list[str] = []


def _run(batcher: str, router: str, arrivals: Arrivals, replicas: int) -> ClusterResult:
    config = CONTENDERS[batcher](SCENARIO)
    cluster = ClusterSimulator(
        SCENARIO.service(), config, replicas, ROUTERS[router](), seed=1, judge_slo=SCENARIO.slo
    )
    return cluster.run(arrivals)


def _cells(result: ClusterResult) -> str:
    total = result.total
    return (
        f"{total.slo_attainment:.4f} | {total.p99_ms:.1f} | {total.mean_batch_size:.0f} | "
        f"{total.device_ms_per_request:.4f}"
    )


@pytest.mark.parametrize("router", sorted(ROUTERS))
@pytest.mark.parametrize("batcher", BATCHERS)
@pytest.mark.parametrize("workload", sorted(WORKLOADS))
def test_replicas_an_slo_needs(benchmark: Any, workload: str, batcher: str, router: str) -> None:
    arrivals = WORKLOADS[workload]
    found: list[tuple[int | None, list[ClusterResult]]] = []
    benchmark.pedantic(
        lambda: found.append(
            replicas_for_slo(lambda n: _run(batcher, router, arrivals, n), max_replicas=8)
        ),
        rounds=1,
    )
    needed, tried = found[0]
    for result in tried:  # every request ended: answered, shed, refused or failed
        assert not np.any(result.total.outcome == Outcome.PENDING)
        assert result.total.requests == len(arrivals)
    if needed is None:
        ROWS.append(f"| {workload} | {batcher} | {router} | > 8 | {_cells(tried[-1])} | |")
        return
    more = _run(batcher, router, arrivals, needed + 1)
    ROWS.append(
        f"| {workload} | {batcher} | {router} | {needed} | {_cells(tried[-1])} | {_cells(more)} |"
    )
    benchmark.extra_info.update(
        replicas=needed,
        attainment=tried[-1].total.slo_attainment,
        device_ms_per_request=tried[-1].total.device_ms_per_request,
        device_ms_per_request_one_more=more.total.device_ms_per_request,
    )
    report_lines(
        "cluster_replicas_for_slo",
        [
            "| workload | batcher | router | replicas for 99 % | attainment | p99 ms | "
            "mean batch | device ms/req | with one more: attainment | p99 ms | mean batch | "
            "device ms/req |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
            *ROWS,
        ],
    )

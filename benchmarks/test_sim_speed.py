"""How fast the simulator replays: one hour of Poisson traffic at 1000 req/s (3.6 M requests).

Reported as wall-clock seconds per simulated hour and simulated requests per second, for a
static batcher (engine only) and the adaptive one (engine + controller + shedding). Target
(issue 11 item 7): at most 10 s per simulated hour for the adaptive one.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from adaptive_batcher.sim.scenarios import CONTENDERS, SCENARIOS, run
from adaptive_batcher.sim.workloads import Poisson
from benchmarks.conftest import report

HOUR = Poisson(1000.0).generate(3600.0, np.random.default_rng(0))


@pytest.mark.parametrize("contender", ["triton_like", "adaptive_pid_shed"])
def test_one_hour_replay(benchmark: Any, contender: str) -> None:
    # the poisson_30 device, SLO and warm-up (the adaptive contender starts from the warm-up)
    scenario = replace(
        SCENARIOS["poisson_30"],
        name="hour",
        description="one hour at 1000 req/s",
        arrivals=lambda seed: HOUR,
    )
    results: list[Any] = []
    benchmark.pedantic(
        lambda: results.append(run(scenario, CONTENDERS[contender](scenario))), rounds=1
    )
    seconds = benchmark.stats.stats.max
    benchmark.extra_info["simulated_requests_per_s"] = len(HOUR) / seconds
    report("sim_seconds_per_simulated_hour", contender, seconds, "s")
    assert results[0].completed == len(HOUR)

"""The static grid searched in hindsight (the replay's reference settings)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from adaptive_batcher.control.guards import ShedGuard
from adaptive_batcher.policies import AIMD
from adaptive_batcher.sim.scenarios import (
    CONTENDERS,
    SCENARIOS,
    Scenario,
    best_static,
    cost_oracle,
    make_scenarios,
    run,
    sheds,
    static_grid,
)
from adaptive_batcher.sim.service import TableService
from adaptive_batcher.sim.simulator import SimConfig
from adaptive_batcher.sim.workloads import Poisson
from adaptive_batcher.slo import SLO


def _short(rate_rps: float, slo: SLO | None = None) -> Scenario:
    base = SCENARIOS["poisson_30"]
    if slo is not None:
        base = make_scenarios(TableService.from_h200("resnet50"), slo)["poisson_30"]
    return replace(
        base, arrivals=lambda seed: Poisson(rate_rps).generate(1.0, np.random.default_rng(seed))
    )


def test_with_shedding_a_cap_that_leaves_no_time_is_left_out() -> None:
    # SLO 20 ms: 1.1 x resnet50's batch of 512 (~33 ms) leaves nothing, 128 (~9 ms) leaves time
    scenario = _short(2000.0, SLO(20.0))
    runs = static_grid(scenario, shed=True, windows_ms=(0.0, 5.0), caps=(128, 512))
    assert [(r.cap, r.window_ms) for r in runs] == [(128, 0.0), (128, 5.0)]
    assert all(r.shed for r in runs)
    assert best_static(runs).result.slo_attainment > 0.9


def test_cost_oracle_is_the_cheapest_setting_that_meets_the_slo() -> None:
    runs = static_grid(_short(3000.0), windows_ms=(0.0, 20.0), caps=(16, 256))
    oracle = cost_oracle(runs)
    assert oracle is not None
    meeting = [r for r in runs if r.result.slo_attainment >= 0.99]
    assert oracle.result.device_ms_per_request == min(
        r.result.device_ms_per_request for r in meeting
    )
    assert oracle.window_ms == 20.0  # the wider window fills batches: less device time each


def test_the_shedding_contenders_are_told_apart_by_their_configuration() -> None:
    scenario = SCENARIOS["poisson_30"]
    shedding = {name for name, make in CONTENDERS.items() if sheds(make(scenario))}
    # bentoml_cork sheds by itself (its policy sets shed_after_ms), with no guard; Clipper's
    # AIMD, Triton, Ray Serve and TorchServe serve every request however late
    assert shedding == {
        "adaptive_pid_shed",
        "bandit_ucb_shed",
        "bandit_thompson_shed",
        "bentoml_cork",
    }
    assert sheds(SimConfig(64, 0.0, deadline_ms=40.0))  # a static setting with shedding


def test_a_policy_that_declares_it_sheds_is_a_shedding_contender() -> None:
    class Shedding(AIMD):
        sheds = True

    slo = SLO(50.0)
    assert sheds(SimConfig(64, 0.0, slo=slo, policy=Shedding(), guards=[]))
    assert not sheds(SimConfig(64, 0.0, slo=slo, policy=AIMD(), guards=[]))
    assert sheds(SimConfig(64, 0.0, slo=slo, policy=AIMD(), guards=[ShedGuard]))


def test_the_cork_baseline_sheds_in_a_replay() -> None:
    # what its "sheds" declaration stands for: under overload it fails late requests itself
    scenario = _short(30000.0)
    result = run(scenario, CONTENDERS["bentoml_cork"](scenario))
    assert result.expired > 0

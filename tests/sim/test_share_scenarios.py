"""Scenarios where one batch takes a large share of the SLO (issue 27), and the adaptive
contenders' window range, which follows the SLO."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from adaptive_batcher.sim.scenarios import CONTENDERS, SCENARIOS, run, share_scenarios
from adaptive_batcher.sim.service import TableService


def test_share_scenarios_cover_slow_models_tight_slos_and_noise() -> None:
    names = set(share_scenarios())
    assert {
        "llama_1b_decode_slo200_poisson_30",
        "llama_1b_prefill_slo1000_azure_conv_60",
        "resnet50_slo20_poisson_90",
        "resnet50_slo50_noise_30_at_30",
        "resnet50_slo50_stalls_at_30",
    } <= names


def test_the_trace_is_compressed_to_the_scenarios_rate() -> None:
    case = share_scenarios()["llama_1b_prefill_slo1000_azure_conv_60"]
    arrivals = case.arrivals(0)
    assert len(arrivals) == 19_366  # the whole trace, burst structure kept
    assert arrivals.rate_rps == pytest.approx(212.9, rel=1e-3)  # 60 % of 355 req/s
    assert arrivals.name == "azure_llm_2023_conv x38"


@pytest.mark.parametrize(("name", "window_ms"), [("llama_1b_decode_slo200_poisson_30", 200.0)])
def test_the_adaptive_contenders_may_wait_up_to_the_slo(name: str, window_ms: float) -> None:
    """Before, their windows stopped at 50 ms whatever the SLO: on a 50 ms decode step under
    200 ms the controller waited no longer than a batch, like window 0 (1.9x the cost
    oracle's device time; the oracle waits 100 ms)."""
    config = CONTENDERS["adaptive_pid"](share_scenarios()[name])
    assert config.controller_bounds.max_window_ms == window_ms
    resnet = CONTENDERS["adaptive_pid"](SCENARIOS["poisson_30"])
    assert resnet.controller_bounds.max_window_ms == 50.0  # the suite's, unchanged


def test_the_measured_tail_and_the_plan_both_meet_the_target() -> None:
    """resnet50 at an SLO of 20 ms, 90 % load: the plan's old bound (a sum of error bars) kept
    the p99 well under the aim (1.19x the cost oracle's device time when the aim was 16 ms);
    the window follows the room the measured tail leaves, up to the aim (two batches of one,
    7.4 ms, are 37 % of the SLO and exempt 0.37**2 of the 4 ms reserve: 16.5 ms) and not past
    the SLO; and the plan's own tail, a request's p99, now lands there without the slack."""
    case = share_scenarios()["resnet50_slo20_poisson_90"]
    one_ms = 1e3 * TableService.from_h200("resnet50").service_s(1, np.random.default_rng(0))
    share = 2 * one_ms / case.slo.latency_ms
    aim_ms = case.slo.target_ms + (1 - case.slo.margin) * case.slo.latency_ms * share**2
    assert 16.4 < aim_ms < 16.7
    result = run(case, CONTENDERS["adaptive_pid"](case))
    assert result.lost == 0
    assert result.slo_attainment >= 0.995
    assert 0.95 * aim_ms <= result.p99_ms <= 1.05 * aim_ms
    plan_alone = run(case, replace(CONTENDERS["adaptive_pid"](case), window_slack=1.0))
    assert plan_alone.slo_attainment >= 0.995
    assert 0.95 * aim_ms <= plan_alone.p99_ms <= 1.05 * aim_ms  # was 0.9x with the old bound
    assert result.device_ms_per_request <= 1.01 * plan_alone.device_ms_per_request

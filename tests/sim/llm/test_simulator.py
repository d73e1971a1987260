"""LLM replays: deterministic, every request ends once, and the gate's closed-loop effect."""

from __future__ import annotations

import numpy as np
import pytest

from adaptive_batcher.llm.controller import TokenController
from adaptive_batcher.llm.laws import ModelLimit, StaticLimit
from adaptive_batcher.llm.slo import TokenSLO
from adaptive_batcher.sim.llm.engine import EngineConfig
from adaptive_batcher.sim.llm.report import LLMCell, comparison_markdown, plot_timeseries
from adaptive_batcher.sim.llm.result import LLMOutcome
from adaptive_batcher.sim.llm.simulator import LLMContender, LLMSimulator
from adaptive_batcher.sim.llm.step_time import ClosedFormFit, Deployment
from adaptive_batcher.sim.llm.workloads import IndependentLengths, TokenArrivals, token_workload
from adaptive_batcher.sim.workloads import LognormalSizes, Poisson

SLO = TokenSLO(ttft_ms=300, tpot_ms=50)
# a small device: 5 ms a step and 1 ms per running sequence; prefill 0.05 ms a token
DEVICE = Deployment("tiny", ClosedFormFit("tiny", (5.0, 0.05, 0.0), (5.0, 0.0, 1.0)), 40_000)
ENGINE = EngineConfig(kv_blocks=2500, max_num_seqs=256, max_num_batched_tokens=2048)


def arrivals(rate: float, seconds: float = 20.0, seed: int = 0) -> TokenArrivals:
    lengths = IndependentLengths(LognormalSizes(200, 0.5, 1000), LognormalSizes(30, 0.5, 200))
    return token_workload(Poisson(rate), lengths, seconds, np.random.default_rng(seed))


def run(contender: LLMContender, work: TokenArrivals, seed: int = 0):  # type: ignore[no-untyped-def]
    return LLMSimulator(DEVICE, contender, SLO, seed=seed, noise_sigma=0.05, grace_s=30.0).run(work)


def static(limit: int) -> LLMContender:
    return LLMContender(
        f"static_{limit}",
        ENGINE,
        lambda: TokenController(SLO, StaticLimit(limit), initial_limit=limit),
    )


def test_the_same_inputs_give_the_same_result_and_the_seed_matters() -> None:
    work = arrivals(30.0)
    ours = LLMContender("ours", ENGINE, lambda: TokenController(SLO, ModelLimit(SLO, maximum=256)))
    first, again, other = run(ours, work), run(ours, work), run(ours, work, seed=1)
    assert np.array_equal(first.done_s, again.done_s, equal_nan=True)
    assert np.array_equal(first.outcome, again.outcome) and first.summary() == again.summary()
    assert not np.array_equal(first.done_s, other.done_s, equal_nan=True)


def test_every_request_ends_once_with_consistent_times() -> None:
    work = arrivals(60.0)
    result = run(static(16), work)
    outcomes = result.outcome
    assert np.count_nonzero(outcomes == LLMOutcome.UNFINISHED) == 0
    completed = result.completed_mask
    assert np.all(result.first_token_s[completed] >= result.admitted_s[completed])
    assert np.all(result.admitted_s[completed] >= result.arrival_s[completed])
    assert np.all(result.done_s[completed] >= result.first_token_s[completed])
    refused = (outcomes == LLMOutcome.REJECTED) | (outcomes == LLMOutcome.EXPIRED)
    assert np.all(np.isnan(result.first_token_s[refused]))
    total = sum(result.count(code) for code in range(6))
    assert total == result.requests == len(work)


def test_under_overload_a_gate_keeps_admitted_requests_within_the_slo() -> None:
    work = arrivals(80.0)  # far beyond what 5 ms + 1 ms a sequence sustains at 50 ms a token
    bare = run(LLMContender("vllm_defaults", ENGINE), work)
    gated = run(static(24), work)
    assert bare.tpot_ms(0.99) > SLO.tpot_ms and bare.attainment < 0.2
    assert gated.tpot_ms(0.99) <= SLO.tpot_ms and gated.ttft_ms(0.99) <= SLO.ttft_ms
    assert gated.goodput_rps > 3 * bare.goodput_rps and gated.rejected_fraction > 0.2


def test_at_light_load_the_gate_changes_nothing() -> None:
    work = arrivals(5.0)
    bare = run(LLMContender("vllm_defaults", ENGINE), work)
    ours = run(
        LLMContender("ours", ENGINE, lambda: TokenController(SLO, ModelLimit(SLO, maximum=256))),
        work,
    )
    assert ours.rejected_fraction == 0.0
    assert np.array_equal(bare.done_s, ours.done_s, equal_nan=True)


def test_the_trtllm_tuner_sets_the_engine_caps() -> None:
    work = arrivals(20.0, seconds=5.0)
    tuned = run(LLMContender("trtllm_tuner", ENGINE, trtllm_tuner=True), work)
    assert tuned.count(LLMOutcome.COMPLETED) == len(work)


def test_the_report_table_and_plot(tmp_path) -> None:  # type: ignore[no-untyped-def]
    work = arrivals(40.0, seconds=5.0)
    cells = [
        LLMCell("s", "vllm_defaults", run(LLMContender("vllm_defaults", ENGINE), work)),
        LLMCell("s", "static_gate_best", run(static(24), work), "limit 24"),
    ]
    table = comparison_markdown(cells)
    assert table.count("\n") == 4 and "| s | static_gate_best |" in table and "limit 24" in table
    path = plot_timeseries(
        {c.contender: c.result for c in cells},
        tmp_path / "p.png",
        ttft_ms=300,
        tpot_ms=50,
        title="s",
    )
    assert path.stat().st_size > 1000


def test_a_contender_needs_a_name() -> None:
    with pytest.raises(TypeError, match=r"^LLMContender.name must be a str, got int$"):
        LLMContender(3, ENGINE)  # type: ignore[arg-type]

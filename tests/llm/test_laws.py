"""Limit laws: a decision for a given observation."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from adaptive_batcher.llm.laws import AIMDLimit, LimitLaw, ModelLimit, StaticLimit
from adaptive_batcher.llm.signals import EngineMetrics, GateObservation, StepFit
from adaptive_batcher.llm.slo import TokenSLO

SLO = TokenSLO(ttft_ms=300, tpot_ms=50)
FIT = StepFit(
    base_s=0.006, per_seq_s=0.0, per_ktoken_s=0.00004, per_prefill_ktoken_s=0.025, samples=500
)


def observation(**changes: object) -> GateObservation:
    base = GateObservation(
        now_s=10.0,
        limit=100,
        in_flight=100,
        waiting=5,
        departure_rps=20.0,
        residence_s=5.0,
        arrivals=10,
        arrival_rps=40.0,
        admitted=10,
        rejected=0,
        expired=0,
        finished_misses=(),
        finished_tpot_misses=(),
        in_flight_at_finish=(),
        ttft_p_s=0.2,
        tpot_p_s=0.03,
        engine_ttft_p50_s=0.05,
        engine_ttft_p90_s=0.1,
        recent_finished=100,
        tpot_mean_s=0.02,
        mean_gap_s=math.nan,
        mean_prompt=1000.0,
        mean_output=200.0,
        context_tokens=110_000.0,
        step_fit=FIT,
        ttft_fit=None,
        engine=None,
        preemptions=0,
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def test_static() -> None:
    law = StaticLimit(64)
    assert isinstance(law, LimitLaw) and law.name == "static(64)"
    assert law.decide(observation()) == 64
    with pytest.raises(ValueError, match=r"^limit must be >= 1, got 0$"):
        StaticLimit(0)


def test_aimd_follows_netflix_rule_per_finished_request() -> None:
    law = AIMDLimit(initial=20, backoff=0.9, minimum=1, maximum=25)
    # a success at 2 x in flight >= limit adds one; one below half the limit changes nothing
    obs = observation(finished_misses=(False, False, False), in_flight_at_finish=(10, 9, 12))
    assert law.decide(obs) == 21 + 0 + 1
    obs = observation(finished_misses=(True,), in_flight_at_finish=(30,))
    assert law.decide(obs) == int(22 * 0.9) == 19
    obs = observation(finished_misses=(False,) * 10, in_flight_at_finish=(30,) * 10)
    assert law.decide(obs) == 25  # clamped to the maximum
    tpot_only = AIMDLimit(20, tpot_only=True)
    obs = observation(
        finished_misses=(True,), finished_tpot_misses=(False,), in_flight_at_finish=(15,)
    )
    assert tpot_only.decide(obs) == 21  # a TTFT miss is not its business
    with pytest.raises(ValueError, match=r"^backoff must be a number in \[0.5, 1\), got 1$"):
        AIMDLimit(backoff=1)


def test_the_predicted_gap_counts_the_prefill_admitted_meanwhile() -> None:
    obs = observation(arrival_rps=1000.0)  # arrivals beyond any limit: departures admit
    fixed = 0.006 + 0.00004 * 100 * (1000 + 100) / 1e3
    per_request = 0.025 * 1000 / 1e3  # 25 ms of prefill each
    departures = 100 / 5.0  # residence 5 s
    assert ModelLimit.predicted_gap_s(obs, 100) == pytest.approx(
        fixed / (1 - per_request * departures)
    )
    light = observation(arrival_rps=2.0)  # fewer arrivals than departures: arrivals admit
    assert ModelLimit.predicted_gap_s(light, 100) == pytest.approx(fixed / (1 - per_request * 2))
    flooded = observation(arrival_rps=1000.0, residence_s=math.nan)  # none finished yet
    assert ModelLimit.predicted_gap_s(flooded, 100) == math.inf  # the arrivals' prefill fills it


def test_the_prefill_admitted_at_another_limit_follows_littles_law() -> None:
    # at 100 in flight the limit binds: departures (100 / 5 s) admit. At another limit N the
    # departures are N / (r0 + output * gap(N)), r0 the part of the residence that is not the
    # output's gaps, so a higher limit admits more prefill, but fewer a second than N / 5 s
    obs = observation(arrival_rps=1000.0)
    per_request = 0.025 * 1000 / 1e3

    def fixed(n: int) -> float:
        return 0.006 + 0.00004 * n * (1000 + 100) / 1e3

    now = ModelLimit.predicted_gap_s(obs, 100)
    r0 = 5.0 - 200 * now
    gaps = [ModelLimit.predicted_gap_s(obs, n) for n in (50, 100, 200, 400, 800)]
    assert gaps == sorted(gaps) and math.isfinite(gaps[-1])
    for n, gap in zip((50, 100, 200, 400, 800), gaps, strict=True):
        departures = n / (r0 + 200 * gap)
        assert gap == pytest.approx(fixed(n) / (1 - per_request * departures))
    # with the streams' mean gap measured, r0 is the residence less the output's gaps at it
    measured = observation(arrival_rps=1000.0, mean_gap_s=0.02)
    gap = ModelLimit.predicted_gap_s(measured, 200)
    assert gap == pytest.approx(fixed(200) / (1 - per_request * 200 / (1.0 + 200 * gap)))
    # a fit of zeros (all coefficients may be 0) with the residence all gaps: a gap of 0
    zero = StepFit(
        base_s=0.0, per_seq_s=0.0, per_ktoken_s=0.0, per_prefill_ktoken_s=0.0, samples=500
    )
    idle = observation(step_fit=zero, residence_s=3.0, mean_gap_s=0.02, arrival_rps=10.0)
    assert ModelLimit.predicted_gap_s(idle, 64) == 0.0
    # the arrivals admit where they are fewer than the departures
    light = observation(arrival_rps=2.0)
    assert ModelLimit.predicted_gap_s(light, 400) == pytest.approx(fixed(400) / (1 - 0.05))


def test_model_limit_is_the_largest_limit_within_the_target() -> None:
    law = ModelLimit(SLO, maximum=1024)
    law.margin = 0.6  # the gap target is 30 ms
    law._trim_margin = lambda obs: None  # type: ignore[method-assign]  # hold the margin
    obs = observation(arrival_rps=1000.0)  # the bias stays 1: no measured gap
    limit = law._model_limit(obs)
    assert 10 < limit < 200
    assert (
        ModelLimit.predicted_gap_s(obs, limit) <= 0.030 < ModelLimit.predicted_gap_s(obs, limit + 1)
    )
    light = law._model_limit(observation(arrival_rps=0.5))
    assert light > limit  # few arrivals: their prefill hardly slows the steps


def test_model_limit_steps_are_rate_limited_and_smoothed() -> None:
    law = ModelLimit(SLO, maximum=1024, gain=1.0)
    up = law.decide(observation(limit=100, arrival_rps=0.1, mean_gap_s=0.01, tpot_p_s=0.02))
    assert up == int(100 * 1.25) + 2
    heavy = observation(limit=200, in_flight=200, arrival_rps=1000.0, tpot_p_s=0.03)
    assert law.decide(heavy) == 160  # the model wants far fewer: down by at most 20 % a tick


def test_model_limit_does_not_rise_while_the_tail_is_at_its_aim() -> None:
    law = ModelLimit(SLO, maximum=1024)
    obs = observation(limit=100, arrival_rps=0.1, tpot_p_s=0.046, tpot_mean_s=0.04)
    assert law.decide(obs) <= 100


def test_model_limit_falls_back_to_aimd_on_tpot_misses_without_a_fit() -> None:
    law = ModelLimit(SLO, maximum=1024)
    obs = observation(
        limit=50,
        step_fit=None,
        finished_misses=(True, True),
        finished_tpot_misses=(False, True),
        in_flight_at_finish=(50, 50),
    )
    assert law.decide(obs) == int(51 * 0.9)


def test_the_kv_guard_acts_on_usage_and_preemptions_and_holds_the_limit() -> None:
    law = ModelLimit(SLO, maximum=1024, kv_high=0.9, kv_hold_s=5.0)
    full = EngineMetrics(running=90, waiting=0, kv_usage=0.95, preemptions=0)
    assert law.decide(observation(limit=100, arrival_rps=0.1, engine=full)) == 81
    preempted = EngineMetrics(running=90, waiting=3, kv_usage=0.5, preemptions=7)
    assert law.decide(observation(limit=100, engine=preempted, preemptions=3)) == 81
    calm = EngineMetrics(running=60, waiting=0, kv_usage=0.5, preemptions=7)
    held = law.decide(observation(now_s=12.0, limit=81, arrival_rps=0.1, engine=calm))
    assert held <= 81  # no rise within kv_hold_s of a preemption
    later = law.decide(observation(now_s=20.0, limit=81, arrival_rps=0.1, engine=calm))
    assert later > 81


def idle(now_s: float, limit: int) -> GateObservation:
    """A tick with nothing in flight, waiting or arriving, and no finished request left in
    the window; the streams' last gap (60 ms) is stale."""
    return observation(
        now_s=now_s,
        limit=limit,
        in_flight=0,
        waiting=0,
        arrivals=0,
        admitted=0,
        recent_finished=0,
        mean_gap_s=0.060,
        tpot_p_s=math.nan,
        tpot_mean_s=math.nan,
    )


def test_an_idle_spell_moves_neither_the_limit_nor_the_fit_correction() -> None:
    young = ModelLimit(SLO, maximum=1024)  # no model yet: the fallback decides
    for tick in range(20):
        assert young.decide(idle(10.0 + 0.5 * tick, 100)) == 100  # a stale gap cuts nothing
    warm = ModelLimit(SLO, maximum=1024)
    warm.decide(observation(limit=100, mean_gap_s=0.02))
    bias = warm.bias
    for tick in range(40):
        warm.decide(idle(11.0 + 0.5 * tick, 100))
    assert warm.bias == bias  # the stale gap against one sequence's fit taught nothing

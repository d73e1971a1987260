"""The controller and the core: observations in, gate knobs out; the core's wiring."""

from __future__ import annotations

import math

import pytest

from adaptive_batcher.llm.controller import HISTORY_TICKS, TokenController
from adaptive_batcher.llm.core import GateCore
from adaptive_batcher.llm.gate import Admit, GateRequest, Reject, RequestState
from adaptive_batcher.llm.laws import AIMDLimit, StaticLimit
from adaptive_batcher.llm.signals import EngineMetrics, GateObservation
from adaptive_batcher.llm.slo import TokenSLO

SLO = TokenSLO(ttft_ms=300, tpot_ms=50)


class Recording(StaticLimit):
    """A static law that keeps what it saw."""

    def __init__(self, limit: int) -> None:
        super().__init__(limit)
        self.seen: list[GateObservation] = []

    def decide(self, observation: GateObservation) -> int:
        self.seen.append(observation)
        return self.limit


def test_the_first_decision_has_no_forecast_and_the_configured_knobs() -> None:
    controller = TokenController(SLO, StaticLimit(8), initial_limit=8, max_queue=16, order="edf")
    limits = controller.decision.limits
    assert (limits.max_in_flight, limits.max_queue, limits.order) == (8, 16, "edf")
    assert limits.admit_ttft_s == pytest.approx(0.3) and limits.max_wait_s == pytest.approx(0.15)
    assert controller.decision.forecast is None


def test_ticks_are_due_every_interval_from_the_first_call() -> None:
    controller = TokenController(SLO, StaticLimit(8), interval_s=0.5)
    assert not controller.due(10.0)  # starts the clock
    assert not controller.due(10.4)
    assert controller.due(10.5)
    controller.tick(10.5, in_flight=0, waiting=0, context_tokens=0.0)
    assert not controller.due(10.9) and controller.due(11.0)


def test_the_history_keeps_the_last_ticks_only() -> None:
    controller = TokenController(SLO, StaticLimit(8), interval_s=0.5)
    ticks = HISTORY_TICKS + 10
    for i in range(ticks):
        controller.tick(0.5 * i, in_flight=0, waiting=0, context_tokens=0.0)
    assert len(controller.history) == HISTORY_TICKS  # a gate that runs for days stays bounded
    assert controller.history[-1][0] == 0.5 * (ticks - 1)
    assert controller.history[0][0] == 0.5 * (ticks - HISTORY_TICKS)


def test_a_tick_reports_what_happened_since_the_last_and_forms_a_forecast() -> None:
    law = Recording(4)
    controller = TokenController(SLO, law, initial_limit=4)
    for i in range(40):  # admitted, first tokens, finishes, token gaps
        now = 0.01 * i
        controller.record_arrival(now)
        controller.record_admit(now, 500)
        controller.record_gap(now, 4, 0.02, 4, 2000.0)
        controller.record_first_token(now, 0.05, 500)
        controller.record_finish(now, 0.1 if i % 4 else 0.5, 0.02, 100, 2.0, 3)
    controller.record_reject(0.4)
    controller.record_engine(0.4, EngineMetrics(4, 0, 0.5, 2))
    controller.record_engine(0.45, EngineMetrics(4, 0, 0.5, 5))
    decision = controller.tick(0.5, in_flight=4, waiting=2, context_tokens=2000.0)
    (obs,) = law.seen
    assert (obs.arrivals, obs.admitted, obs.rejected, obs.in_flight, obs.waiting) == (
        40,
        40,
        1,
        4,
        2,
    )
    assert obs.finished_misses == tuple(i % 4 == 0 for i in range(40))  # TTFT 0.5 s misses
    assert obs.finished_tpot_misses == (False,) * 40
    assert obs.preemptions == 3 and obs.engine is not None and obs.engine.preemptions == 5
    assert obs.mean_prompt == 500 and obs.mean_output == 100
    assert obs.departure_rps == pytest.approx(4 / 2.0)  # in flight over the time inside
    forecast = decision.forecast
    assert forecast is not None and forecast.departure_rps == pytest.approx(2.0)
    assert decision.limits.max_wait_s == pytest.approx(0.3 - 0.05, abs=0.002)
    assert decision.limits.predict_free  # requests waited: pressed
    second = controller.tick(1.0, in_flight=1, waiting=0, context_tokens=0.0)
    assert law.seen[1].arrivals == 0 and law.seen[1].preemptions == 0
    assert not second.limits.predict_free


def tpot_tail_after(tpots_s: list[float]) -> float:
    law = Recording(4)
    controller = TokenController(SLO, law, initial_limit=4)
    for i, tpot in enumerate(tpots_s):
        controller.record_finish(0.001 * i, 0.1, tpot, 100, 2.0, 3)
    controller.tick(0.5, in_flight=4, waiting=0, context_tokens=0.0)
    return law.seen[0].tpot_p_s


def test_one_slow_request_does_not_set_a_tail_the_window_cannot_estimate() -> None:
    # 50 requests cannot tell a p99: one stall (80 ms) is the largest, the tail is the next
    few = tpot_tail_after([0.020] * 48 + [0.030, 0.080])
    assert 0.029 <= few <= 0.031
    # 200 requests can: their p99 as before (the 198th of 200)
    many = tpot_tail_after([0.020] * 197 + [0.080] * 3)
    assert many >= 0.079


def fitted(controller: TokenController) -> None:
    """Token gaps that fit a step of 6 ms + 0.5 ms a sequence + 40 ms per 1000 prompt tokens
    (a gap shares the prefill of the prompts admitted the gap before the one before it)."""
    prompts = [1000 * (i % 3) for i in range(300)]
    for i, prompt in enumerate(prompts):
        sequences = 4 + i % 8
        prefill = prompts[i - 2] if i >= 2 else 0
        gap = 0.006 + 0.0005 * sequences + 0.04 * prefill / 1000
        controller.record_gap(0.001 * i, sequences, gap, sequences, 0.0)
        controller.record_admit(0.001 * i, prompt)


def test_prefill_pacing_leaves_the_running_streams_their_tpot_aim() -> None:
    law = Recording(64)
    controller = TokenController(SLO, law, initial_limit=64)
    fitted(controller)
    decision = controller.tick(1.0, in_flight=8, waiting=0, context_tokens=0.0)
    fit = law.seen[0].step_fit
    assert fit is not None and fit.per_prefill_ktoken_s == pytest.approx(0.04)
    per_token = fit.per_prefill_ktoken_s / 1e3
    aim = SLO.margin * SLO.tpot_s
    share = 1 - fit.step_s(8, 0.0, 0.0) / aim  # what the decode steps leave to prefill
    assert decision.limits.prefill_tokens_per_s == pytest.approx(share / per_token)
    assert decision.limits.prefill_burst_tokens == pytest.approx(2 * aim / per_token)
    off = TokenController(SLO, Recording(64), initial_limit=64, pace_prefill=False)
    fitted(off)
    limits = off.tick(1.0, in_flight=8, waiting=0, context_tokens=0.0).limits
    assert limits.prefill_tokens_per_s is None and limits.prefill_burst_tokens is None
    young = TokenController(SLO, Recording(64), initial_limit=64)  # no fit: no pacing
    assert (
        young.tick(1.0, in_flight=8, waiting=0, context_tokens=0.0).limits.prefill_tokens_per_s
        is None
    )


def test_bad_arguments_are_named() -> None:
    with pytest.raises(TypeError, match=r"^slo must be a TokenSLO, got float$"):
        TokenController(0.3, StaticLimit(1))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^law must have decide"):
        TokenController(SLO, object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^order must be one of 'fcfs', 'edf', got 'x'$"):
        TokenController(SLO, StaticLimit(1), order="x")
    with pytest.raises(ValueError, match=r"^interval_s must be a finite number > 0, got 0$"):
        TokenController(SLO, StaticLimit(1), interval_s=0)
    with pytest.raises(TypeError, match=r"^controller must be a TokenController, got int$"):
        GateCore(3)  # type: ignore[arg-type]


def test_the_core_wires_gate_and_controller_for_one_request() -> None:
    core: GateCore[str] = GateCore(TokenController(SLO, StaticLimit(1), initial_limit=1))
    request, actions = core.arrive("a", 0.0, 100)
    assert [type(a) for a in actions][:1] == [Admit]
    assert request.ttft_deadline_s == pytest.approx(0.3) and core.context_tokens == 100
    waiting, actions = core.arrive("b", 0.0, 50)
    assert waiting.state == RequestState.WAITING
    core.first_token(request, 0.1)
    core.tokens(0.12, 1, 0.02)
    assert core.context_tokens == 102  # its prompt, its first token, one more token
    core.tokens(0.14, 1, 0.02)
    actions = core.finish(request, 0.14, output_tokens=3)
    assert [a.request for a in actions if isinstance(a, Admit)] == [waiting]
    assert core.context_tokens == 50
    assert core.finish(request, 0.3, output_tokens=3)[-1].at_s is None  # type: ignore[union-attr]
    counts = core.counts()
    assert (counts.completed, counts.running, counts.submitted) == (1, 1, 2)


def test_ticks_ride_on_arrivals_and_polls() -> None:
    law = Recording(2)
    core: GateCore[int] = GateCore(TokenController(SLO, law, initial_limit=2, interval_s=1.0))
    core.arrive(0, 0.0, 10)  # starts the clock
    core.arrive(1, 1.0, 10)  # due: a tick before it is admitted
    assert len(law.seen) == 1
    core.poll(1.5)
    core.poll(2.0)
    assert len(law.seen) == 2 and law.seen[1].now_s == 2.0


def test_a_refused_arrival_reaches_the_controller() -> None:
    controller = TokenController(SLO, StaticLimit(1), initial_limit=1, max_queue=0)
    core: GateCore[int] = GateCore(controller)
    core.arrive(0, 0.0, 10)
    _, actions = core.arrive(1, 0.0, 10)
    assert any(isinstance(a, Reject) for a in actions)
    law = Recording(1)
    controller.law = law
    controller.due(0.0)
    controller.tick(0.5, in_flight=1, waiting=0, context_tokens=0.0)
    assert law.seen[0].rejected == 1 and law.seen[0].arrivals == 2
    assert not math.isnan(law.seen[0].arrival_rps)


def test_cancel_and_fail_end_requests_through_the_core() -> None:
    core: GateCore[str] = GateCore(TokenController(SLO, StaticLimit(1), initial_limit=1))
    running, _ = core.arrive("a", 0.0, 10)
    waiting, _ = core.arrive("b", 0.0, 10)
    core.cancel(waiting, 0.1)
    core.fail(running, 0.2)
    counts = core.counts()
    assert (counts.cancelled, counts.failed, counts.running) == (1, 1, 0)
    assert core.context_tokens == 0 and isinstance(running, GateRequest)


def test_a_finish_counts_itself_in_flight_so_a_limit_of_one_can_rise() -> None:
    # Netflix's limiter samples the in-flight count with the request in it; without it, a
    # success at a limit of 1 finds 0 in flight, 2 * 0 < 1, and AIMD never rises again
    law = AIMDLimit(initial=1)
    core: GateCore[int] = GateCore(TokenController(SLO, law, initial_limit=1, interval_s=1.0))
    now = 0.0
    for i in range(3):
        request, _ = core.arrive(i, now, 10)
        core.first_token(request, now + 0.05)
        core.finish(request, now + 0.07, output_tokens=2)  # TPOT 20 ms: a success
        now += 0.2
    core.poll(1.0)
    # 1 in flight at each: 2 * 1 >= 1 and >= 2 add one each, 2 * 1 < 3 does not
    assert law.limit == 3


def test_bad_samples_are_refused_with_named_errors() -> None:
    controller = TokenController(SLO, StaticLimit(4))
    cases = [
        (lambda: controller.record_gap(0.0, 5, math.inf, 5, 5000.0), "gap_s"),
        (lambda: controller.record_gap(0.0, 5, 0.03, 5, math.nan), "context_tokens"),
        (lambda: controller.record_gap(0.0, -1, 0.03, 5, 10.0), "streams"),
        (lambda: controller.record_finish(0.0, math.nan, 0.02, 10, 1.0, 1), "ttft_s"),
        (lambda: controller.record_finish(0.0, 0.1, 0.02, 10, -1.0, 1), "residence_s"),
        (lambda: controller.record_finish(0.0, 0.1, 0.02, 10, 1.0, -1), "in_flight"),
        (lambda: controller.record_first_token(0.0, math.nan, 100), "engine_ttft_s"),
    ]
    for call, name in cases:
        with pytest.raises(ValueError, match=rf"^{name} must be"):
            call()
    # nothing reached the estimators: the fit and the windows are as before
    decision = controller.tick(1.0, in_flight=0, waiting=0, context_tokens=0.0)
    assert decision.limits.max_in_flight == 4 and controller._steps.samples == 0


def test_switches_must_be_bools() -> None:
    for name in ("early_reject", "shed_late", "predict_free"):
        with pytest.raises(TypeError, match=rf"^{name} must be a bool, got int$"):
            TokenController(SLO, StaticLimit(4), **{name: 1})  # type: ignore[arg-type]


def test_a_sample_the_controller_refuses_leaves_the_request_as_it_was() -> None:
    core: GateCore[str] = GateCore(TokenController(SLO, StaticLimit(1), initial_limit=1))
    request, _ = core.arrive("a", 1.0, 10)
    waiting, _ = core.arrive("b", 1.0, 10)
    with pytest.raises(ValueError, match=r"^engine_ttft_s must be"):
        core.first_token(request, 0.5)  # a clock gone back: before its admission
    assert request.first_token_s is None
    core.first_token(request, 1.1)
    with pytest.raises(ValueError, match=r"^tpot_s must be"):
        core.finish(request, 1.05, output_tokens=3)  # its last token before its first
    assert request.state == RequestState.RUNNING and waiting.state == RequestState.WAITING
    actions = core.finish(request, 1.12, output_tokens=3)  # the slot frees for the waiting one
    assert [a.request for a in actions if isinstance(a, Admit)] == [waiting]

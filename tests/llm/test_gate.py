"""The admission gate: events in, actions out; each rule by example."""

from __future__ import annotations

import math

import pytest

from adaptive_batcher.core.engine import SetTimer
from adaptive_batcher.errors import BatcherClosedError, DeadlineExceededError, QueueFullError
from adaptive_batcher.llm.errors import GateQueueFullError, TTFTUnreachableError
from adaptive_batcher.llm.gate import (
    Abort,
    AdmissionGate,
    Admit,
    Expire,
    GateAction,
    GateLimits,
    GateRequest,
    Reject,
    RequestState,
    TTFTForecast,
)


def handles(actions: list[GateAction], kind: type) -> list[object]:
    return [a.request.handle for a in actions if isinstance(a, kind)]  # type: ignore[union-attr]


def arrive(
    gate: AdmissionGate[str], name: str, now: float, **kwargs: object
) -> tuple[GateRequest[str], list[GateAction]]:
    request: GateRequest[str] = GateRequest(name, now, **kwargs)  # type: ignore[arg-type]
    return request, gate.arrive(request, now)


def test_admits_into_free_slots_then_queues_and_admits_as_slots_free() -> None:
    gate: AdmissionGate[str] = AdmissionGate(GateLimits(max_in_flight=2))
    a, actions = arrive(gate, "a", 0.0)
    assert handles(actions, Admit) == ["a"] and actions[-1] == SetTimer(None)
    b, _ = arrive(gate, "b", 0.1)
    c, actions = arrive(gate, "c", 0.2)
    assert handles(actions, Admit) == [] and gate.waiting == 1 and gate.in_flight == 2
    gate.first_token(a, 0.3)
    assert a.first_token_s == 0.3
    actions = gate.finish(a, 0.5)
    assert handles(actions, Admit) == ["c"] and c.admitted_s == 0.5
    assert a.state == RequestState.COMPLETED and c.state == RequestState.RUNNING
    counts = gate.counts()
    assert (counts.submitted, counts.admitted, counts.running, counts.completed) == (3, 3, 2, 1)
    assert b.state == RequestState.RUNNING


@pytest.mark.parametrize(("order", "expected"), [("fcfs", "late"), ("edf", "early")])
def test_fcfs_and_edf_orders(order: str, expected: str) -> None:
    gate: AdmissionGate[str] = AdmissionGate(GateLimits(1, order=order))
    first, _ = arrive(gate, "first", 0.0)
    arrive(gate, "late", 0.1, ttft_deadline_s=5.0)
    arrive(gate, "early", 0.2, ttft_deadline_s=1.0)
    assert handles(gate.finish(first, 0.3), Admit) == [expected]


def test_changing_the_order_resorts_the_queue() -> None:
    gate: AdmissionGate[str] = AdmissionGate(GateLimits(1))
    first, _ = arrive(gate, "first", 0.0)
    arrive(gate, "late", 0.1, ttft_deadline_s=5.0)
    arrive(gate, "early", 0.2, ttft_deadline_s=1.0)
    gate.set_limits(GateLimits(1, order="edf"))
    assert handles(gate.finish(first, 0.3), Admit) == ["early"]


def test_an_arrival_whose_predicted_ttft_misses_is_refused_with_retry_after() -> None:
    forecast = TTFTForecast(departure_rps=10.0, engine_ttft_s=0.05, per_prompt_token_s=1e-4)
    gate: AdmissionGate[str] = AdmissionGate(GateLimits(1, admit_ttft_s=0.3), forecast)
    arrive(gate, "running", 0.0, prompt_tokens=500)
    # one waiting would wait a departure (0.1 s) + 0.05 s + (500 backlog + 100) * 1e-4 s
    assert gate.predicted_ttft_s(100) == pytest.approx(0.1 + 0.05 + 0.06)
    _, actions = arrive(gate, "ok", 0.0, prompt_tokens=100)
    assert handles(actions, Reject) == [] and gate.waiting == 1
    refused, actions = arrive(gate, "late", 0.0, prompt_tokens=100)
    (reject,) = [a for a in actions if isinstance(a, Reject)]
    error = reject.error
    assert isinstance(error, TTFTUnreachableError) and error.http_status == 503
    assert error.predicted_ttft_s == pytest.approx(0.2 + 0.05 + 0.06)
    assert error.retry_after_s == pytest.approx(0.31 - 0.3)
    assert str(error) == "predicted time to first token 310 ms exceeds the 300 ms the gate admits"
    assert refused.state == RequestState.REJECTED and gate.counts().rejected == 1


def test_a_free_slot_admits_without_a_prediction_unless_predict_free() -> None:
    forecast = TTFTForecast(10.0, 1.0)  # every prediction misses a 0.3 s target
    gate: AdmissionGate[str] = AdmissionGate(GateLimits(4, admit_ttft_s=0.3), forecast)
    assert handles(arrive(gate, "a", 0.0)[1], Admit) == ["a"]
    gate.set_limits(GateLimits(4, admit_ttft_s=0.3, predict_free=True))
    assert handles(arrive(gate, "b", 0.0)[1], Reject) == ["b"]


def test_the_flood_guard_refuses_a_free_slot_while_the_prefill_backlog_alone_misses() -> None:
    forecast = TTFTForecast(10.0, 0.05, per_prompt_token_s=1e-4)  # 0.1 ms a prompt token
    gate: AdmissionGate[str] = AdmissionGate(GateLimits(8, flood_ttft_s=0.3), forecast)
    assert handles(arrive(gate, "long", 0.0, prompt_tokens=2000)[1], Admit) == ["long"]
    # 2000 tokens ahead: 0.05 + 0.2 s, within 0.3 s; a prompt of its own is not counted
    assert handles(arrive(gate, "next", 0.0, prompt_tokens=900)[1], Admit) == ["next"]
    _, actions = arrive(gate, "flooded", 0.0, prompt_tokens=10)  # 2900 ahead: 0.34 s
    (reject,) = [a for a in actions if isinstance(a, Reject)]
    assert isinstance(reject.error, TTFTUnreachableError)
    assert reject.error.predicted_ttft_s == pytest.approx(0.34)
    assert gate.in_flight == 2 < gate.limits.max_in_flight  # a free slot, yet refused


def test_the_flood_guard_never_refuses_because_the_engine_alone_is_forecast_late() -> None:
    # a stale forecast from slow first tokens (0.8 s) must not refuse at an idle engine: no
    # request would then ever be admitted to show that the engine is fast again
    forecast = TTFTForecast(10.0, 0.8, per_prompt_token_s=1e-4)
    gate: AdmissionGate[str] = AdmissionGate(GateLimits(8, flood_ttft_s=0.3), forecast)
    assert handles(arrive(gate, "idle", 0.0, prompt_tokens=2000)[1], Admit) == ["idle"]
    assert handles(arrive(gate, "behind", 0.0, prompt_tokens=10)[1], Admit) == ["behind"]


def test_prefill_pacing_lets_a_burst_in_at_the_buckets_pace() -> None:
    # 1000 prompt tokens a second, a burst of 2000: five 1000-token prompts arrive at once
    limits = GateLimits(100, prefill_tokens_per_s=1000.0, prefill_burst_tokens=2000.0)
    gate: AdmissionGate[str] = AdmissionGate(limits)
    admitted: dict[str, float] = {}
    for name in "abcde":
        _, actions = arrive(gate, name, 0.0, prompt_tokens=1000)
        admitted.update({h: 0.0 for h in handles(actions, Admit)})  # type: ignore[misc]
    assert sorted(admitted) == ["a", "b"] and gate.waiting == 3  # the burst, then the bucket
    assert gate.waiting_prompt_tokens == 3000 and gate.prefill_bucket_tokens == 0
    while gate.waiting:
        wakeup = gate.next_wakeup()
        assert wakeup is not None  # a waiting request with a free slot has a timer
        for handle in handles(gate.poll(wakeup), Admit):
            admitted[str(handle)] = wakeup
    # each waits until the bucket holds more than 0 again: a token's time, then 1 s each
    assert admitted["c"] == pytest.approx(0.001)
    assert admitted["d"] == pytest.approx(1.001, abs=1e-6)
    assert admitted["e"] == pytest.approx(2.001, abs=1e-6)
    assert gate.waiting_prompt_tokens == 0


def test_prefill_pacing_counts_in_the_predicted_ttft_and_refuses_what_it_delays_too_long() -> None:
    limits = GateLimits(
        100, admit_ttft_s=0.3, prefill_tokens_per_s=1000.0, prefill_burst_tokens=500.0
    )
    gate: AdmissionGate[str] = AdmissionGate(limits, TTFTForecast(10.0, 0.05))
    _, actions = arrive(gate, "long", 0.0, prompt_tokens=800)  # the bucket is 500: admitted
    assert handles(actions, Admit) == ["long"] and gate.prefill_bucket_tokens == -300
    assert gate.predicted_ttft_s(100) == pytest.approx(0.301 + 0.05)  # 301 tokens to refill
    _, actions = arrive(gate, "next", 0.0, prompt_tokens=100)  # a free slot, but paced
    assert handles(actions, Reject) == ["next"]
    _, actions = arrive(gate, "later", 0.2, prompt_tokens=100)  # 0.101 s left: it waits
    assert handles(actions, Admit) == [] and gate.waiting == 1
    assert handles(gate.poll(0.302), Admit) == ["later"]


def test_prefill_pacing_with_no_queue_refuses_what_it_would_hold() -> None:
    limits = GateLimits(100, max_queue=0, prefill_tokens_per_s=100.0, prefill_burst_tokens=100.0)
    gate: AdmissionGate[str] = AdmissionGate(limits)
    _, actions = arrive(gate, "a", 0.0, prompt_tokens=200)
    assert handles(actions, Admit) == ["a"]  # a full bucket takes it
    _, actions = arrive(gate, "b", 0.0, prompt_tokens=200)  # a free slot, the bucket empty
    assert handles(actions, Reject) == ["b"] and gate.waiting == 0  # 0: none waits


def test_a_pacing_change_fills_the_bucket_at_the_old_rate_up_to_now() -> None:
    limits = GateLimits(4, prefill_tokens_per_s=100.0, prefill_burst_tokens=100.0)
    for now, due in ((3.99, 3.99 + 2.0), (None, 3.99 + 397.01)):
        gate: AdmissionGate[str] = AdmissionGate(limits)
        arrive(gate, "long", 0.0, prompt_tokens=500)  # the bucket at 100 - 500 = -400
        arrive(gate, "next", 0.0, prompt_tokens=10)
        assert gate.next_wakeup() == pytest.approx(4.01)
        slower = GateLimits(4, prefill_tokens_per_s=1.0, prefill_burst_tokens=100.0)
        gate.set_limits(slower, now)
        gate.poll(3.99)
        # with now: 3.99 s at 100 a second leave -1, then 2 s at 1; without: 3.99 s at 1
        assert gate.next_wakeup() == pytest.approx(due)


def test_pacing_turned_on_between_events_is_due_at_once_and_a_clock_gone_back_counts_on() -> None:
    gate: AdmissionGate[str] = AdmissionGate(GateLimits(1))
    running, _ = arrive(gate, "a", 0.0, prompt_tokens=10)
    arrive(gate, "b", 1.0, prompt_tokens=10)  # waits for the slot
    paced = GateLimits(4, prefill_tokens_per_s=10.0, prefill_burst_tokens=100.0)
    gate.set_limits(paced)  # a free slot, pacing on, no event since
    assert gate.next_wakeup() == 1.0  # a full bucket: due at the last event, not -inf
    assert handles(gate.poll(1.5), Admit) == ["b"]
    arrive(gate, "c", 1000.0, prompt_tokens=500)  # a full bucket (100) takes it: -400
    arrive(gate, "d", 1000.0, prompt_tokens=10)  # waits on the bucket
    wakeup = gate.next_wakeup()
    assert wakeup is not None and wakeup > 1000.0
    gate.poll(5.0)  # the clock went back: nothing credited, the bucket counts on from 5 s
    back = gate.next_wakeup()
    assert back is not None and back == pytest.approx(5.0 + (wakeup - 1000.0))
    assert running.state == RequestState.RUNNING


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"prompt_tokens": math.nan}, TypeError, "prompt_tokens must be an int"),
        ({"prompt_tokens": -1}, ValueError, "prompt_tokens must be >= 0, got -1"),
        ({"prompt_tokens": "10"}, TypeError, "prompt_tokens must be an int"),
        ({"arrival_s": math.nan}, ValueError, "arrival_s must be a finite number, got nan"),
        ({"deadline_s": math.inf}, ValueError, "deadline_s must be a finite number, got inf"),
        ({"max_tokens": 0}, ValueError, "max_tokens must be >= 1, got 0"),
    ],
)
def test_a_request_with_a_bad_field_is_refused_by_name(
    kwargs: dict[str, object], error: type[Exception], message: str
) -> None:
    arguments: dict[str, object] = {"handle": "x", "arrival_s": 0.0, **kwargs}
    with pytest.raises(error, match=f"^{message}"):
        GateRequest(**arguments)  # type: ignore[arg-type]


def test_the_bounded_queue_refuses_with_429_only_when_no_slot_is_free() -> None:
    gate: AdmissionGate[str] = AdmissionGate(GateLimits(1, max_queue=1))
    arrive(gate, "a", 0.0)
    arrive(gate, "b", 0.0)
    _, actions = arrive(gate, "c", 0.0)
    (reject,) = [a for a in actions if isinstance(a, Reject)]
    assert isinstance(reject.error, GateQueueFullError) and isinstance(reject.error, QueueFullError)
    assert (
        reject.error.http_status == 429
        and str(reject.error) == "the gate's queue is full (1 waiting)"
    )
    no_queue: AdmissionGate[str] = AdmissionGate(GateLimits(1, max_queue=0))
    assert handles(arrive(no_queue, "a", 0.0)[1], Admit) == ["a"]
    assert handles(arrive(no_queue, "b", 0.0)[1], Reject) == ["b"]


def test_waiting_past_max_wait_expires_on_the_timer_but_an_admitted_arrival_never_does() -> None:
    gate: AdmissionGate[str] = AdmissionGate(GateLimits(1, max_wait_s=0.0))
    first, actions = arrive(gate, "first", 0.0)
    assert handles(actions, Admit) == ["first"] and first.expire_s is None
    gate.set_limits(GateLimits(1, max_wait_s=0.25))
    _, actions = arrive(gate, "waits", 1.0)
    assert actions[-1] == SetTimer(1.25)
    assert gate.poll(1.2)[-1] == SetTimer(1.25)
    actions = gate.poll(1.25)
    assert handles(actions, Expire) == ["waits"] and gate.counts().expired == 1
    assert handles(gate.finish(first, 2.0), Admit) == []


def test_deadlines_expire_waiting_requests_and_abort_running_ones() -> None:
    gate: AdmissionGate[str] = AdmissionGate(GateLimits(1))
    running, _ = arrive(gate, "running", 0.0, deadline_s=2.0)
    _, actions = arrive(gate, "waiting", 0.0, deadline_s=1.0)
    assert actions[-1] == SetTimer(1.0)
    assert handles(gate.poll(1.0), Expire) == ["waiting"]
    actions = gate.poll(2.0)
    (abort,) = [a for a in actions if isinstance(a, Abort)]
    assert abort.request is running and isinstance(abort.error, DeadlineExceededError)
    assert running.state == RequestState.EXPIRED and gate.in_flight == 0
    assert gate.finish(running, 2.5)[-1] == SetTimer(None)  # late engine output: ignored
    assert gate.counts().completed == 0 and gate.counts().expired == 2


def test_cancel_withdraws_a_waiting_request_and_aborts_a_running_one() -> None:
    gate: AdmissionGate[str] = AdmissionGate(GateLimits(1))
    running, _ = arrive(gate, "running", 0.0)
    waiting, _ = arrive(gate, "waiting", 0.0)
    arrive(gate, "third", 0.0)
    assert handles(gate.cancel(waiting, 0.1), Admit) == []
    actions = gate.cancel(running, 0.2)
    assert [type(a) for a in actions] == [Abort, Admit, SetTimer]
    assert actions[0].request is running and actions[0].error is None  # type: ignore[union-attr]
    assert handles(actions, Admit) == ["third"]
    assert gate.cancel(running, 0.3) == [SetTimer(None)]  # twice: nothing more
    counts = gate.counts()
    assert (counts.cancelled, counts.running, counts.waiting) == (2, 1, 0)


def test_close_with_and_without_drain() -> None:
    gate: AdmissionGate[str] = AdmissionGate(GateLimits(1))
    first, _ = arrive(gate, "first", 0.0)
    arrive(gate, "queued", 0.0)
    gate.close(0.1, drain=True)
    assert gate.closed
    _, actions = arrive(gate, "after", 0.2)
    (reject,) = [a for a in actions if isinstance(a, Reject)]
    assert (
        isinstance(reject.error, BatcherClosedError) and str(reject.error) == "the gate is closed"
    )
    assert handles(gate.finish(first, 0.3), Admit) == ["queued"]

    hard: AdmissionGate[str] = AdmissionGate(GateLimits(1))
    arrive(hard, "first", 0.0)
    arrive(hard, "queued", 0.0)
    actions = hard.close(0.1, drain=False)
    assert handles(actions, Reject) == ["queued"]
    assert hard.counts().rejected == 1 and hard.counts().running == 1


def test_a_lowered_limit_waits_for_departures_and_the_forecast_counts_the_excess() -> None:
    gate: AdmissionGate[str] = AdmissionGate(GateLimits(3), TTFTForecast(10.0, 0.0))
    requests = [arrive(gate, name, 0.0)[0] for name in "abc"]
    gate.set_limits(GateLimits(1))
    assert gate.predicted_ttft_s() == pytest.approx(0.3)  # 2 excess + itself, at 10/s
    waiting, _ = arrive(gate, "d", 0.0)
    assert handles(gate.finish(requests[0], 0.1), Admit) == []
    assert handles(gate.finish(requests[1], 0.2), Admit) == []
    assert handles(gate.finish(requests[2], 0.3), Admit) == ["d"] and waiting.admitted_s == 0.3


def test_the_prefill_backlog_counts_prompts_without_a_first_token() -> None:
    gate: AdmissionGate[str] = AdmissionGate(GateLimits(4))
    a, _ = arrive(gate, "a", 0.0, prompt_tokens=100)
    b, _ = arrive(gate, "b", 0.0, prompt_tokens=30)
    assert gate.prefill_backlog == 130 and (a.admit_backlog, b.admit_backlog) == (0, 100)
    gate.first_token(a, 0.1)
    gate.first_token(a, 0.2)  # a second first token changes nothing
    assert gate.prefill_backlog == 30 and a.first_token_s == 0.1
    gate.cancel(b, 0.3)
    assert gate.prefill_backlog == 0


def test_a_request_is_submitted_once() -> None:
    gate: AdmissionGate[str] = AdmissionGate(GateLimits(1))
    request, _ = arrive(gate, "a", 0.0)
    with pytest.raises(ValueError, match=r"^request 'a' was already submitted$"):
        gate.arrive(request, 0.0)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"max_in_flight": 0}, ValueError, "max_in_flight must be >= 1, got 0"),
        ({"max_in_flight": 1.5}, TypeError, "max_in_flight must be an int, got float"),
        ({"max_queue": -1}, ValueError, "max_queue must be >= 0, got -1"),
        ({"max_wait_s": -0.1}, ValueError, "max_wait_s must be a finite number >= 0, got -0.1"),
        ({"admit_ttft_s": 0}, ValueError, "admit_ttft_s must be a finite number > 0, got 0"),
        ({"order": "lifo"}, ValueError, "order must be one of 'fcfs', 'edf', got 'lifo'"),
        ({"predict_free": 1}, TypeError, "predict_free must be a bool, got int"),
        (
            {"prefill_tokens_per_s": 10.0},
            ValueError,
            "prefill_tokens_per_s and prefill_burst_tokens go together, got 10.0 and None",
        ),
        (
            {"prefill_tokens_per_s": 0.0, "prefill_burst_tokens": 1.0},
            ValueError,
            "prefill_tokens_per_s must be a finite number > 0, got 0.0",
        ),
    ],
)
def test_limits_are_checked(
    kwargs: dict[str, object], error: type[Exception], message: str
) -> None:
    arguments: dict[str, object] = {"max_in_flight": 1, **kwargs}
    with pytest.raises(error, match=rf"^{message}$"):
        GateLimits(**arguments)  # type: ignore[arg-type]


def test_forecast_and_types_are_checked() -> None:
    with pytest.raises(ValueError, match=r"^departure_rps must be a finite number > 0, got 0$"):
        TTFTForecast(0, 0.1)
    with pytest.raises(TypeError, match=r"^limits must be a GateLimits, got int$"):
        AdmissionGate(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^forecast must be a TTFTForecast or None, got float$"):
        AdmissionGate(GateLimits(1), 0.5)  # type: ignore[arg-type]

"""Property tests: random schedules of arrivals, first tokens, finishes, failures,
cancellations, polls and limit changes on the gate.

Invariants: every request ends exactly once (completed, rejected, expired, failed or
cancelled), through exactly one action or call that ends it; the counts add up at every step;
the gate never runs more than its limit except right after the limit was lowered; nothing runs
after it ended; FCFS admissions keep arrival order; a request is refused at once only when no
slot could take it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

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

arrive = st.tuples(
    st.just("arrive"),
    st.integers(0, 2000),  # prompt tokens
    st.one_of(st.none(), st.floats(0.001, 0.2)),  # relative deadline
)
pick = st.integers(0, 10_000)
event = st.one_of(
    arrive,
    st.tuples(st.just("first"), pick),
    st.tuples(st.just("finish"), pick),
    st.tuples(st.just("fail"), pick),
    st.tuples(st.just("cancel"), pick),
    st.tuples(st.just("advance"), st.floats(0.0, 0.1)),
    st.tuples(
        st.just("limits"),
        st.integers(1, 6),
        st.one_of(st.none(), st.integers(0, 4)),
        st.one_of(st.none(), st.floats(0.0, 0.2)),
        st.one_of(st.none(), st.floats(0.01, 0.5)),
        st.sampled_from(["fcfs", "edf"]),
        st.booleans(),
        st.one_of(st.none(), st.floats(100.0, 50_000.0)),  # prefill pacing, tokens/s
    ),
    st.tuples(st.just("forecast"), st.floats(1.0, 100.0), st.floats(0.0, 0.3)),
    st.tuples(st.just("close"), st.booleans()),
)


@dataclass
class Harness:
    gate: AdmissionGate[int]
    now: float = 0.0
    requests: list[GateRequest[int]] = field(default_factory=list)
    endings: dict[int, list[str]] = field(default_factory=dict)
    admit_order: list[int] = field(default_factory=list)
    lowered: bool = False

    def end(self, handle: int, how: str) -> None:
        self.endings.setdefault(handle, []).append(how)

    def carry_out(self, actions: list[GateAction]) -> None:
        for action in actions:
            if isinstance(action, Admit):
                assert action.request.state == RequestState.RUNNING
                self.admit_order.append(action.request.handle)
            elif isinstance(action, Reject):
                self.end(action.request.handle, "rejected")
            elif isinstance(action, Expire):
                self.end(action.request.handle, "expired")
            elif isinstance(action, Abort):
                self.end(action.request.handle, "aborted")

    def check(self) -> None:
        gate = self.gate
        counts = gate.counts()
        states = [r.state for r in self.requests]
        assert counts.submitted == len(self.requests)
        assert counts.waiting == states.count(RequestState.WAITING)
        assert counts.running == states.count(RequestState.RUNNING) == gate.in_flight
        assert counts.submitted == counts.ended + counts.waiting + counts.running
        assert counts.completed == states.count(RequestState.COMPLETED)
        if not self.lowered:
            assert gate.in_flight <= gate.limits.max_in_flight
        for request in self.requests:
            ended = len(self.endings.get(request.handle, []))
            assert ended == (1 if request.ended else 0), (request, self.endings)
        backlog = sum(
            r.prompt_tokens
            for r in self.requests
            if r.state == RequestState.RUNNING and r.first_token_s is None
        )
        assert gate.prefill_backlog == backlog
        waiting = [r for r in self.requests if r.state == RequestState.WAITING]
        assert gate.waiting_prompt_tokens == sum(r.prompt_tokens for r in waiting)


@settings(max_examples=150, deadline=None)
@given(st.lists(event, max_size=80))
def test_every_request_ends_exactly_once_and_counts_add_up(events: list[tuple]) -> None:  # type: ignore[type-arg]
    harness = Harness(AdmissionGate(GateLimits(2, max_queue=3, admit_ttft_s=0.3)))
    gate = harness.gate
    for item in events:
        kind = item[0]
        if kind == "arrive":
            _, prompt, relative = item
            handle = len(harness.requests)
            deadline = None if relative is None else harness.now + relative
            request = GateRequest(handle, harness.now, prompt, deadline_s=deadline)
            harness.requests.append(request)
            free = gate.limits.max_in_flight - gate.in_flight - gate.waiting
            actions = gate.arrive(request, harness.now)
            refused = [a for a in actions if isinstance(a, Reject) and a.request is request]
            paced = gate.prefill_bucket_tokens <= 0  # a free slot, but the pacing holds it
            if refused and not gate.closed and not gate.limits.predict_free and not paced:
                assert free <= 0  # never refused while a free slot could take it
            harness.carry_out(actions)
        elif kind in ("first", "finish", "fail", "cancel") and harness.requests:
            request = harness.requests[item[1] % len(harness.requests)]
            was = request.state
            if kind == "first":
                gate.first_token(request, harness.now)
                actions = []
            elif kind == "finish":
                actions = gate.finish(request, harness.now)
                if was == RequestState.RUNNING:
                    harness.end(request.handle, "completed")
            elif kind == "fail":
                actions = gate.fail(request, harness.now)
                if was == RequestState.RUNNING:
                    harness.end(request.handle, "failed")
            else:
                actions = gate.cancel(request, harness.now)
                if was == RequestState.WAITING:
                    harness.end(request.handle, "cancelled")
            harness.carry_out(actions)
            harness.lowered = harness.lowered and gate.in_flight > gate.limits.max_in_flight
        elif kind == "advance":
            harness.now += item[1]
            harness.carry_out(gate.poll(harness.now))
        elif kind == "limits":
            _, limit, queue, wait, admit, order, predict, pace = item
            harness.lowered = limit < gate.in_flight
            burst = None if pace is None else 1000.0
            limits = GateLimits(limit, queue, wait, admit, order, predict, None, pace, burst)
            gate.set_limits(limits)
            harness.carry_out(gate.poll(harness.now))
        elif kind == "forecast":
            gate.set_forecast(TTFTForecast(item[1], item[2], 1e-4))
        elif kind == "close":
            harness.carry_out(gate.close(harness.now, drain=item[1]))
        harness.check()
    # the pacing's timer: a request waiting with a slot free is admitted once it fires
    wakeup = gate.next_wakeup()
    if wakeup is not None and not gate.closed:
        harness.now = max(harness.now, wakeup)
        harness.carry_out(gate.poll(harness.now))
        harness.check()
        if gate.waiting and gate.in_flight < gate.limits.max_in_flight:
            assert gate.next_wakeup() is not None  # never a waiting request without a timer
    # drain: finish whatever runs, advance past every deadline; everything ends
    harness.carry_out(gate.close(harness.now, drain=False))
    for _ in range(len(harness.requests) + 1):
        running = [r for r in harness.requests if r.state == RequestState.RUNNING]
        if not running:
            break
        harness.end(running[0].handle, "completed")
        harness.carry_out(gate.finish(running[0], harness.now))
    harness.check()
    assert all(r.ended for r in harness.requests)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(["arrive", "finish"]), max_size=60))
def test_fcfs_admits_in_arrival_order(steps: list[str]) -> None:
    gate: AdmissionGate[int] = AdmissionGate(GateLimits(2))
    requests: list[GateRequest[int]] = []
    order: list[int] = []
    for step in steps:
        if step == "arrive":
            request = GateRequest(len(requests), 0.0)
            requests.append(request)
            actions = gate.arrive(request, 0.0)
        else:
            running = [r for r in requests if r.state == RequestState.RUNNING]
            actions = gate.finish(running[0], 0.0) if running else gate.poll(0.0)
        order += [a.request.handle for a in actions if isinstance(a, Admit)]
    assert order == sorted(order) == list(range(len(order)))

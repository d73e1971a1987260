"""Property tests: random arrival / cancel / deadline / completion / limit schedules on the engine.

Invariants: every request ends exactly once (dispatched, expired, cancelled or rejected), no batch
exceeds the cap in force (a lone item larger than a lowered cap excepted; never the hard cap), the
queue is FIFO, slots are never oversubscribed, a drained engine ends idle, and a deadline bounds
a request's queue delay: it starts by its deadline, or expires at it with every slot busy.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from adaptive_batcher.core.engine import (
    Batch,
    BatchingEngine,
    Dispatch,
    EngineLimits,
    Expire,
    Request,
    RequestState,
    SetTimer,
)
from adaptive_batcher.errors import BatcherError

HARD_CAP = 16

arrive = st.tuples(
    st.just("arrive"),
    st.integers(1, HARD_CAP + 2),  # sizes above the hard cap must be rejected
    st.one_of(st.none(), st.floats(0.0005, 0.05)),  # relative deadline
)
cancel = st.tuples(st.just("cancel"), st.integers(0, 10_000))
complete = st.tuples(st.just("complete"), st.integers(0, 10_000))
advance = st.tuples(st.just("advance"), st.floats(0.0, 0.02))
limits = st.tuples(st.just("limits"), st.floats(0.0, 0.02), st.integers(1, HARD_CAP))
operations = st.lists(st.one_of(arrive, cancel, complete, advance, limits), max_size=120)


@dataclass
class Harness:
    engine: BatchingEngine[int]
    now: float = 0.0
    requests: list[Request[int]] = field(default_factory=list)
    endings: dict[int, list[str]] = field(default_factory=dict)
    running: list[Batch[int]] = field(default_factory=list)
    dispatch_order: list[int] = field(default_factory=list)
    ended_at: dict[int, float] = field(default_factory=dict)
    timer_at: float | None = None

    def end(self, request_id: int, how: str) -> None:
        self.endings.setdefault(request_id, []).append(how)
        self.ended_at[request_id] = self.now

    def poll(self) -> None:
        cap = self.engine.limits.max_batch_size
        actions = self.engine.poll(self.now)
        if any(type(a) is Expire for a in actions):
            # a request expires only when no slot can take it at its deadline: one free at
            # its deadline starts it instead (its deadline bounds its queue delay)
            assert self.engine.in_flight == self.engine.limits.max_concurrent_batches
        # expirations come earliest deadline first, ties in arrival order (one heap's order)
        expired = [(a.request.deadline_s, a.request.handle) for a in actions if type(a) is Expire]
        assert expired == sorted(expired)  # type: ignore[type-var]
        for action in actions:
            if isinstance(action, Dispatch):
                batch = action.batch
                assert batch.requests, "empty batch dispatched"
                units = sum(r.size for r in batch.requests)
                assert units == batch.units
                assert units <= HARD_CAP
                assert units <= cap or len(batch.requests) == 1
                for r in batch.requests:
                    assert r.state == RequestState.DISPATCHED
                    self.end(r.handle, "dispatched")
                    self.dispatch_order.append(r.handle)
                self.running.append(batch)
            elif isinstance(action, Expire):
                assert action.request.deadline_s is not None
                assert action.request.deadline_s <= self.now
                self.end(action.request.handle, "expired")
            elif isinstance(action, SetTimer):
                self.timer_at = action.at_s
        assert len(self.running) == self.engine.in_flight
        assert self.engine.in_flight <= self.engine.limits.max_concurrent_batches

    def advance(self, dt: float) -> None:
        """Let time pass, firing the engine's timer whenever it falls due (as a runtime would)."""
        target = self.now + dt
        while self.timer_at is not None and self.timer_at <= target:
            self.now = max(self.now, self.timer_at)
            self.timer_at = None
            self.poll()
        self.now = target


def run(ops: list[tuple[object, ...]], slots: int) -> Harness:
    h = Harness(BatchingEngine(EngineLimits(0.005, 8, slots), hard_max_batch_size=HARD_CAP))
    for op in ops:
        kind = op[0]
        if kind == "arrive":
            _, size, rel_deadline = op
            request = Request(
                len(h.requests),
                h.now,
                int(size),  # type: ignore[call-overload]
                None if rel_deadline is None else h.now + rel_deadline,
            )
            h.requests.append(request)
            try:
                if h.engine.arrive(request, h.now):
                    h.poll()
                else:  # the contract of False: nothing is due, the timer set covers it
                    timer = h.engine.next_wakeup()
                    actions = h.engine.poll(h.now)
                    assert len(actions) == 1
                    needed = actions[0].at_s  # type: ignore[union-attr]
                    # a timer may be early (a cancelled deadline), never late or missing
                    assert needed is None or (timer is not None and timer <= needed)
            except BatcherError:
                assert request.state == RequestState.REJECTED
                h.end(request.handle, "rejected")
        elif kind == "cancel" and h.requests:
            request = h.requests[int(op[1]) % len(h.requests)]  # type: ignore[call-overload]
            was_queued = request.state == RequestState.QUEUED
            assert h.engine.cancel(request) is was_queued
            if was_queued:
                h.end(request.handle, "cancelled")
        elif kind == "complete" and h.running:
            batch = h.running.pop(int(op[1]) % len(h.running))  # type: ignore[call-overload]
            h.engine.complete(batch)
            h.poll()
        elif kind == "advance":
            h.advance(float(op[1]))  # type: ignore[arg-type]
        elif kind == "limits":
            h.engine.set_limits(EngineLimits(float(op[1]), int(op[2]), slots))  # type: ignore[call-overload]
            h.poll()
    return h


def drain(h: Harness) -> None:
    h.engine.close(drain=True)
    h.poll()
    for _ in range(10 * len(h.requests) + 10):
        if not h.running:
            break
        h.engine.complete(h.running.pop(0))
        h.poll()
    assert h.engine.idle


@settings(max_examples=300, deadline=None)
@given(ops=operations, slots=st.integers(1, 3))
def test_every_request_ends_exactly_once_fifo_and_within_cap(
    ops: list[tuple[object, ...]], slots: int
) -> None:
    h = run(ops, slots)
    drain(h)
    for request in h.requests:
        endings = h.endings.get(request.handle, [])
        assert len(endings) == 1, (request, endings)
    assert h.dispatch_order == sorted(h.dispatch_order), "dispatch order must be FIFO"


@settings(max_examples=200, deadline=None)
@given(ops=operations)
def test_deadlines_expire_on_time_and_never_after_dispatch(ops: list[tuple[object, ...]]) -> None:
    h = run(ops, 1)
    drain(h)
    for request in h.requests:
        if request.state == RequestState.EXPIRED:
            # the engine's timer always covers the earliest deadline, so expiry is punctual
            assert h.ended_at[request.handle] == request.deadline_s
        if request.state == RequestState.DISPATCHED and request.deadline_s is not None:
            # started at its deadline at the latest: at it if the window would have held it
            assert h.ended_at[request.handle] <= request.deadline_s


@settings(max_examples=200, deadline=None)
@given(ops=operations, slots=st.integers(1, 3))
def test_a_deadline_bounds_the_queue_delay_whenever_a_slot_is_free(
    ops: list[tuple[object, ...]], slots: int
) -> None:
    """Every request with a deadline either starts by it or expires at it with every slot
    busy (checked at each poll); never expires waiting for a window with a slot free."""
    h = run(ops, slots)
    drain(h)
    for request in h.requests:
        if request.deadline_s is None or request.state not in (
            RequestState.DISPATCHED,
            RequestState.EXPIRED,
        ):
            continue
        waited = h.ended_at[request.handle] - request.arrival_s
        assert waited <= request.deadline_s - request.arrival_s

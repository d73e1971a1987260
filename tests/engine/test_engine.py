"""The sans-IO engine, one event at a time, with exact times."""

from __future__ import annotations

import re

import numpy as np
import pytest

from adaptive_batcher.core.engine import (
    START_GRACE_S,
    Batch,
    BatchingEngine,
    Dispatch,
    EngineLimits,
    Expire,
    Request,
    RequestState,
    SetTimer,
)
from adaptive_batcher.errors import BatcherClosedError, ItemTooLargeError, QueueFullError


def make_engine(
    window_s: float = 0.010, cap: int = 4, slots: int = 1, **kwargs: int | None
) -> BatchingEngine[int]:
    return BatchingEngine(EngineLimits(window_s, cap, slots), **kwargs)  # type: ignore[arg-type]


def dispatched(actions: list[object]) -> list[list[int]]:
    return [[r.handle for r in a.batch.requests] for a in actions if isinstance(a, Dispatch)]


def timer(actions: list[object]) -> float | None:
    last = actions[-1]
    assert isinstance(last, SetTimer)
    return last.at_s


def test_window_counts_from_oldest_arrival() -> None:
    engine = make_engine(window_s=0.010)
    assert engine.arrive(Request(1, 1.000), 1.000) is True  # first arrival: a timer is needed
    assert timer(engine.poll(1.000)) == pytest.approx(1.010)
    engine.arrive(Request(2, 1.006), 1.006)
    actions = engine.poll(1.009)
    assert dispatched(actions) == []
    assert timer(actions) == pytest.approx(1.010)  # not moved by the second arrival
    assert dispatched(engine.poll(1.010)) == [[1, 2]]


def test_full_cap_dispatches_without_waiting_for_window() -> None:
    engine = make_engine(window_s=10.0, cap=3)
    for i in range(3):
        needs_poll = engine.arrive(Request(i, 0.0), 0.0)
    assert needs_poll is True
    assert dispatched(engine.poll(0.0)) == [[0, 1, 2]]


def test_leftovers_after_full_batch_go_at_their_window_without_new_arrival() -> None:
    engine = make_engine(window_s=0.100, cap=4)
    for i in range(10):
        engine.arrive(Request(i, 0.0), 0.0)
    first = engine.poll(0.0)
    assert dispatched(first) == [[0, 1, 2, 3]]
    assert timer(first) is None  # slot busy: completion, not a timer, wakes the engine
    engine.complete(first[0].batch)  # type: ignore[union-attr]
    second = engine.poll(0.010)
    assert dispatched(second) == [[4, 5, 6, 7]]  # full cap queued: goes at once
    engine.complete(second[0].batch)  # type: ignore[union-attr]
    third = engine.poll(0.020)
    assert dispatched(third) == []
    assert timer(third) == pytest.approx(0.100)  # the leftovers' own window, from arrival at 0
    assert dispatched(engine.poll(0.100)) == [[8, 9]]


def test_window_zero_batches_what_queued_while_busy() -> None:
    engine = make_engine(window_s=0.0, cap=100)
    engine.arrive(Request(0, 0.000), 0.000)
    first = engine.poll(0.000)
    assert dispatched(first) == [[0]]
    for i, t in enumerate([0.001, 0.002, 0.003, 0.004], start=1):
        assert engine.arrive(Request(i, t), t) is False  # slot busy: nothing to do yet
    assert dispatched(engine.poll(0.004)) == []
    engine.complete(first[0].batch)  # type: ignore[union-attr]
    assert dispatched(engine.poll(0.050)) == [[1, 2, 3, 4]]


def test_batch_keeps_growing_until_a_slot_frees() -> None:
    engine = make_engine(window_s=0.001, cap=100)
    engine.arrive(Request(0, 0.0), 0.0)
    first = engine.poll(0.001)
    for i in range(1, 6):
        engine.arrive(Request(i, 0.002 * i), 0.002 * i)
    assert dispatched(engine.poll(0.011)) == []  # window passed, but no slot
    engine.complete(first[0].batch)  # type: ignore[union-attr]
    assert dispatched(engine.poll(0.012)) == [[1, 2, 3, 4, 5]]


def test_units_overflow_defers_the_item_in_fifo_order() -> None:
    engine = make_engine(window_s=0.0, cap=32, slots=3)
    sizes = [7, 32, 7, 20, 5]
    for i, size in enumerate(sizes):
        engine.arrive(Request(i, 0.0, size=size), 0.0)
    batches = dispatched(engine.poll(0.0))
    assert batches == [[0], [1], [2, 3, 4]]
    assert all(sum(sizes[i] for i in b) <= 32 for b in batches)


def test_item_over_hard_cap_is_rejected_and_over_current_cap_runs_alone() -> None:
    engine = make_engine(window_s=0.0, cap=8, hard_max_batch_size=16)
    with pytest.raises(ItemTooLargeError, match=r"item size 17 is outside 1\.\.16"):
        engine.arrive(Request(0, 0.0, size=17), 0.0)
    engine.arrive(Request(1, 0.0, size=12), 0.0)  # fits the hard cap, not the current cap
    engine.arrive(Request(2, 0.0, size=1), 0.0)
    assert dispatched(engine.poll(0.0)) == [[1]]


def test_queue_full_rejects_at_once_and_counts_only_queued() -> None:
    engine = make_engine(window_s=0.0, cap=1, max_queue_size=2)
    engine.arrive(Request(0, 0.0), 0.0)
    engine.poll(0.0)  # 0 is running, not queued
    engine.arrive(Request(1, 0.01), 0.01)
    engine.arrive(Request(2, 0.02), 0.02)
    rejected = Request(3, 0.03)
    with pytest.raises(QueueFullError, match=r"queue is full \(2 requests waiting\)"):
        engine.arrive(rejected, 0.03)
    assert rejected.state == RequestState.REJECTED
    assert engine.queue_depth == 2


def test_requests_a_free_slot_takes_next_are_not_counted_as_queued() -> None:
    """Cap 1, window 0, one idle slot, max_queue_size 2: at one instant three arrivals are
    accepted (the free slot takes the first at the next poll, two wait) and a fourth is refused;
    once the first runs, the two waiting fill the queue until the slot frees again."""
    engine = make_engine(window_s=0.0, cap=1, max_queue_size=2)
    for i in range(3):
        engine.arrive(Request(i, 0.0), 0.0)
    with pytest.raises(QueueFullError, match=r"queue is full \(2 requests waiting\)"):
        engine.arrive(Request(3, 0.0), 0.0)
    actions = engine.poll(0.0)
    assert dispatched(actions) == [[0]]
    with pytest.raises(QueueFullError):
        engine.arrive(Request(4, 0.01), 0.01)
    running = next(a.batch for a in actions if isinstance(a, Dispatch))
    engine.complete(running, 0.02)  # the slot is free: it will take the oldest waiting one
    engine.arrive(Request(5, 0.02), 0.02)
    with pytest.raises(QueueFullError):
        engine.arrive(Request(6, 0.02), 0.02)
    assert dispatched(engine.poll(0.02)) == [[1]]
    assert engine.queue_depth == 2


def test_free_slots_take_a_full_batch_each_before_the_queue_counts() -> None:
    """Cap 4, window 5 ms, two idle slots, max_queue_size 3: 2 x 4 requests for the free slots
    plus 3 waiting are accepted, the twelfth is refused, also while the window runs."""
    engine = make_engine(window_s=0.005, cap=4, slots=2, max_queue_size=3)
    for i in range(11):
        engine.arrive(Request(i, 0.0), 0.0)
    with pytest.raises(QueueFullError):
        engine.arrive(Request(11, 0.0), 0.0)
    assert dispatched(engine.poll(0.0)) == [[0, 1, 2, 3], [4, 5, 6, 7]]  # full batches go
    with pytest.raises(QueueFullError):  # both slots busy: the 3 waiting fill the queue
        engine.arrive(Request(12, 0.001), 0.001)
    assert engine.queue_depth == 3


def test_deadline_expires_on_timer_while_slot_is_busy() -> None:
    engine = make_engine(window_s=0.0, cap=8)
    engine.arrive(Request(0, 0.0), 0.0)
    engine.poll(0.0)
    late = Request(1, 0.010, deadline_s=0.110)
    assert engine.arrive(late, 0.010) is True  # the timer must move to the deadline
    assert timer(engine.poll(0.010)) == pytest.approx(0.110)
    actions = engine.poll(0.110)
    assert [a.request.handle for a in actions if isinstance(a, Expire)] == [1]
    assert late.state == RequestState.EXPIRED
    assert engine.queue_depth == 0


def test_a_deadline_before_the_window_closes_starts_the_batch_on_an_idle_engine() -> None:
    """Before: with window 200 ms and a free slot, a request with a 20 ms deadline waited for
    the window and expired at 20 ms. Now its deadline bounds its queue delay (Triton's rule):
    the batch, with whatever queued meanwhile, starts at 20 ms."""
    engine = make_engine(window_s=0.200, cap=8)
    assert engine.arrive(Request(0, 0.0), 0.0) is True
    assert timer(engine.poll(0.0)) == pytest.approx(0.200)
    urgent = Request(1, 0.005, deadline_s=0.025)
    assert engine.arrive(urgent, 0.005) is True  # the timer must move to its deadline
    assert timer(engine.poll(0.005)) == pytest.approx(0.025)
    engine.arrive(Request(2, 0.010), 0.010)
    actions = engine.poll(0.025)
    assert dispatched(actions) == [[0, 1, 2]]
    assert not [a for a in actions if isinstance(a, Expire)]
    assert urgent.state == RequestState.DISPATCHED
    (batch,) = [a.batch for a in actions if isinstance(a, Dispatch)]
    assert batch.window_idle_s == 0.0  # not a batch its window released


def test_a_poll_long_after_a_deadline_expires_it_instead_of_starting_it() -> None:
    """A fresh user's trial: window 20 ms, deadlines of 10 and 15 ms, the caller's loop stood
    still from 0 to 50 ms; the late poll started both 35-40 ms after their deadlines. A poll
    more than START_GRACE_S late expires them; one within it still starts the batch."""
    engine = make_engine(window_s=0.020, cap=8)
    engine.arrive(Request(0, 0.0, deadline_s=0.010), 0.0)
    engine.arrive(Request(1, 0.0, deadline_s=0.015), 0.0)
    assert timer(engine.poll(0.0)) == pytest.approx(0.010)
    actions = engine.poll(0.050)  # the timer due at 10 ms fired at 50 ms
    assert [a.request.handle for a in actions if isinstance(a, Expire)] == [0, 1]
    assert dispatched(actions) == []
    engine.arrive(Request(2, 0.1, deadline_s=0.110), 0.1)
    engine.poll(0.1)
    actions = engine.poll(0.110 + START_GRACE_S / 2)  # a busy loop's timer, a little late
    assert dispatched(actions) == [[2]]


def test_a_deadline_falls_due_with_the_slot_busy_and_expires_then_the_rest_waits() -> None:
    engine = make_engine(window_s=0.200, cap=8)
    engine.arrive(Request(0, 0.0), 0.0)
    engine.arrive(Request(1, 0.0), 0.0)
    engine.set_limits(EngineLimits(0.0, 1, 1))
    assert dispatched(engine.poll(0.0)) == [[0]]  # cap 1: request 1 waits for the slot
    engine.set_limits(EngineLimits(0.200, 8, 1))
    engine.arrive(Request(2, 0.001, deadline_s=0.020), 0.001)
    actions = engine.poll(0.020)  # the slot is still busy at the deadline
    assert [a.request.handle for a in actions if isinstance(a, Expire)] == [2]
    assert dispatched(actions) == []


def test_deadlines_set_in_the_past_expire_at_the_next_poll_even_with_a_slot_free() -> None:
    """Shedding that begins after requests queued (expire_after) gives some of them deadlines
    already past: they expire, as expire_after says; the ones still ahead start at theirs."""
    engine = make_engine(window_s=0.200, cap=8)
    engine.arrive(Request(0, 0.0), 0.0)
    engine.arrive(Request(1, 0.040), 0.040)
    engine.poll(0.040)
    engine.expire_after(0.030)  # at 0.05 s: request 0's deadline, 0.03 s, is past
    actions = engine.poll(0.050)
    assert [a.request.handle for a in actions if isinstance(a, Expire)] == [0]
    assert timer(actions) == pytest.approx(0.070)  # request 1's deadline
    assert dispatched(engine.poll(0.070)) == [[1]]  # it comes with the slot free: it starts


def test_a_slot_freeing_at_a_deadline_starts_that_request() -> None:
    engine = make_engine(window_s=0.0, cap=1)
    engine.arrive(Request(0, 0.0), 0.0)
    (running,) = [a.batch for a in engine.poll(0.0) if isinstance(a, Dispatch)]
    engine.arrive(Request(1, 0.001, deadline_s=0.010), 0.001)
    engine.poll(0.001)
    engine.complete(running, 0.010)
    assert dispatched(engine.poll(0.010)) == [[1]]


def test_cancelled_requests_are_skipped_and_not_counted() -> None:
    engine = make_engine(window_s=0.010, cap=3)
    requests = [Request(i, 0.0) for i in range(5)]
    for r in requests:
        engine.arrive(r, 0.0)
    assert engine.cancel(requests[0]) is True
    assert engine.cancel(requests[0]) is False
    engine.cancel(requests[2])
    assert engine.queue_depth == 3
    assert dispatched(engine.poll(0.0)) == [[1, 3, 4]]  # cap 3 reached by live requests only


def test_only_cancelled_requests_form_no_batch() -> None:
    engine = make_engine(window_s=0.010, cap=4)
    requests = [Request(i, 0.0) for i in range(2)]
    for r in requests:
        engine.arrive(r, 0.0)
        engine.cancel(r)
    actions = engine.poll(1.0)
    assert dispatched(actions) == []
    assert timer(actions) is None
    assert engine.idle


def test_window_restarts_from_next_live_request_when_head_is_cancelled() -> None:
    engine = make_engine(window_s=0.010, cap=4)
    first, second = Request(0, 0.000), Request(1, 0.005)
    engine.arrive(first, 0.000)
    engine.arrive(second, 0.005)
    engine.cancel(first)
    actions = engine.poll(0.010)
    assert dispatched(actions) == []
    assert timer(actions) == pytest.approx(0.015)


def test_close_without_drain_returns_queued_and_rejects_arrivals() -> None:
    engine = make_engine(window_s=1.0, cap=4)
    requests = [Request(i, 0.0) for i in range(3)]
    for r in requests:
        engine.arrive(r, 0.0)
    engine.cancel(requests[1])
    dropped = engine.close(drain=False)
    assert [r.handle for r in dropped] == [0, 2]
    assert engine.idle
    with pytest.raises(BatcherClosedError, match="batcher is closed"):
        engine.arrive(Request(9, 0.1), 0.1)


def test_close_with_drain_dispatches_without_waiting_for_window() -> None:
    engine = make_engine(window_s=10.0, cap=4)
    for i in range(6):
        engine.arrive(Request(i, 0.0), 0.0)
    first = engine.poll(0.0)
    assert dispatched(first) == [[0, 1, 2, 3]]
    assert engine.close(drain=True) == []
    engine.complete(first[0].batch)  # type: ignore[union-attr]
    assert dispatched(engine.poll(0.001)) == [[4, 5]]


def test_concurrent_slots_limit_batches_in_flight() -> None:
    engine = make_engine(window_s=0.0, cap=2, slots=2)
    for i in range(7):
        engine.arrive(Request(i, 0.0), 0.0)
    assert dispatched(engine.poll(0.0)) == [[0, 1], [2, 3]]
    assert engine.in_flight == 2


def test_set_limits_applies_at_next_poll_and_checks_hard_cap() -> None:
    engine = make_engine(window_s=1.0, cap=8, hard_max_batch_size=8)
    for i in range(3):
        engine.arrive(Request(i, 0.0), 0.0)
    engine.set_limits(EngineLimits(window_s=0.0, max_batch_size=2))
    assert dispatched(engine.poll(0.0)) == [[0, 1]]
    with pytest.raises(ValueError, match="max_batch_size 9 exceeds the hard cap 8"):
        engine.set_limits(EngineLimits(window_s=0.0, max_batch_size=9))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"window_s": -1.0, "max_batch_size": 1}, "window_s must be >= 0, got -1.0"),
        ({"window_s": 0.0, "max_batch_size": 0}, "max_batch_size must be >= 1, got 0"),
        (
            {"window_s": 0.0, "max_batch_size": 1, "max_concurrent_batches": 0},
            "max_concurrent_batches must be >= 1, got 0",
        ),
    ],
)
def test_limits_validation_messages(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        EngineLimits(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"window_s": "0.01"}, "window_s must be a number, got str"),
        ({"window_s": None}, "window_s must be a number, got NoneType"),
        ({"window_s": True}, "window_s must be a number, got bool"),
        ({"max_batch_size": "4"}, "max_batch_size must be an int, got str"),
        ({"max_batch_size": 2.5}, "max_batch_size must be an int, got float"),
        ({"max_batch_size": float("nan")}, "max_batch_size must be an int, got float"),
        ({"max_batch_size": True}, "max_batch_size must be an int, got bool"),
        ({"max_concurrent_batches": None}, "max_concurrent_batches must be an int, got NoneType"),
        ({"max_concurrent_batches": 1.0}, "max_concurrent_batches must be an int, got float"),
    ],
)
def test_limits_of_the_wrong_type_are_named(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(TypeError, match=f"^{re.escape(message)}$"):
        EngineLimits(**{"window_s": 0.0, "max_batch_size": 4, **kwargs})  # type: ignore[arg-type]


def test_limits_take_numpy_scalars_as_plain_numbers() -> None:
    limits = EngineLimits(np.float32(0.5), np.int64(8), np.int32(2))  # type: ignore[arg-type]
    assert limits == EngineLimits(0.5, 8, 2)
    assert type(limits.window_s) is float and type(limits.max_batch_size) is int
    assert type(limits.max_concurrent_batches) is int


def test_complete_without_batch_in_flight_is_an_error() -> None:
    engine = make_engine()
    engine.arrive(Request(0, 0.0), 0.0)
    batch = engine.poll(1.0)[0].batch  # type: ignore[union-attr]
    engine.complete(batch)
    with pytest.raises(RuntimeError, match="no batch in flight"):
        engine.complete(batch)


def test_batches_released_by_their_window_report_the_idle_tail() -> None:
    engine = make_engine(window_s=0.010, cap=8)
    engine.arrive(Request(0, 0.000), 0.000)
    engine.arrive(Request(1, 0.002), 0.002)
    (action, *_) = engine.poll(0.010)
    assert isinstance(action, Dispatch)
    assert action.batch.window_idle_s == pytest.approx(0.008)  # waited 8 ms after the last one
    engine.complete(action.batch)
    for i in range(8):  # a full cap goes at once: no idle window
        engine.arrive(Request(10 + i, 0.02), 0.02)
    (full, *_) = engine.poll(0.02)
    assert isinstance(full, Dispatch)
    assert full.batch.window_idle_s == 0.0


@pytest.mark.parametrize("cancel_every", [7, 0])
def test_a_queue_that_never_empties_keeps_fifo_order_across_compactions(cancel_every: int) -> None:
    """The queue is a list read from a moving front, compacted now and then; 20k requests through
    a queue that never drains (with or without cancellations) come out once each, in order."""
    engine = make_engine(window_s=0.0, cap=8)
    now = 0.0
    handed_out: list[int] = []
    cancelled: set[int] = set()
    for n in range(20_000):
        now += 0.001
        request = Request(n, now)
        engine.arrive(request, now)
        if cancel_every and n % cancel_every == 3:
            assert engine.cancel(request)
            cancelled.add(n)
        if n % 9 == 8:  # a batch of 8 every nine arrivals: the backlog grows, never empties
            for batch in dispatched(engine.poll(now)):
                handed_out.extend(batch)
            if engine.in_flight:
                engine.complete(Batch(0, [], 0, now))
    assert engine.queue_depth > 0
    expected = [n for n in range(20_000) if n not in cancelled][: len(handed_out)]
    assert handed_out == expected
    assert engine.queue_depth == 20_000 - len(cancelled) - len(handed_out)


def test_unit_sized_batches_take_a_slice_and_sized_ones_stop_before_overflow() -> None:
    engine = make_engine(window_s=0.0, cap=4)
    for n in range(6):
        engine.arrive(Request(n, 0.0), 0.0)
    assert dispatched(engine.poll(0.0)) == [[0, 1, 2, 3]]
    engine.complete(Batch(0, [], 0, 0.0))
    engine.arrive(Request(6, 0.0, size=3), 0.0)  # 4, 5 (1 unit each), then 6 would overflow
    assert dispatched(engine.poll(0.0)) == [[4, 5]]
    assert (engine.queue_depth, engine.queued_units) == (1, 3)

"""The bulk arrival path: ``arrive_many`` queues exactly what ``arrive`` would one by one.

Two engines (and two cores) see the same schedule of arrivals, polls, completions and limit
changes; one takes arrivals one at a time, the other in bulk. They must report the same polls
needed and the same refusals, and then emit the same actions at every poll.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adaptive_batcher.core.batcher_core import BatcherCore
from adaptive_batcher.core.engine import (
    Action,
    Batch,
    BatchingEngine,
    Dispatch,
    EngineLimits,
    Expire,
    Request,
    SetTimer,
)
from adaptive_batcher.core.settings import BatcherSettings
from adaptive_batcher.errors import BatcherError

HARD_CAP = 8

arrivals = st.tuples(
    st.just("arrive"),
    st.lists(
        st.tuples(
            st.sampled_from([0.0, 0.0, 0.0005, 0.002]),  # gap to the previous arrival, s
            st.integers(1, HARD_CAP + 1),  # one size in ten is above the hard cap
            st.one_of(st.none(), st.floats(0.0005, 0.03)),  # own relative deadline, s
        ),
        min_size=1,
        max_size=12,
    ),
)
advance = st.tuples(st.just("advance"), st.floats(0.0, 0.01))
complete = st.tuples(st.just("complete"), st.integers(0, 100))
limits = st.tuples(
    st.just("limits"), st.sampled_from([0.0, 0.001, 0.004]), st.integers(1, HARD_CAP)
)
shed = st.tuples(
    st.just("shed"), st.one_of(st.none(), st.floats(0.001, 0.02)), st.floats(0.0, 0.01)
)
schedules = st.lists(st.one_of(arrivals, advance, complete, limits, shed), max_size=40)


def _summary(actions: list[Action]) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []
    for action in actions:
        if isinstance(action, Dispatch):
            out.append(("dispatch", [r.handle for r in action.batch.requests], action.batch.units))
        elif isinstance(action, Expire):
            out.append(("expire", action.request.handle, action.request.deadline_s))
        else:
            assert isinstance(action, SetTimer)
            out.append(("timer", action.at_s))
    return out


class Twins:
    """One core fed one request at a time, one fed in bulk."""

    def __init__(self, slots: int, queue: int | None) -> None:
        settings = BatcherSettings(
            max_batch_size=HARD_CAP,
            window_ms=2.0,
            max_concurrent_batches=slots,
            max_queue_size=queue,
        )

        self.single: BatcherCore[int] = BatcherCore(settings)
        self.bulk: BatcherCore[int] = BatcherCore(settings)
        self.now = 0.0
        self.handles = 0
        self.running: list[tuple[Batch[int], Batch[int]]] = []

    def arrive(self, items: list[tuple[float, int, float | None]]) -> None:
        made: list[tuple[Request[int], Request[int]]] = []
        for gap, size, deadline in items:
            self.now += gap
            at = None if deadline is None else self.now + deadline
            made.append(
                (
                    Request(self.handles, self.now, size, at),
                    Request(self.handles, self.now, size, at),
                )
            )
            self.handles += 1
        singles = [a for a, _ in made]
        bulks = [b for _, b in made]
        expected: list[Any] = []
        for request in singles:
            try:
                expected.append(self.single.arrive(request, request.arrival_s))
            except BatcherError as exc:
                expected.append(type(exc))
        index = 0
        while index < len(bulks):
            end, poll = self.bulk.arrive_many(bulks, index)
            assert expected[index:end] == [False] * (end - index - 1) + [poll] * (end > index)
            if poll:
                assert end > index
            if end < len(bulks) and not poll:  # refused: the single path raises the same error
                with pytest.raises(expected[end]):
                    self.bulk.arrive(bulks[end], bulks[end].arrival_s)
                end += 1
            index = end
        for a, b in made:
            assert (a.state, a.deadline_s) == (b.state, b.deadline_s)
        assert self.single.recorder.submitted == self.bulk.recorder.submitted
        assert self.single.recorder.rejected == self.bulk.recorder.rejected
        self.poll()

    def poll(self) -> None:
        single, bulk = self.single.poll(self.now), self.bulk.poll(self.now)
        assert _summary(single) == _summary(bulk)
        for a, b in zip(single, bulk, strict=True):
            if isinstance(a, Dispatch):
                assert isinstance(b, Dispatch)
                self.running.append((a.batch, b.batch))

    def complete(self, which: int) -> None:
        if self.running:
            a, b = self.running.pop(which % len(self.running))
            self.single.complete(a, self.now)
            self.bulk.complete(b, self.now)
            self.poll()

    def set_limits(self, window_s: float, cap: int) -> None:
        slots = self.single.limits.max_concurrent_batches
        for core in (self.single, self.bulk):
            core.set_limits(EngineLimits(window_s, cap, slots))
        self.poll()

    def set_shedding(self, full_s: float | None, extra_s: float) -> None:
        for core in (self.single, self.bulk):
            core.shed_after_s = full_s
            core.shed_after_short_s = None if full_s is None else full_s + extra_s


@settings(max_examples=300, deadline=None)
@given(
    schedule=schedules,
    slots=st.integers(1, 2),
    queue=st.one_of(st.none(), st.integers(1, 10)),
)
def test_bulk_arrivals_queue_what_single_arrivals_would(
    schedule: list[tuple[Any, ...]], slots: int, queue: int | None
) -> None:
    twins = Twins(slots, queue)
    for op in schedule:
        if op[0] == "arrive":
            twins.arrive(op[1])
        elif op[0] == "advance":
            twins.now += op[1]
            twins.poll()
        elif op[0] == "complete":
            twins.complete(op[1])
        elif op[0] == "limits":
            twins.set_limits(op[1], op[2])
        else:
            twins.set_shedding(op[1], op[2])
    while twins.running:
        twins.complete(0)
    single, bulk = twins.single, twins.bulk
    assert (single.queue_depth, single.queued_units) == (bulk.queue_depth, bulk.queued_units)


def test_the_requests_not_queued_are_left_untouched() -> None:
    engine: BatchingEngine[int] = BatchingEngine(EngineLimits(0.0, 1), max_queue_size=2)
    requests = [Request(i, 0.001 * i, 1, None) for i in range(5)]
    end, poll = engine.arrive_many(requests, expire_after_s=0.01)
    assert (end, poll) == (1, True)  # the first arrival into an empty queue needs a poll
    assert requests[0].deadline_s == pytest.approx(0.01)
    assert [r.deadline_s for r in requests[1:]] == [None] * 4
    engine.poll(0.0)  # the first runs: the slot is busy
    end, poll = engine.arrive_many(requests, 1, expire_after_s=0.01)
    assert (end, poll) == (2, True)  # its deadline comes before any timer: a poll is needed
    engine.poll(0.001)
    end, poll = engine.arrive_many(requests, 2, expire_after_s=0.01)
    assert (end, poll) == (3, False)  # the queue holds 2 waiting: the next would be refused
    assert [r.deadline_s for r in requests[3:]] == [None, None]


@pytest.mark.parametrize("sizes", [[1] * 6, [2, 1, 1, 3, 1], [3, 3, 1]])
def test_bulk_shedding_deadlines_switch_where_the_queue_holds_a_full_batch(
    sizes: list[int],
) -> None:
    """Cap 4, the slot busy: requests that arrive while fewer than 4 units are queued get the
    short shed_after (20 ms), the later ones the full-batch one (10 ms)."""
    settings = BatcherSettings(max_batch_size=4, window_ms=0.0, max_queue_size=None)
    cores: list[BatcherCore[int]] = [BatcherCore(settings), BatcherCore(settings)]
    for core in cores:
        core.arrive(Request(-1, 0.0), 0.0)
        core.poll(0.0)  # the slot is busy from now on
        core.shed_after_s, core.shed_after_short_s = 0.010, 0.020
    made = [[Request(i, 0.001, size) for i, size in enumerate(sizes)] for _ in cores]
    for request in made[0]:
        cores[0].arrive(request, 0.001)

    index = 0
    while index < len(sizes):
        index, _ = cores[1].arrive_many(made[1], index)
    queued_before = [sum(sizes[:i]) for i in range(len(sizes))]
    expected = [0.001 + (0.020 if units < 4 else 0.010) for units in queued_before]
    assert [r.deadline_s for r in made[0]] == pytest.approx(expected)
    assert [r.deadline_s for r in made[1]] == [r.deadline_s for r in made[0]]

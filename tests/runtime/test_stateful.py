"""Stateful test of the asyncio runtime on a virtual clock (hypothesis RuleBasedStateMachine).

Rules interleave submits (plain, with a deadline, with an exception for their slot, poisoned),
caller cancellations, whole-call model failures, time passing, ``set_limits`` and closes (with or
without draining, with or without a time limit). Each example gets its own
:class:`~adaptive_batcher.testing.VirtualClockLoop`; each rule runs small coroutines on it and then
lets every ready callback run without moving the clock, so the checks see a quiet loop.

Invariants after every step: the batcher's outcome counts add up to the callers that have ended
and agree with what they saw; queue depth and in-flight batches agree with the callers still
waiting and the model calls in progress; every caller got its own result or an error it could
get. After a draining close every caller has ended, the engine is idle and no task is left.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from adaptive_batcher import (
    AdaptiveBatcher,
    BatcherClosedError,
    BatchFailedError,
    DeadlineExceededError,
    QueueFullError,
)
from adaptive_batcher.testing import VirtualClockLoop

SETTLE_TURNS = 20  # loop turns that let every ready callback run (the clock stands still)
HOUR_S = 3600.0
MIN_CALLERS_BEFORE_CLOSE = 6  # else most examples would be closed before anything happened
MAX_SUBMITS_AFTER_CLOSE = 2  # a closed batcher refuses them all: a few show it
KINDS = st.sampled_from(["ok"] * 10 + ["slot", "poison"])


class Item:
    __slots__ = ("kind", "token")

    def __init__(self, token: int, kind: str) -> None:
        self.token = token
        self.kind = kind  # "ok" | "slot" | "poison"


class Echo:
    __slots__ = ("token",)

    def __init__(self, token: int) -> None:
        self.token = token

    def __repr__(self) -> str:
        return f"Echo({self.token})"


class SlotError(Exception):
    def __init__(self, token: int) -> None:
        super().__init__(token)
        self.token = token


class CallFailedError(Exception):
    """A whole model call failed; ``tokens`` are that call's items, ``poisoned`` why."""

    def __init__(self, tokens: frozenset[int], poisoned: bool) -> None:
        super().__init__(sorted(tokens))
        self.tokens = tokens
        self.poisoned = poisoned


class FakeModel:
    """Echoes tokens after ``1 ms + 0.25 ms per item`` of (virtual) time; fails a call that
    holds a poisoned item, or the next ``fail_calls`` calls; ``slot`` items get a SlotError."""

    def __init__(self) -> None:
        self.fail_calls = 0
        self.in_progress: list[frozenset[int]] = []

    async def __call__(self, batch: list[Item]) -> list[Any]:
        tokens = frozenset(item.token for item in batch)
        self.in_progress.append(tokens)
        try:
            await asyncio.sleep(0.001 + 0.00025 * len(batch))
        finally:
            self.in_progress.remove(tokens)
        if any(item.kind == "poison" for item in batch):
            raise CallFailedError(tokens, poisoned=True)
        if self.fail_calls:
            self.fail_calls -= 1
            raise CallFailedError(tokens, poisoned=False)
        return [SlotError(i.token) if i.kind == "slot" else Echo(i.token) for i in batch]


@dataclass(eq=False)
class Caller:
    item: Item
    deadline_ms: float | None
    task: asyncio.Task[Any]
    cancelled: bool = False


class BatcherMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = VirtualClockLoop()
        self.model = FakeModel()
        self.callers: list[Caller] = []
        self.tokens = 0
        self.closes: list[asyncio.Task[None]] = []
        self.batcher: AdaptiveBatcher[Item, Any] = AdaptiveBatcher(self.model)
        self.cap = 1
        self.max_queue_size: int | None = None
        self.bisect = False
        self.submits_after_close = 0
        self.drained = False

    # -- driving the loop --------------------------------------------------------------------

    def _run(self, coro: Any) -> Any:
        # a virtual hour: a request that never settles fails the test instead of hanging it
        result = self.loop.run_until_complete(asyncio.wait_for(coro, HOUR_S))
        self._settle()
        return result

    def _settle(self) -> None:
        async def turns() -> None:
            for _ in range(SETTLE_TURNS):
                await asyncio.sleep(0)

        self.loop.run_until_complete(turns())

    @property
    def closed(self) -> bool:
        return self.batcher.closed

    # -- rules -----------------------------------------------------------------------------------

    @initialize(
        cap=st.integers(1, 6),
        window_ms=st.sampled_from([0.0, 0.5, 2.0]),
        slots=st.integers(1, 3),
        max_queue_size=st.sampled_from([None, 3, 10]),
        bisect=st.booleans(),
    )
    def start(
        self, cap: int, window_ms: float, slots: int, max_queue_size: int | None, bisect: bool
    ) -> None:
        self.cap, self.max_queue_size, self.bisect = cap, max_queue_size, bisect
        self.batcher = AdaptiveBatcher(
            self.model,
            max_batch_size=cap,
            window_ms=window_ms,
            max_concurrent_batches=slots,
            max_queue_size=max_queue_size,
            bisect_on_error=bisect,
        )

    @precondition(lambda self: self.submits_after_close < MAX_SUBMITS_AFTER_CLOSE)
    @rule(
        kinds=st.lists(KINDS, min_size=1, max_size=4),
        deadline_ms=st.sampled_from([None, None, 0.3, 1.0, 4.0]),
    )
    def submit(self, kinds: list[str], deadline_ms: float | None) -> None:
        self.submits_after_close += self.batcher.closed
        for kind in kinds:
            self.tokens += 1
            item = Item(self.tokens, kind)
            task = self.loop.create_task(self.batcher.submit(item, deadline_ms=deadline_ms))
            self.callers.append(Caller(item, deadline_ms, task))
        self._settle()

    @precondition(lambda self: self.submits_after_close < MAX_SUBMITS_AFTER_CLOSE)
    @rule(kind=KINDS)
    def submit_one(self, kind: str) -> None:
        """A second submit rule: rules are drawn alike, and submits should outnumber closes."""
        self.submit([kind], None)

    @precondition(lambda self: self.submits_after_close < MAX_SUBMITS_AFTER_CLOSE)
    @rule(neighbours=st.integers(1, 3), at=st.integers(0, 3))
    def submit_poison_among(self, neighbours: int, at: int) -> None:
        """A poisoned item with company at the same instant: one batch, if cap and slots allow."""
        kinds = ["ok"] * neighbours
        kinds.insert(min(at, neighbours), "poison")
        self.submit(kinds, None)

    @precondition(lambda self: any(not c.task.done() for c in self.callers))
    @rule(pick=st.integers(0, 1 << 16))
    def cancel(self, pick: int) -> None:
        waiting = [c for c in self.callers if not c.task.done()]
        caller = waiting[pick % len(waiting)]
        caller.cancelled = True
        caller.task.cancel()
        self._settle()

    @rule()
    def fail_next_call(self) -> None:
        self.model.fail_calls += 1

    @rule(ms=st.sampled_from([0.1, 0.5, 1.0, 2.0, 5.0, 20.0]))
    def advance(self, ms: float) -> None:
        self._run(asyncio.sleep(ms / 1e3))

    @rule(
        window_ms=st.none() | st.sampled_from([0.0, 0.5, 3.0]),
        cap=st.none() | st.integers(1, 6),
        slots=st.none() | st.integers(1, 3),
    )
    def set_limits(self, window_ms: float | None, cap: int | None, slots: int | None) -> None:
        cap = None if cap is None else min(cap, self.cap)
        if self.closed:  # a closed batcher's settings no longer change
            with pytest.raises(BatcherClosedError, match="batcher is closed"):
                self.batcher.set_limits(window_ms=window_ms)
            return
        self.batcher.set_limits(
            window_ms=window_ms, max_batch_size=cap, max_concurrent_batches=slots
        )
        self._settle()

    @precondition(
        lambda self: len(self.callers) >= MIN_CALLERS_BEFORE_CLOSE and len(self.closes) < 2
    )
    @rule(drain=st.booleans(), timeout_s=st.sampled_from([None, 0.0, 0.001, 0.01]))
    def start_close(self, drain: bool, timeout_s: float | None) -> None:
        """A close that goes on while later rules run (time passes only in ``advance``)."""
        self.closes.append(
            self.loop.create_task(self.batcher.aclose(drain=drain, timeout_s=timeout_s))
        )
        self._settle()

    @precondition(lambda self: len(self.callers) >= MIN_CALLERS_BEFORE_CLOSE and not self.drained)
    @rule()
    def close_and_drain(self) -> None:
        self._run(self.batcher.aclose())
        self.drained = True
        self._check_all_settled()

    # -- invariants ------------------------------------------------------------------------------

    @invariant()
    def counts_add_up_and_agree_with_callers(self) -> None:
        counts = self.batcher.stats().counts
        ended = [c for c in self.callers if c.task.done()]
        assert counts.submitted == len(self.callers)
        total = (
            counts.completed + counts.failed + counts.rejected + counts.expired + counts.cancelled
        )
        assert total == len(ended), (counts, len(ended))
        tally = Counter(self._category(c) for c in ended)
        slack = {
            "completed": counts.completed - tally["ok"],
            "failed": counts.failed - tally["slot_error"] - tally["batch_failed"],
            "rejected": counts.rejected - tally["queue_full"] - tally["closed"],
            "expired": counts.expired - tally["expired"],
        }
        # a caller cancelled after its request ended is counted under that ending
        assert min(slack.values()) >= 0, (slack, tally, counts)
        assert sum(slack.values()) + counts.cancelled == tally["cancelled"], (slack, counts)

    @invariant()
    def queue_and_in_flight_agree_with_waiting_callers(self) -> None:
        stats = self.batcher.stats()
        waiting = {c.item.token for c in self.callers if not c.task.done()}
        running = set().union(*self.model.in_progress) if self.model.in_progress else set()
        assert stats.in_flight_batches == len(self.model.in_progress)
        # a running item whose caller has ended: only a caller that gave up
        for caller in self.callers:
            if caller.task.done() and caller.item.token in running:
                assert caller.cancelled, caller
        if self.bisect:  # the second half of a split batch waits outside both
            assert stats.queue_depth <= len(waiting - running)
        else:
            assert stats.queue_depth == len(waiting - running)

    # -- outcomes --------------------------------------------------------------------------------

    def _category(self, caller: Caller) -> str:
        """What the caller got; fails the test for an outcome it cannot get."""
        item, task = caller.item, caller.task
        if task.cancelled():
            assert caller.cancelled, f"caller {item.token} cancelled by nobody"
            return "cancelled"
        outcome = task.exception()
        if outcome is None:
            result = task.result()
            assert isinstance(result, Echo) and result.token == item.token, (item.token, result)
            assert item.kind == "ok"
            return "ok"
        if isinstance(outcome, SlotError):
            assert outcome.token == item.token and item.kind == "slot"
            return "slot_error"
        if isinstance(outcome, BatchFailedError):
            cause = outcome.cause
            assert isinstance(cause, CallFailedError) and item.token in cause.tokens, (item, cause)
            if self.bisect and cause.poisoned:
                assert item.kind == "poison", f"bisection let poison reach {item.token}"
            return "batch_failed"
        if isinstance(outcome, DeadlineExceededError):
            assert caller.deadline_ms is not None
            return "expired"
        if isinstance(outcome, QueueFullError):
            assert self.max_queue_size is not None
            return "queue_full"
        if isinstance(outcome, BatcherClosedError):
            assert self.closed
            if str(outcome) == "batcher closed while this ran":
                return "batch_failed"  # counted as failed: it was running
            return "closed"
        raise AssertionError(f"caller {item.token} got {outcome!r}")

    def _check_all_settled(self) -> None:
        unsettled = [c.item.token for c in self.callers if not c.task.done()]
        assert not unsettled, f"callers left waiting after a draining close: {unsettled}"
        stats = self.batcher.stats()
        assert stats.queue_depth == 0 and stats.in_flight_batches == 0
        left = [t for t in asyncio.all_tasks(self.loop) if t not in self.closes]
        assert not left, left

    def teardown(self) -> None:
        try:
            if not self.loop.is_closed():
                self._run(self.batcher.aclose())
                self._check_all_settled()
                self.counts_add_up_and_agree_with_callers()  # also checks every outcome
                pending = [t for t in self.closes if not t.done()]
                assert not pending, "a close never returned"
        finally:
            for task in asyncio.all_tasks(self.loop):
                task.cancel()
            self.loop.run_until_complete(asyncio.sleep(0))
            self.loop.close()


TestBatcherMachine = BatcherMachine.TestCase
TestBatcherMachine.settings = settings(max_examples=100, stateful_step_count=40, deadline=None)

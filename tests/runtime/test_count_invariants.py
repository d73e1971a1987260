"""The outcome counts: each only goes up, ``within_slo <= completed``, and once every request has
ended the five outcomes add up to ``submitted``, on every path, streaming included.

A property test runs random scenarios (batch or streaming models that fail mid-way or in a
slot, deadlines, callers that cancel or stop reading, closes with or without draining or a
time limit) on a :class:`~adaptive_batcher.testing.VirtualClockLoop` and samples the counts
every virtual millisecond, and at every step of every caller and of the model.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adaptive_batcher import SLO, AdaptiveBatcher, BatchFailedError
from adaptive_batcher.core.batcher_core import BatcherCore
from adaptive_batcher.core.settings import BatcherSettings
from adaptive_batcher.metrics.recorder import Counts
from adaptive_batcher.testing import run_in_virtual_time

OUTCOMES = ("completed", "failed", "rejected", "expired", "cancelled")
MONOTONE = ("submitted", "within_slo", *OUTCOMES)


def ended(counts: Counts) -> int:
    return sum(getattr(counts, name) for name in OUTCOMES)


class CountWatch:
    """Checks the invariants at every sample and that no count ever goes down."""

    def __init__(self, batcher: AdaptiveBatcher[Any, Any]) -> None:
        self.batcher = batcher
        self.last: Counts | None = None
        self.samples = 0

    def check(self) -> Counts:
        counts = self.batcher.stats().counts
        assert counts.within_slo <= counts.completed, counts
        assert ended(counts) <= counts.submitted, counts
        if self.last is not None:
            for name in MONOTONE:
                assert getattr(counts, name) >= getattr(self.last, name), (name, self.last, counts)
        self.last = counts
        self.samples += 1
        return counts

    def every(self, period_s: float) -> asyncio.TimerHandle:
        loop = asyncio.get_running_loop()

        def tick() -> None:
            self.check()
            self.handle = loop.call_later(period_s, tick)

        self.handle = loop.call_later(period_s, tick)
        return self.handle

    def stop(self) -> None:
        self.handle.cancel()


async def test_a_stream_failing_after_its_first_element_is_not_counted_in_time() -> None:
    """Before: counted completed (and within the SLO) at its first element, then moved from
    completed to failed: completed went down and within_slo stayed (2 > 0)."""
    gate = asyncio.Event()

    async def model(batch: list[int]) -> AsyncIterator[list[int]]:
        yield batch
        await gate.wait()
        raise RuntimeError("device lost")

    batcher = AdaptiveBatcher(model, max_batch_size=2, window_ms=0, slo=SLO(latency_ms=1e4))
    watch = CountWatch(batcher)
    streams = [batcher.submit_stream(i) for i in range(2)]
    firsts = [await anext(s) for s in streams]
    watch.check()
    gate.set()
    for stream in streams:
        with pytest.raises(BatchFailedError):
            await anext(stream)
    counts = watch.check()
    await batcher.aclose()
    assert firsts == [0, 1]
    assert (counts.completed, counts.within_slo, counts.failed) == (0, 0, 2)
    assert ended(counts) == counts.submitted == 2


async def test_a_stream_counts_when_it_ends_and_in_time_by_its_first_element() -> None:
    async def model(batch: list[int]) -> AsyncIterator[list[int]]:
        yield batch
        await asyncio.sleep(0.05)
        yield batch

    async with AdaptiveBatcher(
        model, max_batch_size=1, window_ms=0, slo=SLO(latency_ms=20)
    ) as batcher:
        stream = batcher.submit_stream(1)
        assert await anext(stream) == 1
        assert batcher.stats().counts.completed == 0  # its outcome is not known yet
        assert [x async for x in stream] == [1]
        counts = batcher.stats().counts
    assert (counts.completed, counts.within_slo) == (1, 1)  # first element within 20 ms
    assert batcher.stats().latency.count == 1


async def test_a_stream_whose_model_yields_nothing_ends_counted() -> None:
    """Before: a model whose generator yielded no step ended its streams uncounted (the five
    outcomes summed to one less than submitted)."""

    async def model(batch: list[int]) -> AsyncIterator[list[int]]:
        return
        yield batch  # pragma: no cover - makes this an async generator

    async with AdaptiveBatcher(model, max_batch_size=1, window_ms=0) as batcher:
        assert [x async for x in batcher.submit_stream(1)] == []
        counts = batcher.stats().counts
    assert (counts.submitted, counts.completed, counts.within_slo) == (1, 1, 1)


def test_the_core_refuses_a_count_that_goes_down() -> None:
    core: BatcherCore[int] = BatcherCore(BatcherSettings())
    with pytest.raises(ValueError, match=r"^a count only goes up; got a change of -1$"):
        core.count_failed(-1)
    with pytest.raises(ValueError, match=r"^within_slo must be in 0\.\.1, got 2$"):
        core.count_completed(1, 2)
    core.count_completed(2, 1)
    core.count_cancelled(1)
    core.count_expired(1)
    core.count_rejected(1)
    counts = core.recorder.counts()
    assert (counts.completed, counts.within_slo, counts.cancelled) == (2, 1, 1)
    assert (counts.expired, counts.rejected, counts.failed) == (1, 1, 0)


# -- random runs ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Caller:
    deadline_ms: float | None
    cancel_at_ms: float | None  # the caller's task is cancelled then
    reads: int | None  # a stream reader stops (aclose) after this many elements; None: all
    plain: bool  # on a streaming model: submit() instead of submit_stream()
    slot_error_at: int | None  # the model puts an exception in this caller's slot at that step
    ends_at: int | None  # the model ends this caller's stream at that step (StopIteration)


@dataclass(frozen=True)
class Scenario:
    streaming: bool
    steps: int
    step_ms: float
    fail_at: int | None  # the model raises at that step
    window_ms: float
    max_batch_size: int
    slo_ms: float
    callers: tuple[Caller, ...]
    close_at_ms: float
    drain: bool
    close_timeout_ms: float | None


callers = st.builds(
    Caller,
    deadline_ms=st.none() | st.sampled_from([1.0, 5.0, 30.0]),
    cancel_at_ms=st.none() | st.floats(0.0, 40.0),
    reads=st.none() | st.integers(0, 3),
    plain=st.booleans(),
    slot_error_at=st.none() | st.integers(0, 3),
    ends_at=st.none() | st.integers(0, 3),
)
scenarios = st.builds(
    Scenario,
    streaming=st.booleans(),
    steps=st.integers(0, 4),
    step_ms=st.sampled_from([0.0, 2.0, 7.0]),
    fail_at=st.none() | st.integers(0, 3),
    window_ms=st.sampled_from([0.0, 3.0]),
    max_batch_size=st.integers(1, 4),
    slo_ms=st.sampled_from([4.0, 15.0, 1e4]),
    callers=st.lists(callers, min_size=1, max_size=8).map(tuple),
    close_at_ms=st.floats(0.0, 60.0),
    drain=st.booleans(),
    close_timeout_ms=st.none() | st.sampled_from([0.0, 5.0]),
)


def make_model(scenario: Scenario) -> Any:
    def element(item: Caller, step: int) -> Any:
        if item.slot_error_at == step:
            return ValueError("slot")
        if item.ends_at == step:
            return StopIteration
        return step

    if scenario.streaming:

        async def stream_model(batch: list[Caller]) -> AsyncIterator[list[Any]]:
            for step in range(scenario.steps):
                await asyncio.sleep(scenario.step_ms / 1e3)
                if scenario.fail_at == step:
                    raise RuntimeError("model failed")
                yield [element(item, step) for item in batch]

        return stream_model

    async def batch_model(batch: list[Caller]) -> list[Any]:
        await asyncio.sleep(scenario.step_ms / 1e3)
        if scenario.fail_at == 0:
            raise RuntimeError("model failed")
        return [ValueError("slot") if item.slot_error_at == 0 else 0 for item in batch]

    return batch_model


async def call(
    batcher: AdaptiveBatcher[Any, Any], streaming: bool, caller: Caller, watch: CountWatch
) -> None:
    if not streaming or caller.plain:
        await batcher.submit(caller, deadline_ms=caller.deadline_ms)
        watch.check()
        return
    stream = batcher.submit_stream(caller, deadline_ms=caller.deadline_ms)
    read = 0
    try:
        async for _ in stream:
            watch.check()
            read += 1
            if caller.reads is not None and read >= caller.reads:
                break
    finally:
        await stream.aclose()
        watch.check()


async def run(scenario: Scenario) -> tuple[Counts, int]:
    loop = asyncio.get_running_loop()
    batcher = AdaptiveBatcher(
        make_model(scenario),
        max_batch_size=scenario.max_batch_size,
        window_ms=scenario.window_ms,
        slo=SLO(latency_ms=scenario.slo_ms),
    )
    batcher.set_policy(None)  # fixed settings: the scenario's window and cap
    watch = CountWatch(batcher)
    watch.every(0.001)
    tasks = []
    for caller in scenario.callers:
        task = asyncio.ensure_future(call(batcher, scenario.streaming, caller, watch))
        if caller.cancel_at_ms is not None:
            loop.call_later(caller.cancel_at_ms / 1e3, task.cancel)
        tasks.append(task)
    await asyncio.sleep(scenario.close_at_ms / 1e3)
    timeout_s = None if scenario.close_timeout_ms is None else scenario.close_timeout_ms / 1e3
    await batcher.aclose(drain=scenario.drain, timeout_s=timeout_s)
    for task in tasks:
        with contextlib.suppress(BaseException):
            await task
    await asyncio.sleep(0.1)  # cancelled batches wind down
    watch.stop()
    return watch.check(), watch.samples


@settings(max_examples=150, deadline=None)
@given(scenarios)
def test_counts_only_go_up_and_add_up_on_random_runs(scenario: Scenario) -> None:
    counts, samples = run_in_virtual_time(run(scenario))
    assert counts.submitted == len(scenario.callers)
    assert ended(counts) == counts.submitted, counts
    assert counts.within_slo <= counts.completed
    assert samples > len(scenario.callers)

"""Failure isolation: per-slot exceptions, whole-batch failures, bisection, OOM split, counts."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch
from structlog.testing import capture_logs

from adaptive_batcher import (
    SLO,
    AdaptiveBatcher,
    BatcherError,
    BatchFailedError,
    PaddingError,
    ResultCountError,
)
from adaptive_batcher.testing import EchoModel


async def gather_outcomes(batcher: AdaptiveBatcher[Any, Any], items: list[Any]) -> list[Any]:
    return await asyncio.gather(*(batcher.submit(i) for i in items), return_exceptions=True)


async def test_exception_in_one_slot_fails_only_that_caller() -> None:
    async def model(batch: list[int]) -> list[Any]:
        return [KeyError(i) if i == 3 else i * 10 for i in batch]

    async with AdaptiveBatcher(model, max_batch_size=8, window_ms=1) as batcher:
        outcomes = await gather_outcomes(batcher, list(range(6)))
    assert outcomes[:3] == [0, 10, 20] and outcomes[4:] == [40, 50]
    assert isinstance(outcomes[3], KeyError)
    assert batcher.stats().counts.failed == 1
    assert batcher.stats().counts.completed == 5


async def test_whole_batch_exception_fails_every_caller_with_cause() -> None:
    model = EchoModel(fail_on=[2])
    with capture_logs() as logs:
        async with AdaptiveBatcher(model, max_batch_size=8, window_ms=1) as batcher:
            outcomes = await gather_outcomes(batcher, [0, 1, 2, 3])
    assert all(isinstance(o, BatchFailedError) for o in outcomes)
    assert all(isinstance(o.__cause__, ValueError) for o in outcomes)
    assert len({id(o) for o in outcomes}) == 4  # each caller gets its own exception object
    assert str(outcomes[0]) == "model failed on a batch of 4: ValueError('poisoned item 2')"
    failed = [e for e in logs if e["event"] == "batch.failed"]
    assert failed and failed[0]["batch_size"] == 4 and failed[0]["log_level"] == "warning"


async def test_bisect_isolates_the_poisoned_item() -> None:
    model = EchoModel(fail_on=[5])
    async with AdaptiveBatcher(
        model, max_batch_size=8, window_ms=1, bisect_on_error=True
    ) as batcher:
        outcomes = await gather_outcomes(batcher, list(range(8)))
    assert [o for i, o in enumerate(outcomes) if i != 5] == [0, 1, 2, 3, 4, 6, 7]
    assert isinstance(outcomes[5], BatchFailedError)
    assert outcomes[5].batch_size == 1
    assert sorted(model.sizes) == sorted([8, 4, 4, 2, 2, 1, 1])


async def test_out_of_memory_batch_is_split_and_nothing_is_lost() -> None:
    sizes: list[int] = []

    def model(batch: list[int]) -> list[int]:
        sizes.append(len(batch))
        if len(batch) > 2:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return [i + 1 for i in batch]

    async with AdaptiveBatcher(model, max_batch_size=8, window_ms=1, executor="inline") as b:
        outcomes = await gather_outcomes(b, list(range(8)))
    assert outcomes == [i + 1 for i in range(8)]
    assert sizes == [8, 4, 2, 2, 4, 2, 2]
    assert b.stats().counts.oom_errors == 3


async def test_the_cpu_allocators_out_of_memory_error_is_split_too() -> None:
    """torch's CPU allocator raises a RuntimeError that says "can't allocate memory", not "out
    of memory": before, such a batch failed whole (a fresh user's finding, 2026-12-06)."""
    sizes: list[int] = []

    def model(batch: list[int]) -> list[int]:
        sizes.append(len(batch))
        if len(batch) > 2:
            torch.empty(1 << 62, dtype=torch.uint8)  # the allocator refuses: RuntimeError
        return [i + 1 for i in batch]

    async with AdaptiveBatcher(model, max_batch_size=4, window_ms=1, executor="inline") as b:
        outcomes = await gather_outcomes(b, list(range(4)))
    assert outcomes == [1, 2, 3, 4]
    assert sizes == [4, 2, 2]
    assert b.stats().counts.oom_errors == 1


async def test_every_out_of_memory_error_is_counted_split_or_not() -> None:
    # a single item that ran out of memory cannot be split: it was not counted
    def model(batch: list[int]) -> list[int]:
        if 9 in batch:
            raise MemoryError("out of memory")
        return batch

    async with AdaptiveBatcher(model, max_batch_size=8, window_ms=1, executor="inline") as b:
        alone = await gather_outcomes(b, [9])
        assert b.stats().counts.oom_errors == 1
        pair = await gather_outcomes(b, [1, 9])  # the pair, then 9 alone: two OOMs
    assert isinstance(alone[0], BatchFailedError) and isinstance(pair[1], BatchFailedError)
    assert pair[0] == 1
    assert b.stats().counts.oom_errors == 3


@pytest.mark.parametrize("returned", [[1], [1, 2, 3, 4, 5], None])
async def test_wrong_result_count_fails_every_caller_clearly(returned: Any) -> None:
    def model(batch: list[int]) -> Any:
        return returned

    async with AdaptiveBatcher(model, max_batch_size=4, window_ms=1, executor="inline") as b:
        outcomes = await gather_outcomes(b, [0, 1, 2, 3])
    assert all(isinstance(o, ResultCountError) for o in outcomes)
    assert all(isinstance(o, BatcherError) for o in outcomes)
    expected = (
        "model returned NoneType, expected a sequence of 4 results"
        if returned is None
        else f"model returned {len(returned)} results for a batch of 4"
    )
    assert str(outcomes[0]) == expected


@pytest.mark.parametrize("executor", ["inline", "thread", "async"])
@pytest.mark.parametrize("buckets", [None, [4]])
async def test_a_model_that_empties_its_input_gets_a_result_count_error(
    executor: str, buckets: list[int] | None
) -> None:
    """The batch is counted before the model runs: a model that clears its input list and
    returns no results is a wrong result count, not an internal zip() error."""

    def clearing(batch: list[int]) -> list[int]:
        batch.clear()
        return []

    async def clearing_async(batch: list[int]) -> list[int]:
        return clearing(batch)

    model = clearing_async if executor == "async" else clearing
    async with AdaptiveBatcher(
        model, max_batch_size=4, window_ms=1, executor=executor, batch_sizes=buckets
    ) as b:
        outcomes = await gather_outcomes(b, [0, 1, 2])
        with pytest.raises(ResultCountError, match="model returned 0 results for a batch of"):
            await b.warmup(lambda: 0)
    assert all(isinstance(o, ResultCountError) for o in outcomes), outcomes
    padded = 3 if buckets is None else 4
    assert str(outcomes[0]) == f"model returned 0 results for a batch of {padded}"


@pytest.mark.parametrize(
    ("pad_fn", "message"),
    [
        (lambda items, n: items, "pad_fn returned 3 items for a batch of 3 padded to 4"),
        (lambda items, n: items[:2], "pad_fn returned 2 items for a batch of 3 padded to 4"),
        (lambda items, n: items * 2, "pad_fn returned 6 items for a batch of 3 padded to 4"),
        (lambda items, n: None, "pad_fn returned NoneType, expected a list of 4 items"),
    ],
)
@pytest.mark.parametrize("bisect", [False, True])
async def test_a_pad_fn_of_the_wrong_length_fails_its_batch_clearly(
    pad_fn: Any, message: str, bisect: bool
) -> None:
    # it used to run the model on an unpadded (cold) shape, or hand one caller a zip() error
    model = EchoModel()
    with capture_logs() as logs:
        async with AdaptiveBatcher(
            model, max_batch_size=4, window_ms=20, batch_sizes=[4], pad_fn=pad_fn,
            bisect_on_error=bisect,
        ) as b:  # fmt: skip
            outcomes = await gather_outcomes(b, [0, 1, 2])
            full = await gather_outcomes(b, [4, 5, 6, 7])  # a full bucket needs no padding
    assert all(isinstance(o, PaddingError) for o in outcomes)
    assert len({id(o) for o in outcomes}) == 3  # each caller gets its own exception object
    assert str(outcomes[0]).startswith(message)
    assert full == [4, 5, 6, 7] and model.sizes == [4]  # the padded batch never ran
    assert b.stats().counts.failed == 3
    events = [e for e in logs if e["event"] == "batch.pad_failed"]
    assert len(events) == 1 and events[0]["log_level"] == "warning"
    assert (events[0]["batch_size"], events[0]["failed"]) == (3, 3)


def _dividing_pad(items: list[int], target: int) -> list[int]:
    return [*items, *([items[-1] // 0] * (target - len(items)))]


@pytest.mark.parametrize("bisect", [False, True])
async def test_a_pad_fn_that_raises_fails_its_batch_with_padding_error(bisect: bool) -> None:
    """Each caller gets its own PaddingError naming pad_fn, its cause the pad_fn's exception;
    the model is not called (it was reported as the model's failure, BatchFailedError)."""
    model = EchoModel()
    with capture_logs() as logs:
        async with AdaptiveBatcher(
            model, max_batch_size=4, window_ms=20, batch_sizes=[4], pad_fn=_dividing_pad,
            bisect_on_error=bisect,
        ) as b:  # fmt: skip
            outcomes = await gather_outcomes(b, [0, 1, 2])
    assert all(type(o) is PaddingError for o in outcomes), outcomes
    assert len({id(o) for o in outcomes}) == 3
    assert str(outcomes[0]) == (
        "pad_fn raised ZeroDivisionError('integer division or modulo by zero') "
        "padding a batch of 3 to 4"
    )
    assert all(isinstance(o.__cause__, ZeroDivisionError) for o in outcomes)
    assert model.sizes == []
    assert b.stats().counts.failed == 3
    assert [e["event"] for e in logs if e["event"].startswith("batch.")].count(
        "batch.pad_failed"
    ) == 1


async def test_a_pad_fn_returning_fewer_items_than_sized_requests_fails_them() -> None:
    model = EchoModel()
    async with AdaptiveBatcher(
        model, max_batch_size=8, window_ms=20, batch_sizes=[8], size_fn=len,
        pad_fn=lambda items, n: items[:1],
    ) as b:  # fmt: skip
        outcomes = await gather_outcomes(b, ["ab", "cde"])
    assert all(isinstance(o, PaddingError) for o in outcomes)
    assert str(outcomes[0]) == (
        "pad_fn returned 1 items for a batch of 2 padded to 8 units; expected at least 2 "
        "items, the batch's own first"
    )
    assert model.sizes == []


async def test_a_failed_batch_does_not_stop_later_batches() -> None:
    model = EchoModel(fail_on=["bad"])
    async with AdaptiveBatcher(model, max_batch_size=2, window_ms=0) as batcher:
        first = await gather_outcomes(batcher, ["bad"])
        second = await batcher.submit("good")
    assert isinstance(first[0], BatchFailedError)
    assert second == "good"


async def test_cancelled_caller_while_its_batch_runs_breaks_nothing() -> None:
    model = EchoModel(delay_s=0.030)
    async with AdaptiveBatcher(model, max_batch_size=4, window_ms=0) as batcher:
        running = asyncio.create_task(batcher.submit("a"))
        neighbour = asyncio.create_task(batcher.submit("b"))
        await asyncio.sleep(0.010)
        running.cancel()  # its batch already started: the result is dropped, not set
        with pytest.raises(asyncio.CancelledError):
            await running
        assert await neighbour == "b"
        assert await batcher.submit("c") == "c"
    assert model.seen == ["a", "b", "c"]


async def test_a_plain_function_returning_a_coroutine_is_told_to_be_async() -> None:
    async def forward(batch: list[int]) -> list[int]:
        return batch

    made: list[Any] = []

    def model(batch: list[int]) -> Any:
        made.append(forward(batch))  # a coroutine, never awaited by a plain function
        return made[-1]

    async with AdaptiveBatcher(model, max_batch_size=2, window_ms=1, executor="inline") as b:
        outcomes = await gather_outcomes(b, [0, 1])
    for coroutine in made:
        coroutine.close()  # no "never awaited" warning later, in another test
    assert all(isinstance(o, ResultCountError) for o in outcomes)
    assert "make the model itself `async def`" in str(outcomes[0])


async def test_an_out_of_memory_error_isolated_to_one_request_is_counted_as_such() -> None:
    """The splitting traces an OOM to request 9, which runs out of memory alone (8, 4, 2 and
    then 9 itself: four calls): all four are counted, as isolated; a batch that ran out of
    memory for its size (above 2 items) is not."""

    def model(batch: list[int]) -> list[int]:
        if 9 in batch or (len(batch) > 2 and 99 in batch):
            raise MemoryError("out of memory")
        return batch

    async with AdaptiveBatcher(model, max_batch_size=8, window_ms=1, executor="inline") as b:
        poisoned = await gather_outcomes(b, [1, 2, 3, 4, 5, 6, 7, 9])
        assert b.stats().counts.oom_errors == b.stats().counts.oom_isolated == 4
        sized = await gather_outcomes(b, [1, 2, 3, 99])  # 4 fails, 2 and 2 run
    assert poisoned[:7] == [1, 2, 3, 4, 5, 6, 7] and isinstance(poisoned[7], BatchFailedError)
    assert sized == [1, 2, 3, 99]
    counts = b.stats().counts
    assert (counts.oom_errors, counts.oom_isolated, counts.oom_size_errors) == (5, 4, 1)


async def test_a_request_that_runs_out_of_memory_alone_does_not_hide_a_size_error() -> None:
    """32 items where 13 or more run out of memory, request 9 among them: the batch of 32
    and the half of 16 without 9 failed for their size (both halves of 32 failed; the halves
    of that 16 ran), and count so; the half with 9 traces down to it (isolated)."""

    def model(batch: list[int]) -> list[int]:
        if 9 in batch or len(batch) > 12:
            raise MemoryError("out of memory")
        return batch

    items = [i for i in range(100, 131)] + [9]
    async with AdaptiveBatcher(model, max_batch_size=32, window_ms=5, executor="inline") as b:
        outcomes = await gather_outcomes(b, items)
    assert outcomes[:31] == items[:31] and isinstance(outcomes[31], BatchFailedError)
    counts = b.stats().counts
    assert counts.oom_size_errors == 2
    assert counts.oom_isolated == counts.oom_errors - 2 > 0


async def test_a_request_that_leaves_during_the_split_leaves_the_cause_unknown() -> None:
    """Request 9 runs out of memory in any batch; its caller gives up while the batch is
    split: the halves without it run, and the OOM is not put down to the batch's size (the
    cause left with it), so the memory guard leaves the cap."""
    poison: asyncio.Future[Any] | None = None

    async def model(batch: list[int]) -> list[int]:
        if 9 in batch:
            if poison is not None:
                poison.cancel()
            await asyncio.sleep(0.005)  # the caller's cancellation lands before the halves
            raise MemoryError("out of memory")
        return batch

    async with AdaptiveBatcher(model, max_batch_size=8, window_ms=5) as b:
        poison = asyncio.ensure_future(b.submit(9))
        others = [asyncio.ensure_future(b.submit(i)) for i in range(7)]
        assert await asyncio.gather(*others) == list(range(7))
        with pytest.raises(asyncio.CancelledError):
            await poison
    counts = b.stats().counts
    assert (counts.oom_errors, counts.oom_size_errors, counts.oom_isolated) == (1, 0, 1)


async def test_a_request_that_runs_out_of_memory_alone_leaves_the_cap() -> None:
    """A request that always runs out of memory, arriving among others: the memory guard does
    not halve the cap for it (before, each one halved the cap, to 1 for all traffic)."""

    def model(batch: list[int]) -> list[int]:
        if -1 in batch:
            raise MemoryError("out of memory")
        return batch

    profile = [(n, 1.0) for n in (1, 2, 4, 8, 16, 32, 64)]
    async with AdaptiveBatcher(
        model,
        max_batch_size=64,
        window_ms=1,
        slo=SLO(latency_ms=500),
        service_profile=profile,
        control_interval_ms=10,
        executor="inline",
    ) as b:
        for _ in range(3):
            outcomes = await gather_outcomes(b, [*range(20), -1])
            assert isinstance(outcomes[-1], BatchFailedError)
            await asyncio.sleep(0.05)  # controller ticks
        stats = b.stats()
    assert stats.decisions > 0 and "out_of_memory" not in stats.decision_reasons
    assert stats.max_batch_size == 64
    assert stats.counts.oom_errors == stats.counts.oom_isolated > 0
    assert stats.counts.oom_size_errors == 0


async def test_after_a_partial_batch_runs_out_of_memory_the_next_one_fits() -> None:
    """Batches of 24 requests under a cap of 64, where more than 20 run out of memory: the
    memory guard's ceiling goes between the halves that ran and the batch that failed (18),
    not to half the cap (32, where the next batch of 24 failed again)."""
    sizes: list[int] = []

    def model(batch: list[int]) -> list[int]:
        sizes.append(len(batch))
        if len(batch) > 20:
            raise MemoryError("out of memory")
        return batch

    profile = [(n, 1.0) for n in (1, 2, 4, 8, 16, 32, 64)]
    async with AdaptiveBatcher(
        model,
        max_batch_size=64,
        window_ms=5,
        slo=SLO(latency_ms=500),
        service_profile=profile,
        control_interval_ms=10,
        executor="inline",
    ) as b:
        for _ in range(4):
            assert await gather_outcomes(b, list(range(24))) == list(range(24))
            await asyncio.sleep(0.05)  # controller ticks
        stats = b.stats()
    assert stats.counts.oom_size_errors == 1 and stats.counts.oom_errors == 1
    assert stats.max_batch_size == 18 and max(sizes[3:]) == 18


def _fits_up_to(limit: int, sizes: list[int]) -> Any:
    def model(batch: list[int]) -> list[int]:
        sizes.append(len(batch))
        if len(batch) > limit:
            raise MemoryError("out of memory")
        return batch

    return model


async def test_warmup_that_runs_out_of_memory_keeps_what_fits_and_caps_below_it() -> None:
    """The cap (64) runs out of memory at warm-up: the sizes up to 32 are warmed, the failed
    size is counted, and the first batches served stay at or below 32 (before, the warm-up
    raised the model's error and the controller learned nothing)."""
    sizes: list[int] = []
    async with AdaptiveBatcher(
        _fits_up_to(40, sizes),
        max_batch_size=64,
        window_ms=20,
        slo=SLO(latency_ms=500),
        control_interval_ms=10,
        executor="inline",
    ) as b:
        with capture_logs() as logs:
            timings = await b.warmup(lambda: 0)
        assert sorted(timings) == [1, 2, 4, 8, 16, 32] == sorted(b.warmed_sizes)
        assert b.stats().max_batch_size <= 32  # at once, not at the first request's tick
        served = len(sizes)
        assert await gather_outcomes(b, list(range(64))) == list(range(64))
        counts = b.stats().counts
    assert [e["batch_size"] for e in logs if e["event"] == "batcher.warmup_out_of_memory"] == [64]
    assert (counts.oom_errors, counts.oom_size_errors) == (1, 1)
    assert max(sizes[served:]) <= 32


@pytest.mark.parametrize(("fits", "controlled"), [(40, False), (0, True)])
async def test_warmup_out_of_memory_raises_without_a_controller_or_at_the_smallest_size(
    fits: int, controlled: bool
) -> None:
    sizes: list[int] = []
    slo = SLO(latency_ms=500) if controlled else None
    async with AdaptiveBatcher(
        _fits_up_to(fits, sizes), max_batch_size=64, window_ms=1, slo=slo, executor="inline"
    ) as b:
        with pytest.raises(MemoryError):
            await b.warmup(lambda: 0)
    assert sizes[-1] == (64 if fits else 1)


async def test_a_split_batch_counts_the_calls_that_ran_not_the_one_that_failed() -> None:
    """A batch of 8 runs out of memory and runs as two calls of 4: the service-time fit and
    ``stats()`` see two batches of 4 with their own times (as the simulator counts them);
    before, one batch of 8 whose time held the failed call and both halves."""
    sizes: list[int] = []

    async def model(batch: list[int]) -> list[int]:
        sizes.append(len(batch))
        await asyncio.sleep(0.01)
        if len(batch) > 4:
            raise MemoryError("out of memory")
        return batch

    async with AdaptiveBatcher(model, max_batch_size=8, window_ms=5) as b:
        assert await gather_outcomes(b, list(range(8))) == list(range(8))
        stats = b.stats()
        runs = list(b.recorder.batches)
    assert sizes == [8, 4, 4]
    assert dict(stats.batch_sizes) == {4: 2} and stats.counts.batches == 2
    assert [run.items for run in runs] == [4, 4]
    # each run is its own call; the failed call (>= 10 ms) is device time, not a run's
    assert all(run.service_s >= 0.009 for run in runs)
    assert sum(run.service_s for run in runs) <= stats.counts.device_busy_s - 0.009

"""A request's deadline bounds its queue delay: one that falls before the window closes starts
the batch early on a batcher with a free slot, instead of expiring (Triton's rule: a request's
timeout bounds its queue delay). The engine holds the rule, so the runtime and replays agree.
On a virtual clock: every time is exact."""

from __future__ import annotations

import asyncio

import numpy as np

from adaptive_batcher import SLO, AdaptiveBatcher, DeadlineExceededError
from adaptive_batcher.sim.service import LinearService
from adaptive_batcher.sim.simulator import SimConfig, Simulator
from adaptive_batcher.sim.workloads import Poisson
from adaptive_batcher.testing import run_in_virtual_time
from adaptive_batcher.testing.virtual_time import VirtualClockLoop


async def echo_after_1ms(batch: list[int]) -> list[int]:
    await asyncio.sleep(0.001)
    return batch


def test_a_deadline_shorter_than_the_window_is_met_on_an_idle_batcher() -> None:
    """Before: window 200 ms, nothing running, deadline_ms=20: DeadlineExceededError at 20 ms
    although the slot was free."""

    async def main() -> tuple[int, float]:
        loop = asyncio.get_running_loop()
        async with AdaptiveBatcher(echo_after_1ms, max_batch_size=8, window_ms=200) as batcher:
            result = await batcher.submit(7, deadline_ms=20)
            return result, loop.time()

    result, answered_s = run_in_virtual_time(main())
    assert result == 7
    assert answered_s == 0.021  # started at its 20 ms deadline, 1 ms of model


def test_requests_without_a_deadline_still_wait_for_the_window_or_go_with_one() -> None:
    async def main() -> list[float]:
        loop = asyncio.get_running_loop()
        async with AdaptiveBatcher(echo_after_1ms, max_batch_size=8, window_ms=200) as batcher:
            times: list[float] = []

            async def call(x: int, deadline_ms: float | None, after_s: float) -> None:
                await asyncio.sleep(after_s)
                await batcher.submit(x, deadline_ms=deadline_ms)
                times.append(loop.time())

            await asyncio.gather(call(0, None, 0.0), call(1, 30, 0.005))
            await call(2, None, 0.0)  # alone: the whole window
            return times

    first, second, alone = run_in_virtual_time(main())
    assert first == second == 0.036  # both in the batch the 35 ms deadline started
    assert alone == 0.036 + 0.201


def test_an_slo_batcher_meets_short_deadlines_at_light_load() -> None:
    """Before: with an SLO the controller widened the window to ~100 ms itself and 356 of 400
    requests with deadline_ms=30 expired on an idle model."""

    async def main() -> tuple[int, int]:
        async with AdaptiveBatcher(
            echo_after_1ms, max_batch_size=32, window_ms=5, slo=SLO(latency_ms=200)
        ) as batcher:
            expired = 0
            for i in range(400):
                await asyncio.sleep(0.01)
                try:
                    await batcher.submit(i, deadline_ms=30)
                except DeadlineExceededError:
                    expired += 1
            return expired, batcher.stats().counts.completed

    expired, completed = run_in_virtual_time(main())
    assert (expired, completed) == (0, 400)


def test_a_replay_with_deadlines_shorter_than_the_window_answers_them() -> None:
    """The same rule in a replay: the engine is shared."""
    arrivals = Poisson(20.0).generate(10.0, np.random.default_rng(0))
    config = SimConfig(max_batch_size=32, window_ms=200.0, deadline_ms=30.0)
    result = Simulator(LinearService(0.001, 0.0001), config).run(arrivals)
    assert result.expired == 0
    assert result.completed == result.requests


def test_a_deadline_that_passes_while_the_loop_holds_a_dispatched_batch_fails_it() -> None:
    """Before: a batch formed just before the event loop stood still ran once the loop came
    back, and answered its requests whose deadline had passed meanwhile (a cold burst right
    after ``warmup()``: every answer late, with ``shed_late=True``). Now they fail as if the
    loop had polled at their deadline; a request whose own deadline started its batch runs."""

    async def main() -> tuple[list[int], list[object], int]:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, VirtualClockLoop)
        seen: list[int] = []

        async def model(batch: list[int]) -> list[int]:
            seen.extend(batch)
            return batch

        batcher = AdaptiveBatcher(model, max_batch_size=8, window_ms=0)
        calls = [
            asyncio.ensure_future(batcher.submit(1, deadline_ms=20)),
            asyncio.ensure_future(batcher.submit(2, deadline_ms=500)),
            asyncio.ensure_future(batcher.submit(3)),
        ]
        # the callers queue their requests and the pump forms their batch at 0 ms; then, before
        # the batch's task runs, the loop stands still for 50 ms
        loop.call_soon(loop.call_soon, loop.stall, 0.05)
        results = await asyncio.gather(*calls, return_exceptions=True)
        expired = batcher.stats().counts.expired
        await batcher.aclose()
        return seen, results, expired

    seen, results, expired = run_in_virtual_time(main())
    assert seen == [2, 3]
    assert isinstance(results[0], DeadlineExceededError) and results[1:] == [2, 3]
    assert expired == 1


def test_a_request_whose_deadline_started_its_batch_runs_after_a_stall() -> None:
    async def main() -> tuple[int, float]:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, VirtualClockLoop)
        async with AdaptiveBatcher(echo_after_1ms, max_batch_size=8, window_ms=200) as batcher:
            # the 20 ms deadline starts the batch at 20 ms; the loop then stands still 50 ms
            loop.call_at(0.02, loop.call_soon, loop.stall, 0.05)
            result = await batcher.submit(7, deadline_ms=20)
            return result, loop.time()

    result, answered_s = run_in_virtual_time(main())
    assert result == 7
    assert answered_s > 0.07  # ran after the stall, not failed


def test_deadlines_that_pass_while_the_loop_stands_still_fail_them() -> None:
    """A fresh user's trial: window 20 ms, deadlines of 10 and 15 ms, the loop blocked from 0
    to 50 ms: both were answered, their model call beginning 35-40 ms after their deadlines.
    Now they fail, and the model never runs."""

    async def main() -> tuple[list[object], list[int]]:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, VirtualClockLoop)
        seen: list[int] = []

        async def model(batch: list[int]) -> list[int]:
            seen.extend(batch)
            return batch

        async with AdaptiveBatcher(model, max_batch_size=8, window_ms=20) as batcher:
            calls = [
                asyncio.ensure_future(batcher.submit(1, deadline_ms=10)),
                asyncio.ensure_future(batcher.submit(2, deadline_ms=15)),
            ]
            loop.call_soon(loop.call_soon, loop.stall, 0.05)  # once both have queued
            results = await asyncio.gather(*calls, return_exceptions=True)
        return results, seen

    results, seen = run_in_virtual_time(main())
    assert all(isinstance(r, DeadlineExceededError) for r in results)
    assert seen == []


async def hung_after_six_batches(
    *, warmup: bool
) -> tuple[AdaptiveBatcher[int, int], list[asyncio.Future[int]]]:
    """A batcher (SLO 50 ms, ``shed_late=True``, cap 8) that ran six batches of 8 (20 ms each)
    and then one whose model call never returns: every later request queues behind it. Also
    returns the hung batch's calls."""
    stuck = asyncio.Event()

    async def model(batch: list[int]) -> list[int]:
        await asyncio.sleep(3600 if stuck.is_set() else 0.02)
        return batch

    batcher = AdaptiveBatcher(
        model, max_batch_size=8, window_ms=2, slo=SLO(latency_ms=50), shed_late=True
    )
    if warmup:
        await batcher.warmup(lambda: 0)
    for _ in range(6):
        await batcher.submit_many(range(8))
    stuck.set()  # from now on the model hangs: nothing queued can start
    return batcher, [asyncio.ensure_future(batcher.submit(k)) for k in range(8)]


def test_a_request_shed_for_the_slo_says_so_and_one_past_its_own_deadline_says_that() -> None:
    """Before: a request shed by ``shed_late`` failed with "did not start before its deadline",
    a deadline its caller never set (a fresh user's finding, 2026-12-06)."""

    async def main() -> list[BaseException | int]:
        batcher, hung = await hung_after_six_batches(warmup=True)
        await asyncio.sleep(0.1)
        calls = [
            batcher.submit(1, deadline_ms=5),  # its own deadline comes before the shedding's
            batcher.submit(2),
            batcher.submit(3, deadline_ms=10_000),
        ]
        results = await asyncio.gather(*calls, return_exceptions=True)
        await batcher.aclose(drain=False, timeout_s=0.1)
        await asyncio.gather(*hung, return_exceptions=True)
        return results

    own, shed, shed_too = run_in_virtual_time(main())
    assert isinstance(own, DeadlineExceededError)
    assert str(own) == "request did not start before its deadline"
    for error in (shed, shed_too):
        assert isinstance(error, DeadlineExceededError)
        assert str(error) == "request shed: it could not start in time to meet the SLO (shed_late)"


def test_a_model_that_hangs_before_the_first_tick_still_has_its_queue_shed() -> None:
    """Before: without a warm-up, six batches and then a model call that never returns left
    every later request queued until ``aclose`` (no tick had set a shedding deadline, and
    nothing polled to tick). Now the queue is shed (a fresh user's finding, 2026-12-06)."""

    async def main() -> tuple[list[BaseException | int | None], int]:
        batcher, hung = await hung_after_six_batches(warmup=False)
        queued = []
        for k in range(20):  # 10 a second for 2 s behind the hung call
            queued.append(asyncio.ensure_future(batcher.submit(k)))
            await asyncio.sleep(0.1)
        await asyncio.sleep(1.0)
        done = [q.exception() if q.done() else -1 for q in queued]
        expired = batcher.stats().counts.expired
        await batcher.aclose(drain=False, timeout_s=0.1)
        await asyncio.gather(*hung, *queued, return_exceptions=True)
        return done, expired

    done, expired = run_in_virtual_time(main())
    assert expired == 20
    assert all(isinstance(error, DeadlineExceededError) for error in done)

"""Closing a batcher: stop taking requests, settle every pending one, release the threads."""

from __future__ import annotations

import asyncio

from adaptive_batcher._log import get_logger
from adaptive_batcher.errors import BatcherClosedError
from adaptive_batcher.runtime.driver import LoopDriver
from adaptive_batcher.runtime.executors import BatchExecutor
from adaptive_batcher.telemetry.sampler import TelemetrySampler

__all__ = ["Shutdown"]

_log = get_logger()


class Shutdown:
    """The close of one batcher (see ``AdaptiveBatcher.aclose``).

    Args:
        driver: the batcher's loop driver (its core, registry and timer).
        executor: where the model runs; its threads are released at the end.
        sampler: the telemetry sampler to stop, if any.
    """

    def __init__(
        self, driver: LoopDriver, executor: BatchExecutor, sampler: TelemetrySampler | None
    ) -> None:
        self.driver = driver
        self.executor = executor
        self.sampler = sampler
        self.closer: asyncio.Future[None] | None = None  # a close awaited by the model

    async def close(self, drain: bool, timeout_s: float | None) -> None:
        """Stop accepting requests; fail the queue unless ``drain``; then wait for every
        request to end (at most ``timeout_s``, then abort) and release. Awaited by the model
        inside one of the batcher's own batches, the waiting runs in a task of its own."""
        driver = self.driver
        first = not driver.closed
        driver.closed = True
        rejected = driver.core.close(drain=drain)
        driver.fail_unstarted(rejected)
        if first or rejected:
            _log.info("batcher.closing", batcher=driver.name, drain=drain, rejected=len(rejected))
        if driver.in_flight.owns(asyncio.current_task()):  # awaited by the model
            self.closer = asyncio.ensure_future(self._finish(timeout_s))
            return
        await self._finish(timeout_s)

    async def _finish(self, timeout_s: float | None) -> None:
        """Dispatch what is left, wait for every request to end (at most ``timeout_s``, then
        abort), and release the threads and the timer."""
        try:
            if self.driver.loop is not None:
                self.driver.pump()
            if not await self._settles_within(timeout_s):
                await self._abort()
        finally:
            self.release()

    async def _settles_within(self, timeout_s: float | None) -> bool:
        """Wait until every request has ended, for at most ``timeout_s``; True if they did.
        The wait ends at the timeout itself (``wait_for`` would first wait for its cancellation,
        while inline batches went on starting)."""
        if timeout_s == 0:
            return self._settled_now()
        settled = asyncio.ensure_future(self._settled())
        try:
            done, _ = await asyncio.wait({settled}, timeout=timeout_s)
        finally:
            settled.cancel()  # nothing if it is done; else the wait is over
        return bool(done)

    def _settled_now(self) -> bool:
        return not self.driver.in_flight.busy and self.driver.core.idle

    async def _settled(self) -> None:
        in_flight = self.driver.in_flight
        while not self._settled_now():
            if in_flight.busy:
                await asyncio.wait(in_flight.all_tasks())
            else:
                await asyncio.sleep(0)

    async def _abort(self) -> None:
        """Fail everything still pending and cancel the running batches."""
        driver = self.driver
        driver.fail_unstarted(driver.core.close(drain=False))
        in_flight = driver.in_flight
        for requests in in_flight.running:
            failed = driver.fail_each(
                requests, lambda: BatcherClosedError("batcher closed while this ran")
            )
            driver.core.count_failed(failed)
        for batch in in_flight.unstarted:  # their tasks are cancelled before they run
            driver.fail_never_ran(batch)
        tasks = in_flight.all_tasks()
        for task in tasks:
            task.cancel()
        if tasks:  # one turn of the loop to take the cancellation; no longer (timeout_s holds)
            await asyncio.wait(tasks, timeout=0)
        _log.warning("batcher.aborted", batcher=driver.name, cancelled_batches=len(tasks))

    def abandon(self) -> None:
        """Close at once, without settling anything, and release the threads."""
        self.driver.closed = True
        self.release()

    def release(self) -> None:
        """Cancel the timer, release the executor's threads and stop the sampler (never a
        wait on the loop: a reading may be stuck)."""
        self.driver.cancel_timer()
        self.executor.close()
        if self.sampler is not None and self.sampler.running:
            self.sampler.stop_soon()

"""Warm-up: run the model at every batch size (and on every execution slot) before serving,
and seed the controller's service-time model from warm timings."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import Any

from adaptive_batcher._log import get_logger
from adaptive_batcher.core.batcher_core import BatcherCore
from adaptive_batcher.core.buckets import pad_target, warmup_sizes
from adaptive_batcher.errors import BatcherClosedError, describe
from adaptive_batcher.runtime.batch_runner import BatchRunner
from adaptive_batcher.runtime.collector import freeze_after_warmup
from adaptive_batcher.runtime.driver import LoopDriver
from adaptive_batcher.runtime.executors import (
    INLINE_MAX_S,
    INLINE_TRIES,
    INLINE_TRY_LIMIT_S,
    THREAD_LOOKS,
    AdaptiveExecutor,
)
from adaptive_batcher.runtime.loop import cancelling
from adaptive_batcher.runtime.requests import item_size

__all__ = ["WarmUp"]

_log = get_logger()

LOOP_TURN_S = 0.001
"""How long warm-up waits between two tries on the loop, s: the loop's ready callbacks and due
timers run first."""
_Batch = tuple[list[Any], int]  # items, and the units they fill


class WarmUp:
    """The warm-up of one batcher (see ``AdaptiveBatcher.warmup``).

    Args:
        driver: the batcher's loop driver (its clock, whether it is closed, its registry).
        size_fn: ``size_fn(item)`` units, or None (1 per item).
        name: the ``batcher`` field of log events.

    Attributes:
        warmed_sizes: the batch sizes, in units, warmed up so far.
    """

    def __init__(self, driver: LoopDriver, size_fn: Callable[[Any], int] | None, name: str) -> None:
        self.driver = driver
        self.core: BatcherCore[Any] = driver.core
        self.runner: BatchRunner = driver.runner
        self.buckets = driver.buckets
        self.size_fn = size_fn
        self.name = name
        self.warmed_sizes: frozenset[int] = frozenset()

    async def run(self, make_item: Callable[[], Any], freeze_gc: bool) -> dict[int, float]:
        """Warm every size up, then the slots, then seed the service-time model; returns
        ``{size: seconds}`` of the first, cold calls.

        Raises:
            BatcherClosedError, PaddingError, Exception: as ``AdaptiveBatcher.warmup``.
        """
        batches: dict[int, _Batch] = {}
        timings: dict[int, float] = {}
        for size in warmup_sizes(self.buckets, self.core.hard_cap):
            items, units = self._batch_of(make_item, size)
            if not items:  # an item is larger than this size: it cannot be warmed with them
                continue
            ran = pad_target(self.buckets, units) if self.buckets else units
            try:
                timings[ran] = await self._timed_call(items, units)
            except Exception as exc:
                if not (batches and self._out_of_memory(exc, units)):
                    raise
                self.driver.pump()  # the controller ticks now: the cap is below it at once
                break  # the larger sizes would run out of memory too
            batches[ran] = (items, units)
        slots = await self._warm_slots(batches[min(batches)]) if batches else 0
        self.warmed_sizes = frozenset(self.warmed_sizes | set(timings))
        _log.info(
            "batcher.warmed_up",
            batcher=self.name,
            sizes=sorted(timings),
            total_ms=round(sum(timings.values()) * 1e3, 3),
            slots=slots,
        )
        if batches:
            await self._choose_executor(batches[max(batches)], timings[max(batches)])
        if self.core.wants_service_times:
            await self._seed_service_times(batches)
        if freeze_gc:
            _log.info("batcher.gc_frozen", batcher=self.name, objects=freeze_after_warmup())
        return timings

    def _out_of_memory(self, exc: Exception, units: int) -> bool:
        """True when ``exc`` is an out-of-memory error that the controller can act on: it is
        counted as caused by the size (``units``), so the memory guard's ceiling goes below
        it at the controller's next tick (forced: the caller pumps the driver); logged as
        ``batcher.warmup_out_of_memory``."""
        if not (self.core.controller is not None and self.runner.is_oom_error(exc)):
            return False
        self.core.note_oom(units)
        _log.warning(
            "batcher.warmup_out_of_memory", batcher=self.name, batch_size=units, error=describe(exc)
        )
        return True

    async def _warm_slots(self, batch: _Batch) -> int:
        """Run ``batch`` on every execution slot at once (not again with one slot: every
        size's call ran on it); returns the number of slots warmed.

        Raises:
            BatcherClosedError, Exception: as :meth:`_timed_call`.
        """
        slots = self.core.limits.max_concurrent_batches
        if slots > 1:
            await asyncio.gather(*(self._timed_call(*batch) for _ in range(slots)))
        return slots

    async def _choose_executor(self, largest: _Batch, first_s: float) -> None:
        """Let an executor that chooses where the model runs by its calls' time
        (``"adaptive"``: :class:`~adaptive_batcher.runtime.executors.AdaptiveExecutor`) choose,
        from the fastest of the largest batch's calls: its first (``first_s``, in the thread),
        up to ``THREAD_LOOKS`` more in the thread while none took at most
        ``INLINE_TRY_LIMIT_S`` (a call there may wait for a core on a busy machine), then, once
        one did, up to ``INLINE_TRIES`` on the loop, where the model would run. The tries on
        the loop end at one within ``INLINE_MAX_S``, one over ``INLINE_TRY_LIMIT_S``, or
        before one that would take their total past ``INLINE_TRY_LIMIT_S``, and the loop runs
        between them (each holds it for one call). A move onto the loop holds only if a call
        there succeeds (a model bound to its thread, or running an event loop of its own,
        fails there: logged as ``inline_failed``).

        Raises:
            BatcherClosedError, Exception: as :meth:`_timed_call` (the calls in the thread).
        """
        executor = self.runner.executor
        if not isinstance(executor, AdaptiveExecutor):
            return
        fastest_s = first_s
        for _ in range(THREAD_LOOKS):
            if fastest_s <= INLINE_TRY_LIMIT_S or not executor.may_go_inline:
                break
            fastest_s = min(fastest_s, await self._timed_call(*largest))
        if fastest_s <= INLINE_TRY_LIMIT_S:
            fastest_s = await self._try_on_loop(executor, largest, fastest_s)
            if math.isnan(fastest_s):
                return  # it failed on the loop
        if not executor.choose(fastest_s):
            return
        try:
            await self._timed_call(*largest)
        except BatcherClosedError:
            raise
        except Exception:
            executor.leave_loop("inline_failed")

    async def _try_on_loop(
        self, executor: AdaptiveExecutor, largest: _Batch, fastest_s: float
    ) -> float:
        """The fastest of ``fastest_s`` and up to ``INLINE_TRIES`` calls of ``largest`` on the
        loop (see :meth:`_choose_executor`), s; NaN when one failed there (the executor then
        keeps the model in its thread for good).

        Raises:
            BatcherClosedError: the batcher was closed between two tries.
        """
        padded, spent_s = self.runner.pad(*largest), 0.0
        for _ in range(INLINE_TRIES):
            done = fastest_s <= INLINE_MAX_S or not executor.may_go_inline
            if done or spent_s + fastest_s > INLINE_TRY_LIMIT_S:
                break
            # the loop runs between tries: a timer that came due during one, too (after a
            # sleep(0) the next try came before it, and a task waited three tries)
            await asyncio.sleep(LOOP_TURN_S)
            if self._closed():
                raise BatcherClosedError("batcher closed during warm-up")
            try:
                took_s = executor.time_on_loop(padded, self.runner.clock)
            except Exception:
                executor.leave_loop("inline_failed")
                return math.nan
            spent_s += took_s
            fastest_s = min(fastest_s, took_s)
            if took_s > INLINE_TRY_LIMIT_S:
                break
        return fastest_s

    async def _seed_service_times(self, batches: dict[int, _Batch]) -> None:
        """Time two warm calls per size and start the controller's model from the faster (a
        stall only adds time; see the tuning guide, "Profile the model")."""
        rows = []
        for size, batch in batches.items():
            first = await self._timed_call(*batch)
            rows.append((size, min(first, await self._timed_call(*batch)) * 1e3))
        if self.core.seed_service_times(rows):
            _log.info(
                "batcher.service_times_seeded",
                batcher=self.name,
                sizes=[n for n, _ in rows],
                ms=[round(ms, 3) for _, ms in rows],
            )

    async def _timed_call(self, items: list[Any], units: int) -> float:
        """Seconds one model call on ``items`` takes.

        Raises:
            BatcherClosedError: the batcher was closed (warm-up stops calling the model), or a
                close that timed out cancelled this call.
            asyncio.CancelledError: the task awaiting the warm-up was cancelled.
        """
        driver = self.driver
        if self._closed():
            raise BatcherClosedError("batcher closed during warm-up")
        call = asyncio.ensure_future(self.runner.call_model(items, units))
        driver.in_flight.track_warmup(call)  # a close waits for it, as for a running batch
        try:
            await call
        except asyncio.CancelledError:
            if self._closed() and call.cancelled() and not cancelling():  # the close's abort
                raise BatcherClosedError(
                    "batcher closed during warm-up (its timeout cancelled the model call)"
                ) from None
            raise
        return call.result()[1]

    def _closed(self) -> bool:
        return self.driver.closed

    def _batch_of(self, make_item: Callable[[], Any], size: int) -> _Batch:
        """Items from ``make_item`` filling ``size`` units without going over it."""
        items: list[Any] = []
        units = 0
        while units < size:
            item = make_item()
            item_units = 1 if self.size_fn is None else item_size(self.size_fn, item, self.core)
            if units + item_units > size:
                break
            items.append(item)
            units += item_units
        return items, units

"""The loop driver: runs a batcher's core on its event loop.

Per request nothing is scheduled: a "pump" callback, scheduled at most once per loop iteration,
polls the core; one ``loop.call_at`` handle is the core's timer, another the stall heartbeat
while requests are in the system; each dispatched batch runs in one task. Every request the
core takes off the queue ends with its result or an error.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from adaptive_batcher._log import get_logger
from adaptive_batcher.core.batcher_core import HEARTBEAT_S, LOOP_STALL_S, BatcherCore
from adaptive_batcher.core.buckets import pad_target
from adaptive_batcher.core.engine import (
    START_GRACE_S,
    Batch,
    Dispatch,
    Expire,
    Request,
    SetTimer,
)
from adaptive_batcher.errors import BatcherClosedError, BatcherError, DeadlineExceededError
from adaptive_batcher.runtime.batch_runner import BatchRunner, ModelCall, fail_pending
from adaptive_batcher.runtime.collector import FullCollections
from adaptive_batcher.runtime.executors import AdaptiveExecutor
from adaptive_batcher.runtime.in_flight import InFlight
from adaptive_batcher.runtime.listeners import BatchListeners
from adaptive_batcher.runtime.loop import raise_in_loop
from adaptive_batcher.runtime.requests import expired_error
from adaptive_batcher.runtime.stats import BatchRecord

__all__ = ["LoopDriver"]

_log = get_logger()
_Requests = list[Request[asyncio.Future[Any]]]

_LATE_START = "request's deadline passed while its batch waited for the event loop"


def _all_pending(requests: _Requests) -> bool:
    """True when no request's future is done yet (the usual case for a batch about to run)."""
    for request in requests:  # noqa: SIM110 (all() of a generator allocates the generator)
        if request.handle.done():
            return False
    return True


def settle_error(request: Request[asyncio.Future[Any]], error: BaseException) -> bool:
    """Fail the request's caller with ``error`` unless it is settled already; True if set."""
    future = request.handle
    if future.done():
        return False
    future.set_exception(error)
    return True


class LoopDriver:
    """Carries out a core's actions on one event loop and runs the batches it dispatches.

    Args:
        core: the batcher's core.
        runner: runs one batch and settles its callers.
        in_flight: the registry of batch tasks (shared with the close and the warm-up).
        listeners: told of each batch that ran.
        buckets: the batch sizes a batch is padded to (empty: none).
        counts_units: True when requests have sizes (a ``size_fn``).
        name: the ``batcher`` field of log events.

    Attributes:
        loop: the event loop bound (None until the first use).
        now: the loop's clock, seconds (see :func:`~adaptive_batcher.runtime.loop.loop_shortcuts`).
        closed: True once the batcher's close began.
    """

    def __init__(
        self,
        core: BatcherCore[asyncio.Future[Any]],
        runner: BatchRunner,
        in_flight: InFlight,
        listeners: BatchListeners,
        *,
        buckets: tuple[int, ...],
        counts_units: bool,
        name: str,
    ) -> None:
        self.core = core
        self.runner = runner
        self.in_flight = in_flight
        self.listeners = listeners
        self.buckets = buckets
        self.counts_units = counts_units
        self.name = name
        self.loop: asyncio.AbstractEventLoop | None = None
        self.now: Callable[[], float] = time.monotonic
        self.closed = False
        self._pump_scheduled = False
        self._pumping = False  # inside pump: a batch ending now must not pump again in it
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._beat: asyncio.TimerHandle | None = None  # the stall heartbeat (see _on_beat)
        self._beat_at = 0.0
        self._beat_callback: Callable[[], None] = self._on_beat
        self._collections = FullCollections()  # marked at each beat: a stall's full GCs
        core.stall_context = self._stall_context
        executor = runner.executor  # its inline calls join a stall's account (see _stall_context)
        self._adaptive = executor if isinstance(executor, AdaptiveExecutor) else None
        # loop callbacks bound once, not once per scheduling (a method object each time)
        self._pump_callback: Callable[[], None] = self.pump
        self._timer_callback: Callable[[], None] = self._on_timer
        self._task_done_callback: Callable[[asyncio.Task[None]], None] = self._batch_task_done

    def bind(self, loop: asyncio.AbstractEventLoop, now: Callable[[], float]) -> None:
        """Run on ``loop`` from now on, with ``now`` as its clock."""
        self.loop = loop
        self.now = now

    def clock(self) -> float:
        """The bound loop's time, seconds."""
        return self.now()

    # -- the pump and the timer -------------------------------------------------------------

    def schedule_pump(self) -> None:
        """Poll the core at the loop's next iteration (once, however often asked)."""
        if not self._pump_scheduled and self.loop is not None:
            self._pump_scheduled = True
            self.loop.call_soon(self._pump_callback)

    def pump(self, now: float | None = None) -> None:
        """Poll the core at ``now`` (default: the clock) and carry out its actions."""
        self._pump_scheduled = False
        self._pumping = True
        try:
            self._carry_out(self.now() if now is None else now)
        finally:
            self._pumping = False
        if self._beat is None and not self.closed and not self.core.idle:
            self._arm_beat()

    def _arm_beat(self) -> None:
        loop = self.loop
        assert loop is not None
        self._collections.mark()
        if self._adaptive is not None:
            self._adaptive.mark()
        self._beat_at = self.now() + HEARTBEAT_S
        self._beat = loop.call_at(self._beat_at, self._beat_callback)

    def _stall_context(self) -> dict[str, object]:
        """What ``batcher.loop_stalled`` adds: the full collections since the last beat, and an
        inline model call that held the loop as long as a stall (``executor="adaptive"``)."""
        context = self._collections.since_mark()
        if self._adaptive is not None:
            context.update(self._adaptive.since_mark(LOOP_STALL_S))
        return context

    def _on_beat(self) -> None:
        """While requests are in the system, a timer every ``HEARTBEAT_S``: one that fires
        late tells the core the loop stood still, even with no window timer pending."""
        self._beat = None
        self.core.heartbeat_fired(self._beat_at, self.now())
        if not self.closed and not self.core.idle:
            self._arm_beat()

    def _carry_out(self, now: float) -> None:
        loop = self.loop
        assert loop is not None
        for action in self.core.poll(now):
            if type(action) is Dispatch:
                self._start_batch(loop, action.batch)
            elif type(action) is Expire:
                if settle_error(action.request, expired_error(action.request)):
                    self.core.count_expired(1)
            elif type(action) is SetTimer:
                self._set_timer(action.at_s)

    def _set_timer(self, at_s: float | None) -> None:
        if at_s == self._timer_at:
            return
        self._cancel_window_timer()
        self._timer_at = at_s
        if at_s is not None:
            assert self.loop is not None
            self._timer = self.loop.call_at(at_s, self._timer_callback)

    def cancel_timer(self) -> None:
        """Cancel the timer and the heartbeat, if set."""
        self._cancel_window_timer()
        if self._beat is not None:
            self._beat.cancel()
            self._beat = None

    def _cancel_window_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _on_timer(self) -> None:
        at = self._timer_at
        self._timer = None
        self._timer_at = None
        now = self.now()
        self.pump(now if at is None else max(now, at))

    # -- batches ----------------------------------------------------------------------------

    def _start_batch(self, loop: asyncio.AbstractEventLoop, batch: Batch[Any]) -> None:
        in_flight = self.in_flight
        in_flight.unstarted.add(batch)  # before create_task: an eager task runs inside it
        task = loop.create_task(self._run_batch(batch))
        in_flight.tasks[task] = batch
        task.add_done_callback(self._task_done_callback)

    def _batch_task_done(self, task: asyncio.Task[None]) -> None:
        """A batch task ended. One cancelled before it ran (a time-limited close, or anything
        cancelling the loop's tasks) never entered :meth:`_run_batch`: its callers are failed
        here and its slot is given back, so that none of them waits forever."""
        in_flight = self.in_flight
        batch = in_flight.tasks.pop(task)
        if batch not in in_flight.unstarted:
            return
        in_flight.unstarted.discard(batch)
        self.fail_never_ran(batch)
        self.core.complete(batch, self.now())
        self.pump()

    def fail_never_ran(self, batch: Batch[Any]) -> None:
        """Fail the callers of a batch whose task was cancelled before it ran: refused, as if
        taken off the queue, when the batcher is closing; failed otherwise."""
        if self.closed:
            self.fail_unstarted(batch.requests)
            return
        error = "the batch was cancelled before it ran"
        self.core.count_failed(self.fail_each(batch.requests, lambda: BatcherError(error)))

    def fail_unstarted(self, requests: _Requests) -> None:
        """Requests a close took off the queue: refused, like a submit after closing."""
        error = "batcher closed before this ran"
        self.core.count_rejected(self.fail_each(requests, lambda: BatcherClosedError(error)))

    def fail_each(self, requests: _Requests, error: Callable[[], BaseException]) -> int:
        """Fail every caller not settled yet with its own ``error()``; returns how many."""
        return sum(settle_error(request, error()) for request in requests)

    async def _run_batch(self, batch: Batch[asyncio.Future[Any]]) -> None:
        self.in_flight.unstarted.discard(batch)
        started = self.now()
        if started - batch.formed_s > START_GRACE_S:
            self._expire_overdue(batch, started)
        live = batch.requests
        if not _all_pending(live):  # some callers gave up meanwhile
            live = [r for r in live if not r.handle.done()]
        running = self.in_flight.running
        running.append(live)
        calls: list[ModelCall] | None = None
        try:
            if live:
                _log.debug(
                    "batch.dispatched",
                    batcher=self.name,
                    batch_id=batch.batch_id,
                    batch_size=len(live),
                    units=batch.units,
                    queue_wait_ms=round((started - batch.requests[0].arrival_s) * 1e3, 3),
                    queue_depth=self.core.queue_depth,
                )
                calls = await self.runner.run(live)
        except BaseException as exc:  # nothing may leave a caller waiting (e.g. a logger raising)
            fail_pending(live, exc, self.core)
            if isinstance(exc, KeyboardInterrupt | SystemExit):
                # raised in the loop once the callers' tasks have seen their errors, as asyncio
                # raises its own tasks' (from the task's step it would skip their wake-ups)
                raise_in_loop(exc)
            elif isinstance(exc, asyncio.CancelledError):
                raise
        finally:
            running.remove(live)
            self._finish_batch(batch, live, started, calls)

    def _expire_overdue(self, batch: Batch[asyncio.Future[Any]], started: float) -> None:
        """Fail (``DeadlineExceededError``) the requests of ``batch`` whose deadline came more
        than ``START_GRACE_S`` before ``started``, after the batch was formed: the event loop
        held the batch between its dispatch and its model call, past their deadline."""
        formed, last = batch.formed_s, started - START_GRACE_S
        expired = 0
        for request in batch.requests:
            deadline = request.deadline_s
            if deadline is not None and formed < deadline < last:
                expired += settle_error(request, DeadlineExceededError(_LATE_START))
        if expired:
            self.core.count_expired(expired)

    def _finish_batch(
        self,
        batch: Batch[asyncio.Future[Any]],
        live: list[Any],
        started: float,
        calls: list[ModelCall] | None = None,
    ) -> None:
        ended = self.now()
        core = self.core
        core.complete(batch, ended)
        try:
            if live:
                units = sum(r.size for r in live) if self.counts_units else len(live)
                if self.buckets:
                    units = pad_target(self.buckets, units)  # what the model actually ran
                one_call = calls is not None and len(calls) == 1 and calls[0].items == len(live)
                whole = calls[0] if calls and one_call else None
                if whole is not None or calls is None:
                    # one call: its time as measured where the model ran (not when the loop
                    # noticed its end); a run that reported no call: timed from the loop
                    service = whole.service_s if whole else ended - started
                    answer = whole.answer_s if whole else None
                    core.record_device_time(service)
                    idle = batch.window_idle_s
                    core.record_run(ended, len(live), units, service, idle, answer)
                else:  # split: each call that succeeded is a run (the failed ones are not)
                    core.record_device_time(ended - started)
                    idle = batch.window_idle_s
                    for call in calls:
                        core.record_run(
                            call.end_s, call.items, call.units, call.service_s, idle, call.answer_s
                        )
                        idle = 0.0
                if self.listeners:
                    record = BatchRecord(
                        batch.batch_id, live[0].arrival_s, started, ended, len(live), units
                    )
                    self.listeners.tell(record)
        finally:  # the slot is free: whatever happened, what is queued must not wait
            if self._pumping:  # ended inside create_task (eager task factories, 3.12+):
                self.schedule_pump()  # pumping from here would nest one pump per batch
            else:
                self.pump(ended)

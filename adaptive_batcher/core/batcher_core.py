"""The sans-IO batcher: engine, recorder and controller joined by one set of rules.

:class:`BatcherCore` plays the part of h11's connection object over its state machine: it owns a
:class:`~adaptive_batcher.core.engine.BatchingEngine`, a :class:`~adaptive_batcher.metrics.Recorder`
and (with an SLO or a policy) a :class:`~adaptive_batcher.control.Controller`, and it holds every
rule that joins them: the hard cap and the controller's bounds, the default policy and guards,
SLO-aware shedding (a deadline for each arrival), controller ticks on polls (forced after an
out-of-memory error), and how finished batches and answers are counted. It reads no clock and
does no I/O: every time is a ``now`` argument in seconds on the caller's clock.

Two thin shells drive it: the asyncio runtime
(:class:`~adaptive_batcher.runtime.batcher.AdaptiveBatcher`) and the simulator
(:class:`~adaptive_batcher.sim.simulator.Simulator`). What serves production is therefore what a
replay measures, glue included.

A shell's part, per event:

* a request arrives: make a :class:`~adaptive_batcher.core.engine.Request` (its ``deadline_s`` is
  the caller's own, if any) and call :meth:`BatcherCore.arrive`; if it returns True, call
  :meth:`~BatcherCore.poll` before anything else happens (once for all arrivals at one instant);
* the timer set by the last ``SetTimer`` fires: :meth:`~BatcherCore.poll`;
* carry out the actions of ``poll``: run each ``Dispatch``'s batch, fail each ``Expire``'s
  request with ``DeadlineExceededError``, set the timer;
* a model call ends: :meth:`~BatcherCore.record_run` (and :meth:`~BatcherCore.note_oom` if it
  ran out of memory), :meth:`~BatcherCore.record_answers` for the requests it answered, and
  :meth:`~BatcherCore.record_device_time` for the time it held the device;
* a request ends otherwise: one ``count_*`` method per outcome (:meth:`~BatcherCore.count_failed`,
  :meth:`~BatcherCore.count_expired`, ...); a stream's first element:
  :meth:`~BatcherCore.record_first_elements`, its end: :meth:`~BatcherCore.count_completed` or
  :meth:`~BatcherCore.count_failed`. The shells never change a count themselves, so that every
  count only goes up and each request is counted once;
* a dispatched batch has ended: :meth:`~BatcherCore.complete`, then :meth:`~BatcherCore.poll`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Generic, TypeVar

from adaptive_batcher._log import get_logger
from adaptive_batcher.control.controller import Controller, default_guards
from adaptive_batcher.control.policy import Policy
from adaptive_batcher.control.service_estimator import ServiceTimeEstimator
from adaptive_batcher.control.slack import TailSlack
from adaptive_batcher.control.types import Bounds, Decision
from adaptive_batcher.core.engine import (
    Action,
    Batch,
    BatchingEngine,
    EngineLimits,
    Request,
    SetTimer,
)
from adaptive_batcher.core.settings import (
    SHED_LATE_NEEDS_SLO,
    BatcherSettings,
    check_policy,
    default_window_range_ms,
)
from adaptive_batcher.errors import BatcherError, describe
from adaptive_batcher.metrics.recorder import Recorder
from adaptive_batcher.policies.pid import PID
from adaptive_batcher.slo import SLO, check_slo
from adaptive_batcher.telemetry.base import TelemetrySample

__all__ = ["HEARTBEAT_S", "LOOP_STALL_S", "BatcherCore", "DecisionHook", "TelemetryReader"]

H = TypeVar("H")
R = TypeVar("R")

TelemetryReader = Callable[[float], TelemetrySample]
"""``read(now_s)``: the latest device reading, asked for only when the controller ticks."""

DecisionHook = Callable[[float, Decision], None]
"""``hook(now_s, decision)``: called after every controller tick with the decision in force."""

LOOP_STALL_S = 0.05
"""A timer that fires this many seconds late, or more, tells of a stall of the shell's event
loop (a blocking call in a handler, a large request body parsed on the loop, a long
garbage-collector pause): the core logs ``batcher.loop_stalled`` and tells the controller
(:meth:`Controller.note_loop_stall`)."""

HEARTBEAT_S = 0.02
"""A shell's stall heartbeat period while requests are in the system, seconds: a stall of
``LOOP_STALL_S`` or more makes it fire late, whatever else is pending (the asyncio shell runs
it; the simulator replays its effect)."""

_log = get_logger()
_UNKNOWN = TelemetrySample(source="none")


def _no_telemetry(now: float) -> TelemetrySample:
    del now
    return _UNKNOWN


class BatcherCore(Generic[H]):
    """Engine, recorder and controller behind ``arrive`` / ``poll`` / ``complete``; sans-IO.

    Args:
        settings: the checked settings (the same for the runtime and the simulator).
        read_telemetry: the latest device reading at ``now`` (default: nothing known).
        warmed: the batch sizes warmed up so far; with it, the default guards keep caps among
            them (see :class:`~adaptive_batcher.control.BucketGuard`).
        on_decision: called after every controller tick with ``(now_s, decision in force)``.
        name: the ``batcher`` field of log events.
        exported: keep the cumulative latency histogram the exporters read (the simulator,
            which no exporter reads, turns it off; see :class:`Recorder`).

    Raises:
        TypeError: ``settings.service_profile`` is a file path: the core reads no file (the
            shells read it first, see :meth:`BatcherSettings.service_seed`).
    """

    def __init__(
        self,
        settings: BatcherSettings,
        *,
        read_telemetry: TelemetryReader | None = None,
        warmed: Callable[[], frozenset[int]] | None = None,
        on_decision: DecisionHook | None = None,
        name: str = "batcher",
        exported: bool = True,
    ) -> None:
        self.settings = settings
        self.name = name
        cap = settings.max_batch_size
        self._engine: BatchingEngine[H] = BatchingEngine(
            EngineLimits(settings.window_ms / 1e3, cap, settings.max_concurrent_batches),
            hard_max_batch_size=cap,
            max_queue_size=settings.max_queue_size,
            window_origin=settings.window_origin,
        )
        self.recorder = Recorder(exported=exported)
        self.bounds: Bounds = settings.controller_bounds
        self.controller: Controller | None = None
        self.slo: SLO | None = None
        self.shed_after_s: float | None = None
        self.shed_after_short_s: float | None = None
        self._service_seed = settings.service_seed()
        self._read_telemetry = read_telemetry or _no_telemetry
        self._warmed = warmed
        self._on_decision = on_decision
        self._tick_forced = False
        self._timer_due_s: float | None = None  # the timer the last poll asked for
        self._stall_seen_until = -math.inf  # the end of the last stall noted
        self._submitted_at_stall = math.inf  # submitted when a stall was noted, until a tick
        self.loop_stalls = 0
        self.stall_context: Callable[[], Mapping[str, object]] | None = None
        """The shell's account of what held its loop, asked once per stall noted; its fields
        join ``batcher.loop_stalled`` (the asyncio shell: the full garbage collections in it)."""
        self._policy_stopped = False  # set_policy(None): an SLO set later starts no controller
        self._apply_slo(settings.slo)
        policy = settings.policy
        if policy is None and settings.slo is not None:
            policy = _default_policy()
        if policy is not None:
            self.controller = self._make_controller(policy)

    # -- events ----------------------------------------------------------------------------

    def start(self, now: float) -> None:
        """Start the controller (if any) from the settings in force at ``now``."""
        if self.controller is not None:
            self.controller.start(self._decision_in_force(), now, self.recorder.counts())

    def arrive(self, request: Request[H], now: float) -> bool:
        """Queue ``request`` (arrived at ``now``); True if :meth:`poll` must run next.

        With SLO-aware shedding in force, the request's deadline becomes the earlier of its own
        and ``now + shed_after``: it fails at that moment if it has not started. ``shed_after``
        is the controller's for a request that joins a queue already holding a full batch (its
        batch will be full), else its (later) one for a shorter queue.

        Raises:
            QueueFullError, ItemTooLargeError, BatcherClosedError: the request is refused
                (counted as ``rejected``); see :meth:`BatchingEngine.arrive`.
        """
        shed_after = self.shed_after_s  # None, without shedding: no call on this hot path
        if shed_after is not None:
            shed_at = now + self._shed_after_now(shed_after)
            if request.deadline_s is None or shed_at < request.deadline_s:
                request.deadline_s = shed_at
        self.recorder.submitted += 1
        try:
            return self._engine.arrive(request, now)
        except BatcherError as exc:
            self._note_rejected(exc)
            raise

    def refuse(self, error: BatcherError) -> BatcherError:
        """Count a request refused before it could arrive (an item ``size_fn`` gives no size),
        as :meth:`arrive` counts one it refuses: submitted and rejected. Returns ``error``."""
        self.recorder.submitted += 1
        self._note_rejected(error)
        return error

    def _note_rejected(self, error: BatcherError) -> None:
        self.recorder.rejected += 1
        _log.debug(
            "request.rejected",
            batcher=self.name,
            reason=type(error).__name__,
            queue_depth=self._engine.queue_depth,
        )

    def arrive_many(
        self, requests: Sequence[Request[H]], start: int = 0, stop: int | None = None
    ) -> tuple[int, bool]:
        """Queue ``requests[start:stop]``, each arriving at its ``arrival_s``, exactly as
        :meth:`arrive` would one by one (shedding deadlines included), up to the first that
        needs a poll or would be refused (see :meth:`BatchingEngine.arrive_many`).

        Returns:
            ``(end, poll)``: ``requests[start:end]`` were queued and counted as submitted;
            ``poll``: call :meth:`poll` before anything else happens. Otherwise, if ``end`` <
            ``stop``, ``requests[end]`` would be refused: call :meth:`arrive` with it.
        """
        engine = self._engine
        stop = len(requests) if stop is None else stop
        shed_after = self.shed_after_s
        if shed_after is None:
            end, poll = engine.arrive_many(requests, start, stop)
        else:
            # a request that joins a queue holding less than a full batch gets the short
            # shed_after, as in arrive()
            short = self.shed_after_short_s or shed_after
            end, poll = engine.arrive_many(
                requests, start, stop, expire_after_s=shed_after, expire_short_s=short
            )
        self.recorder.submitted += end - start
        return end, poll

    def poll(self, now: float) -> list[Action]:
        """Tick the controller if due (or forced by an OOM), then poll the engine at ``now``.

        Returns:
            The engine's actions: ``Expire``, then ``Dispatch`` in FIFO order, then ``SetTimer``.
        """
        controller = self.controller
        due = self._timer_due_s
        if due is not None:
            self.timer_fired(due, now)
        if controller is not None and (
            self._tick_forced
            or controller.due(now, self.recorder.batch_count)
            or self.recorder.submitted > self._submitted_at_stall
        ):
            self._tick(controller, now)
        actions = self._engine.poll(now)
        timer = actions[-1]
        due_s = timer.at_s if type(timer) is SetTimer else None
        if (
            controller is not None
            and self.shed_after_s is None
            and not self._engine.idle
            and controller.sheds
        ):
            # a shedding batcher with no deadline in force yet, requests waiting or running:
            # poll by the time a tick is overdue, whether or not a batch ends (a model call that
            # hangs before the first tick holds every slot; the queue behind it must be shed).
            # Once a deadline is in force the engine's timers shed, and ticks ride on batches:
            # a tick in the middle of a long batch sees no answers and would shed too early
            # (never sooner than an interval from now: a tick that failed leaves the overdue
            # time behind, and must not turn the timer into a busy loop)
            overdue = max(controller.overdue_at(), now + controller.interval_s)
            if overdue < (math.inf if due_s is None else due_s):
                due_s = overdue
                actions[-1] = SetTimer(due_s)
        self._timer_due_s = due_s
        return actions

    def heartbeat_fired(self, due_s: float, now: float) -> None:
        """The shell's heartbeat (every ``HEARTBEAT_S`` while requests are in the system) due
        at ``due_s`` fired at ``now``: lateness short of a stall is the loop's lag, which the
        controller budgets for (:meth:`Controller.note_loop_lag`); a stall as
        :meth:`timer_fired`."""
        late_s = now - due_s
        if late_s < LOOP_STALL_S:
            if self.controller is not None:
                self.controller.note_loop_lag(late_s, now)
            return
        self.timer_fired(due_s, now)

    def timer_fired(self, due_s: float, now: float) -> None:
        """A timer of the shell due at ``due_s`` fired at ``now``: ``LOOP_STALL_S`` or more
        late, the loop stood still (noted once, however many timers it held back). The core's
        own timer is checked at every poll; a shell may add a heartbeat, since a stall with no
        window timer pending (a batch waiting for a busy slot) leaves no other trace."""
        if now - due_s >= LOOP_STALL_S and due_s >= self._stall_seen_until:
            self._note_loop_stall(due_s, now)

    def _note_loop_stall(self, due_s: float, now: float) -> None:
        """A timer due at ``due_s`` fires only at ``now``: the shell's loop stood still."""
        self._stall_seen_until = now
        self.loop_stalls += 1
        # the first poll that has taken in requests the stall held back ticks: the batch
        # formed there is planned for the queue the stall left
        self._submitted_at_stall = self.recorder.submitted
        context = self.stall_context() if self.stall_context is not None else {}
        _log.warning(
            "batcher.loop_stalled",
            batcher=self.name,
            late_ms=round((now - due_s) * 1e3, 3),
            queue_depth=self._engine.queue_depth,
            **context,
        )
        if self.controller is not None:
            self.controller.note_loop_stall(due_s, now)

    # -- counting: every change of an outcome count goes through one of these --------------
    #
    # The counts only go up (an exporter reads a decrease as a reset), each request ends in
    # exactly one outcome, and ``within_slo`` is part of ``completed``. A shell counts each
    # outcome once, when the request's caller is settled (a stream: when it ends).

    def record_answers(self, arrivals_s: list[float], failed: int, now: float) -> None:
        """Requests that arrived at ``arrivals_s`` (non-decreasing) were answered at ``now``;
        ``failed`` of them with an error: their latencies are recorded and they are counted
        as completed (``within_slo`` those in time) or failed (see
        :meth:`Recorder.record_answers`)."""
        self.recorder.record_answers(arrivals_s, failed, now)

    def record_first_elements(self, arrivals_s: list[float], now: float) -> list[bool]:
        """Streams that arrived at ``arrivals_s`` (non-decreasing) got their first element at
        ``now``: their latencies (the time to that element) are recorded, their outcomes are
        counted when they end (:meth:`count_completed`, :meth:`count_failed`). Returns, for
        each, whether it met the SLO in force (always True without one)."""
        self.recorder.record_waits(arrivals_s, now)
        since = now - self.recorder.slo_latency_s
        return [arrival >= since for arrival in arrivals_s]

    def count_completed(self, completed: int, within_slo: int) -> None:
        """``completed`` requests ended with a result (a stream: at its end, or when its
        reader left after its first element), ``within_slo`` of them in time."""
        _check_count(completed)
        if not 0 <= within_slo <= completed:
            raise ValueError(f"within_slo must be in 0..{completed}, got {within_slo}")
        recorder = self.recorder
        recorder.completed += completed
        recorder.within_slo += within_slo

    def count_failed(self, failed: int) -> None:
        """``failed`` requests ended with an error of the model or of their batch (see
        :class:`~adaptive_batcher.metrics.Counts`)."""
        _check_count(failed)
        self.recorder.failed += failed

    def count_rejected(self, rejected: int) -> None:
        """``rejected`` requests that arrived were refused by a close before they ran."""
        _check_count(rejected)
        self.recorder.rejected += rejected

    def count_expired(self, expired: int) -> None:
        """``expired`` requests failed with ``DeadlineExceededError`` (an ``Expire`` carried
        out)."""
        _check_count(expired)
        self.recorder.expired += expired

    def count_cancelled(self, cancelled: int) -> None:
        """``cancelled`` callers gave up before their request had any outcome."""
        _check_count(cancelled)
        self.recorder.cancelled += cancelled

    def record_run(
        self,
        end_s: float,
        items: int,
        units: int,
        service_s: float,
        window_idle_s: float = 0.0,
        answer_s: float | None = None,
    ) -> None:
        """A model call on ``items`` requests (``units`` size units, padding included) ran for
        ``service_s`` seconds and ended at ``end_s``; ``window_idle_s`` as in
        :attr:`Batch.window_idle_s` (count it for one call per batch only); ``answer_s``: a
        streaming call's first answer came that many seconds after it began (None: not a
        stream, the answers came at its end)."""
        self.recorder.record_batch(end_s, items, units, service_s, window_idle_s, answer_s)

    def record_device_time(self, busy_s: float) -> None:
        """The device ran model calls for ``busy_s`` seconds (every call counts: split, failed
        and padded ones too); this is the device cost ``stats()`` and replays report."""
        self.recorder.record_device_time(busy_s)

    def note_oom(self, units: int | None = None) -> None:
        """A model call on ``units`` size units (None: unknown) ran out of memory for its
        batch's size: counted (``oom_errors``, ``oom_size_errors``), and the controller ticks
        at the next poll (so the cap shrinks before more batches fail)."""
        self.note_oom_call()
        self.judge_oom(size_caused=True, units=units)

    def note_oom_call(self) -> None:
        """A model call ran out of memory, its cause not yet judged (its batch is being split):
        counted in ``oom_errors`` only; :meth:`judge_oom` follows."""
        self.recorder.oom_errors += 1

    def judge_oom(self, *, size_caused: bool, units: int | None = None) -> None:
        """The cause of a call counted by :meth:`note_oom_call`: the size of its batch of
        ``units`` size units (None: unknown; counted in ``oom_size_errors``, and the memory
        guard's ceiling goes below the smallest such batch; the controller ticks at the next
        poll) or not (``oom_isolated``: the memory guard leaves the cap)."""
        if size_caused:
            self.recorder.oom_size_errors += 1
            self.recorder.oom_size_units.append(units)
            self._tick_forced = True
        else:
            self.recorder.oom_isolated += 1

    def split_failed_call(
        self,
        requests: Sequence[R],
        *,
        oom: bool,
        bisect: bool = False,
        judge_later: bool = False,
        units: int | None = None,
    ) -> tuple[Sequence[R], Sequence[R]] | None:
        """A model call on ``requests`` failed: what to run next.

        An out-of-memory call (``oom``) is counted, as caused by its batch's size (see
        :meth:`note_oom`), or with ``judge_later`` as a call whose cause the shell judges once
        the halves have run (:meth:`note_oom_call`, then :meth:`judge_oom`), and re-run split
        in halves; any other failure is split only with ``bisect`` (to isolate the failing
        item). A single request is never split. ``units``: the call's size units, for
        :meth:`note_oom` (None: unknown).

        Returns:
            The two halves to re-run, first half first (a ``range`` splits into ranges), or
            None: fail the requests with the call's error.
        """
        if oom and judge_later:
            self.note_oom_call()
        elif oom:
            self.note_oom(units)
        if len(requests) > 1 and (oom or bisect):
            middle = len(requests) // 2
            return requests[:middle], requests[middle:]
        return None

    def cancel(self, request: Request[H]) -> bool:
        """Withdraw a queued request whose caller gave up; True if it was still queued (its
        outcome is the shell's to count: :meth:`count_cancelled`)."""
        return self._engine.cancel(request)

    def complete(self, batch: Batch[H], now: float) -> None:
        """``batch`` has ended at ``now`` (success or failure): its slot is free; poll next."""
        self._engine.complete(batch, now)

    def close(self, *, drain: bool) -> list[Request[H]]:
        """Stop accepting requests; see :meth:`BatchingEngine.close`."""
        return self._engine.close(drain=drain)

    # -- what the shells read (they never reach the engine) ------------------------------

    @property
    def limits(self) -> EngineLimits:
        """Window, cap and slots in force."""
        return self._engine.limits

    @property
    def hard_cap(self) -> int:
        """The hard cap, units: the largest request accepted and the ceiling of the cap."""
        return self._engine.hard_max_batch_size

    @property
    def queue_depth(self) -> int:
        """Requests queued, not yet dispatched."""
        return self._engine.queue_depth

    @property
    def queued_units(self) -> int:
        """Size units queued, not yet dispatched."""
        return self._engine.queued_units

    @property
    def in_flight(self) -> int:
        """Batches dispatched and not yet completed."""
        return self._engine.in_flight

    @property
    def idle(self) -> bool:
        """True when nothing is queued and no batch is in flight."""
        return self._engine.idle

    # -- changes at run time ---------------------------------------------------------------

    def set_slo(self, slo: SLO | None, now: float | None = None) -> None:
        """Change the objective: goodput counts against it now, the controller from its next
        tick.

        Without a controller, an SLO starts the default one (``PID``), as if the settings had
        had that SLO; not after ``set_policy(None)``, which stopped the controller on purpose.
        ``now``: start that controller at once (else :meth:`start` must be called).

        Raises:
            TypeError: ``slo`` is not an SLO or None.
            ValueError: ``slo`` is None while the settings have ``shed_late`` (nothing changes).
        """
        check_slo(slo)
        if slo is None and self.settings.shed_late:
            raise ValueError(f"{SHED_LATE_NEEDS_SLO}; set another SLO instead of None")
        self._apply_slo(slo)
        if self.settings.bounds is None:  # the default window range follows the SLO's budget
            window_range = default_window_range_ms(self.settings.window_ms, slo)
            self.bounds = replace(self.bounds, max_window_ms=window_range)
        if self.controller is not None:
            self.controller.bounds = self.bounds
            self.controller.set_slo(slo)
        elif slo is not None and not self._policy_stopped:
            self._start_controller(_default_policy(), now)

    def _apply_slo(self, slo: SLO | None) -> None:
        self.slo = slo
        # the batcher's latency runs from submission: preprocessing came before it
        self.recorder.slo_latency_s = slo.room_ms / 1e3 if slo is not None else math.inf

    def set_policy(self, policy: Policy | None, now: float | None = None) -> None:
        """Switch the control law; it continues from the settings in force (bumpless).

        None stops the controller: the settings in force stay. ``now``: start a new controller
        at once (else :meth:`start` must be called).

        Raises:
            TypeError: ``policy`` is not a Policy.
        """
        if policy is None:
            self.controller = None
            self.shed_after_s = self.shed_after_short_s = None
            self._policy_stopped = True
            return
        check_policy(policy)
        self._policy_stopped = False
        if self.controller is not None:
            self.controller.set_policy(policy)
            return
        self._start_controller(policy, now)

    def _start_controller(self, policy: Policy, now: float | None) -> None:
        """A new controller with ``policy``, started at ``now`` if given. Its measured slack
        starts held (as after a new SLO): the latencies recorded so far are of settings it did
        not plan."""
        self.controller = self._make_controller(policy)
        self.controller.tail_slack.reset()
        if now is not None:
            self.start(now)

    def set_limits(self, limits: EngineLimits) -> None:
        """Set window, cap and slots now; a controller continues from them.

        Raises:
            ValueError: a cap above the hard cap (``max_batch_size``).
        """
        self._engine.set_limits(limits)
        if self.controller is not None and self.controller.decision is not None:
            self.controller.adopt(self._decision_in_force())

    def set_hard_cap(self, cap: int) -> None:
        """Set the hard cap to ``cap`` units (see ``AdaptiveBatcher.set_hard_cap``): the cap
        in force is lowered to it if above; the controller's cap bound follows it when it was
        the hard cap, and is lowered to it if above.

        Raises:
            ValueError: the settings have ``batch_sizes`` (the largest bucket is the hard cap).
        """
        if self.settings.buckets:
            raise ValueError(
                "max_batch_size: the hard cap of a batcher with batch_sizes is its largest bucket"
            )
        engine = self._engine
        old = engine.hard_max_batch_size
        engine.hard_max_batch_size = cap
        if engine.limits.max_batch_size > cap:
            engine.set_limits(replace(engine.limits, max_batch_size=cap))
        bounds = self.bounds
        if bounds.max_batch_size == old or bounds.max_batch_size > cap:
            low = min(bounds.min_batch_size, cap)
            self.bounds = replace(bounds, min_batch_size=low, max_batch_size=cap)
        if self.controller is not None:
            self.controller.bounds = self.bounds
            if self.controller.decision is not None:
                self.controller.adopt(self._decision_in_force())

    @property
    def wants_service_times(self) -> bool:
        """True when a controller with an SLO has no service-time model to start from yet (no
        ``service_profile``, no batch run): :meth:`seed_service_times` would be taken."""
        return (
            self.controller is not None
            and self.slo is not None
            and not self._service_seed
            and self.recorder.batch_count == 0
        )

    def seed_service_times(self, rows: Sequence[tuple[int, float]]) -> bool:
        """Start the controller's service-time model from ``(batch_size, median_ms)`` rows
        measured now (a warm-up), if :attr:`wants_service_times`; True if taken. The plan (and
        SLO-aware shedding) then works from the next poll's tick instead of after the first
        batches."""
        if not self.wants_service_times or not rows:
            return False
        assert self.controller is not None
        self._service_seed = tuple((int(n), float(ms)) for n, ms in rows)
        self.controller.service_estimator = ServiceTimeEstimator(seed=self._service_seed)
        self._tick_forced = True  # the next poll plans (and sheds) with it, however soon
        return True

    # -- internals -------------------------------------------------------------------------

    def _make_controller(self, policy: Policy) -> Controller:
        settings = self.settings
        guards = settings.guards
        if guards is None:
            guards = default_guards(self._warmed, shed_late=settings.shed_late)
        return Controller(
            policy,
            self.bounds,
            slo=self.slo,
            interval_s=settings.control_interval_s,
            interval_batches=settings.control_interval_batches,
            guards=guards,
            service_estimator=ServiceTimeEstimator(seed=self._service_seed),
            tail_slack=TailSlack(max_scale=settings.window_slack),
        )

    def _shed_after_now(self, shed_after: float) -> float:
        """The shedding deadline a request arriving now gets, s: ``shed_after`` (the one in
        force for a queue holding a full batch) or the short one for a shorter queue."""
        engine = self._engine
        if engine.queued_units < engine.limits.max_batch_size:
            return self.shed_after_short_s or shed_after
        return shed_after

    def _decision_in_force(self) -> Decision:
        limits = self._engine.limits
        return Decision(limits.window_s * 1e3, limits.max_batch_size, "start")

    def _tick(self, controller: Controller, now: float) -> None:
        self._tick_forced = False
        if self.recorder.submitted > self._submitted_at_stall:
            self._submitted_at_stall = math.inf  # (a tick before they came in leaves it)
        engine = self._engine
        try:
            telemetry = self._read_telemetry(now)
            limits = engine.limits
            decision = controller.tick(
                now,
                self.recorder,
                engine.queue_depth,
                engine.queued_units,
                telemetry,
                limits.max_concurrent_batches,
            )
        except Exception as exc:  # the controller must never stop serving
            _log.error("controller.failed", batcher=self.name, error=describe(exc))
            return
        if decision is not None:
            slots = engine.limits.max_concurrent_batches
            engine.set_limits(
                EngineLimits(decision.window_ms / 1e3, decision.max_batch_size, slots)
            )
        began = self.shed_after_s is None and controller.shed_after_s is not None
        self.shed_after_s = controller.shed_after_s
        self.shed_after_short_s = controller.shed_after_short_s
        if began and self.shed_after_s is not None:
            # the requests queued before shedding began (a cold burst before the first tick)
            # would otherwise be served late, for as long as the backlog lasts. (Deadlines
            # that shorten later are left alone: applied to a burst's queue, they shed requests
            # that the burst's end would have let through.)
            engine.expire_after(self._shed_after_now(self.shed_after_s))
        if self._on_decision is not None and controller.decision is not None:
            self._on_decision(now, controller.decision)


def _check_count(count: int) -> None:
    """Counts only go up: refuse a negative change (ValueError)."""
    if count < 0:
        raise ValueError(f"a count only goes up; got a change of {count}")


def _default_policy() -> Policy:
    """The control law a batcher with an SLO and no policy uses: a new ``PID``."""
    return PID()

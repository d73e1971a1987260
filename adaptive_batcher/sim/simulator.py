"""A discrete-event simulator that drives the real engine and controller on a virtual clock.

No batching logic lives here: arrivals go to :class:`~adaptive_batcher.core.engine.BatchingEngine`,
its actions are carried out on a virtual clock, finished batches feed the same
:class:`~adaptive_batcher.metrics.Recorder` and :class:`~adaptive_batcher.control.Controller` as in
production, and decisions are applied to the engine. Service times come from a
:class:`~adaptive_batcher.sim.service.ServiceModel`; the same inputs and seed give the same result
on every run.

Out-of-memory: a batch whose predicted memory exceeds the device capacity fails after a quarter
of its service time and is re-run split in halves, exactly as the runtime does, so no request is
lost unless a single item does not fit.
"""

from __future__ import annotations

import copy
import heapq
import itertools
import math
import os
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import numpy.typing as npt

from adaptive_batcher._validate import MAX_SERVICE_S, check_int, check_number, check_str
from adaptive_batcher.control.types import Decision, padded_size
from adaptive_batcher.core.batcher_core import HEARTBEAT_S, BatcherCore
from adaptive_batcher.core.engine import Batch, Dispatch, Expire, Request, SetTimer
from adaptive_batcher.core.settings import SHED_LATE_NEEDS_SLO, BatcherSettings
from adaptive_batcher.errors import BatcherError
from adaptive_batcher.sim.faults import Faults
from adaptive_batcher.sim.result import Outcome, SimResult
from adaptive_batcher.sim.service import (
    MemoryLimit,
    ServiceModel,
    check_service_model,
    check_service_time,
)
from adaptive_batcher.sim.workloads import Arrivals, ClosedLoop
from adaptive_batcher.slo import SLO, check_slo
from adaptive_batcher.telemetry.base import TelemetrySample

__all__ = ["OOM_DETECT_FRACTION", "SimConfig", "Simulator"]

OOM_DETECT_FRACTION = 0.25  # an OOM batch fails a quarter of the way through its service time
_PREPARED = 512  # open-loop requests made ahead, to be queued in bulk


@dataclass(frozen=True)
class SimConfig(BatcherSettings):
    """The batcher under test, as a user would configure it: the settings of
    :class:`~adaptive_batcher.core.settings.BatcherSettings` (the same names, defaults and checks as
    ``AdaptiveBatcher``), plus what only a replay has.

    Attributes:
        deadline_ms: per-request deadline from arrival, ms (None: none), as ``submit``'s
            ``deadline_ms``.
        slo_changes: ``(time_s, slo)`` pairs: ``set_slo(slo)`` at that time, as
            ``AdaptiveBatcher.set_slo`` would; the result's goodput keeps using ``slo``.
        name: label in results.

    A ``service_profile`` file is read at construction and replaced by its rows.

    Raises:
        TypeError, ValueError: as :class:`~adaptive_batcher.core.settings.BatcherSettings`; a
            ``deadline_ms`` that is not a number > 0; an ``slo_changes`` time < 0 or an entry
            that is not an SLO (None, removing the SLO, is refused with ``shed_late``, as
            ``set_slo(None)`` is).
        FileNotFoundError, ValueError: an unreadable ``service_profile`` file.
    """

    deadline_ms: float | None = None
    slo_changes: tuple[tuple[float, SLO], ...] = ()
    name: str = ""

    def __post_init__(self) -> None:
        super().__post_init__()
        profile = self.service_profile
        if isinstance(profile, str | os.PathLike):  # read once: a file becomes its rows
            from adaptive_batcher.profile.format import read_service_profile  # only for a file

            self._set("service_profile", read_service_profile(profile))
        check_str("SimConfig.name", self.name)
        if self.deadline_ms is not None:  # as submit(deadline_ms=...) checks it
            check_number("SimConfig.deadline_ms", self.deadline_ms, 0.0, strict=True)
        for time_s, slo in self.slo_changes:
            check_number("SimConfig.slo_changes time_s", time_s, 0.0)
            if check_slo(slo, "SimConfig.slo_changes entries") is None and self.shed_late:
                raise ValueError(f"SimConfig.slo_changes entries: {SHED_LATE_NEEDS_SLO}")


_Part = tuple[float, float, Sequence[int], int, bool]
"""One model call within a dispatched batch (several when an OOM split it): ``(start_s, end_s,
ids, units, ok)``; ``ids`` is a range for a batch of consecutive requests (the common case)."""

_Completion = tuple[float, int, Batch[int], list[_Part]]


@dataclass
class _Run:
    """Mutable per-run state. Per-request and per-call figures are typed arrays, not lists:
    the garbage collector never walks their millions of entries, and numpy reads them as they
    are."""

    arrival_s: array[float] = field(default_factory=lambda: array("d"))
    size: array[int] = field(default_factory=lambda: array("q"))
    done_s: array[float] = field(default_factory=lambda: array("d"))
    outcome: array[int] = field(default_factory=lambda: array("b"))
    client: list[int] = field(default_factory=list)
    busy_s: float = 0.0
    decisions: list[tuple[float, float, int]] = field(default_factory=list)
    calls: array[float] = field(default_factory=lambda: array("d"))  # start, end, items, units


class Simulator:
    """Replays arrivals against one batcher configuration on a virtual clock.

    Args:
        service: service-time (and memory) model of the device.
        config: the batcher configuration.
        memory: device memory capacity over time (None: unlimited).
        seed: seed of the service-time noise (the arrivals carry their own).
        judge_slo: the SLO the result's goodput and SLO attainment are measured against
            (default: ``config.slo``), less its ``preprocess_ms``: the replay is of the batcher
            alone. A static batcher is judged against a scenario's SLO
            without being given one (with an SLO, a batcher tunes itself).
        faults: event-loop stalls, slowdowns and long batches to replay (see
            :mod:`adaptive_batcher.sim.faults`; None: none).

    Raises:
        TypeError: an argument of the wrong type (``service`` without ``service_s``, a
            ``config`` that is not a :class:`SimConfig`, ``faults`` not a :class:`Faults`,
            and so on; the message names it).
        ValueError: a negative ``seed``.
    """

    def __init__(
        self,
        service: ServiceModel,
        config: SimConfig,
        *,
        memory: MemoryLimit | None = None,
        seed: int = 0,
        judge_slo: SLO | None = None,
        faults: Faults | None = None,
    ) -> None:
        self.service, self.config, self.memory = _check_replay_setup(service, config, memory)
        self.seed = check_int("seed", seed, 0)
        self.judge_slo = check_slo(judge_slo, "judge_slo") or config.slo
        if faults is not None and not isinstance(faults, Faults):
            raise TypeError(f"faults must be a Faults or None, got {type(faults).__name__}")
        self.faults = faults or None

    def run(self, workload: Arrivals | ClosedLoop) -> SimResult:
        """Replay ``workload``: open-loop :class:`Arrivals`, or :class:`ClosedLoop` clients (for
        their ``duration_s``).

        Returns:
            The per-request outcomes and the summary metrics (see :class:`SimResult`).

        Raises:
            TypeError: ``workload`` is neither; the service model returned a time that is not
                a number.
            ValueError: the service model returned a time that is NaN, infinite or negative
                (the message names the model, the batch size and the value); or, with
                ``ClosedLoop(think_s=0)``, a request ended at the instant it was sent (answered
                with no service time and no window, refused by a full queue, or shed at once):
                its client would send again at once, forever, without the clock moving.
        """
        if not isinstance(workload, Arrivals | ClosedLoop):
            raise TypeError(
                f"workload must be Arrivals or a ClosedLoop, got {type(workload).__name__}"
            )
        return _Replay(self, workload).run()


_OUTCOME_NAMES = {Outcome.OK: "answered", Outcome.REJECTED: "refused", Outcome.EXPIRED: "expired"}


def _no_progress(client: int, request_id: int, outcome: int, at_s: float) -> str:
    """Why a closed loop with no think time cannot go on: a request that took no time."""
    how = _OUTCOME_NAMES.get(outcome, "failed")
    return (
        f"ClosedLoop(think_s=0) makes no progress: client {client}'s request {request_id} was "
        f"{how} at the instant it was sent ({at_s:g} s), so the client would send again at "
        "once, forever, and the virtual clock would never advance; give the clients a think "
        "time > 0, or make every request take time (a service time > 0 or a window > 0, and a "
        "queue with room for every client)"
    )


def _seen_arrivals(times_s: npt.ArrayLike, faults: Faults | None) -> npt.NDArray[np.float64]:
    """Arrival times as the batcher sees them: one that falls in a loop stall reaches it when
    the stall ends (the result keeps the arrival itself)."""
    times = np.ascontiguousarray(times_s, dtype=float)
    if faults is None or not faults.has_stalls:
        return times
    return np.fromiter((faults.seen_s(t) for t in times.tolist()), float, len(times))


def _check_replay_setup(
    service: object, config: object, memory: object
) -> tuple[ServiceModel, SimConfig, MemoryLimit | None]:
    """A simulator's service, config and memory, checked (a cluster's replicas are simulators).

    Raises:
        TypeError: ``service`` is not a :class:`ServiceModel`, ``config`` not a
            :class:`SimConfig`, ``memory`` neither a :class:`MemoryLimit` nor None.
    """
    service = check_service_model("service", service)
    if not isinstance(config, SimConfig):
        raise TypeError(f"config must be a SimConfig, got {type(config).__name__}")
    if memory is not None and not isinstance(memory, MemoryLimit):
        raise TypeError(f"memory must be a MemoryLimit or None, got {type(memory).__name__}")
    return service, config, memory


def _own_policy(config: SimConfig) -> SimConfig:
    """``config`` with a copy of its policy: a policy holds its controller's state (a PID's
    integrator, a bandit's arm statistics and generator), so a replay that used the configured
    object itself would start where the last replay with that configuration stopped, and the
    replicas of a cluster would share one controller's state."""
    if config.policy is None:
        return config
    return replace(config, policy=copy.deepcopy(config.policy))


class _Replay:
    """One replay: the event loop over arrivals, batch completions and the core's timer."""

    def __init__(self, sim: Simulator, workload: Arrivals | ClosedLoop | None) -> None:
        """``workload`` None: the requests are offered one by one from outside (a replica
        behind a router, see :mod:`adaptive_batcher.sim.cluster`)."""
        config = sim.config
        self.sim = sim
        self.config = config
        self.buckets = config.buckets  # a batch runs padded to its bucket, as the runtime pads it
        self.rng = np.random.default_rng(sim.seed)
        self.state = _Run()
        self.core: BatcherCore[int] = BatcherCore(
            _own_policy(config),
            read_telemetry=self._telemetry,
            on_decision=self._note_decision,
            exported=False,  # no exporter reads a replay's cumulative histogram
        )
        self.recorder = self.core.recorder
        self.deadline_s = None if config.deadline_ms is None else config.deadline_ms / 1e3
        self.slo_changes = sorted(config.slo_changes, key=lambda change: change[0])
        self.completions: list[_Completion] = []
        self.sequence = itertools.count()
        self.timer_at: float | None = None
        self.poll_pending = False
        self.now = 0.0
        self.running_units = 0
        self.open_count = 0
        self.open_workload: Arrivals | None = None
        self.prepared: list[Request[int]] = []  # requests open_from.. made ahead
        self.prepared_from = 0
        self.closed: ClosedLoop | None = None
        self.closed_heap: list[tuple[float, int, int]] = []
        self.end_s = math.inf
        faults = sim.faults
        self.faults = faults
        self.seen = faults.seen_s if faults is not None and faults.has_stalls else None
        self.long_batches = list(faults.long_batches) if faults is not None else []
        self.stalls = list(faults.stalls) if faults is not None else []  # (start, end), unseen
        self.next_stall_end = self.stalls[0][1] if self.stalls else math.inf
        if isinstance(workload, ClosedLoop):
            self.closed, self.end_s = workload, workload.duration_s
            for client, at in enumerate(workload.first_arrivals(self.rng)):
                at = float(at) if self.seen is None else self.seen(float(at))
                heapq.heappush(self.closed_heap, (at, next(self.sequence), client))
        elif workload is not None:
            count = self.open_count = len(workload)
            self.open_workload = workload
            state = self.state
            state.arrival_s.frombytes(_seen_arrivals(workload.times_s, faults).tobytes())
            state.size.frombytes(np.ascontiguousarray(workload.sizes, dtype=np.int64).tobytes())
            state.done_s = array("d", [math.nan]) * count
            state.outcome = array("b", [Outcome.PENDING]) * count
        self.name = "replica" if workload is None else workload.name
        self.core.start(0.0)

    # -- the event loop ---------------------------------------------------------------------

    def run(self) -> SimResult:
        times, count = self.state.arrival_s, self.open_count
        index = 0
        closed_heap, inf = self.closed_heap, math.inf
        while True:
            next_open = times[index] if index < count else inf
            next_closed = closed_heap[0][0] if closed_heap else inf
            next_arrival = next_open if next_open <= next_closed else next_closed
            self.advance_to(next_arrival)  # completions, timers and polls due before it
            next_closed = closed_heap[0][0] if closed_heap else inf  # clients may have sent
            if next_closed < next_arrival:
                next_arrival = next_closed
            if next_arrival == inf:
                break
            if next_open <= next_closed:
                next_done = self.completions[0][0] if self.completions else inf
                next_timer = self.timer_at if self.timer_at is not None else inf
                index = self._arrive_open(index, min(next_done, next_timer, self.next_stall_end))
            else:
                self.now, _, client = heapq.heappop(closed_heap)
                if self.now <= self.end_s:
                    request_id = self._add_closed_request(client)
                    self._arrive(request_id, self.state.size[request_id])
        return self._result()

    def advance_to(self, until_s: float) -> None:
        """Carry out every completion, timer and pending poll due before an arrival at
        ``until_s`` (completions and timers at ``until_s`` come first; a poll pending at
        ``until_s`` waits for the arrivals of that instant, which join one batch, like the
        runtime's pump); ``inf`` runs everything left. Closed-loop clients who send again
        meanwhile bring the bound forward to their arrival."""
        completions, closed_heap, inf = self.completions, self.closed_heap, math.inf
        while True:
            if closed_heap and closed_heap[0][0] < until_s:  # a client sent again meanwhile
                until_s = closed_heap[0][0]
            next_done = completions[0][0] if completions else inf
            next_timer = self.timer_at if self.timer_at is not None else inf
            now = self.now
            stall_end = self.next_stall_end
            if self.poll_pending and until_s > now and next_done > now and next_timer > now:
                self._poll()
            elif (
                stall_end < inf and stall_end <= until_s and stall_end <= min(next_done, next_timer)
            ):
                self._stall_ends()
            elif next_done <= until_s and next_done <= next_timer and next_done < inf:
                self.now = next_done
                self._complete(heapq.heappop(completions))
            elif next_timer <= until_s and next_timer < inf:
                self.now = next_timer
                self.timer_at = None
                self._poll()
            else:
                return

    def _stall_ends(self) -> None:
        """The next loop stall ends: the shell's heartbeat, due within ``HEARTBEAT_S`` of its
        start if requests were in the system then (nothing has happened since), fires late now,
        as the asyncio shell's does (see :class:`~adaptive_batcher.runtime.driver.LoopDriver`)."""
        start, end = self.stalls.pop(0)
        self.next_stall_end = self.stalls[0][1] if self.stalls else math.inf
        self.now = max(self.now, end)
        if not self.core.idle:
            self.core.timer_fired(start + HEARTBEAT_S, end)

    # -- driven from outside: a replica behind a router --------------------------------------

    def offer(self, at_s: float, size: int) -> int:
        """A request of ``size`` units arrives at ``at_s`` (after :meth:`advance_to` it);
        returns its number in this replica."""
        self.now = at_s
        request_id = self._add_request(size, client=-1)
        self._arrive(request_id, size)
        return request_id

    @property
    def outstanding_units(self) -> int:
        """Units queued or running: what a load-aware router compares."""
        return self.core.queued_units + self.running_units

    def finish(self) -> SimResult:
        """Run what is left to its end and return the result."""
        self.advance_to(math.inf)
        return self._result()

    def _result(self) -> SimResult:
        state, workload = self.state, self.open_workload
        if workload is not None:  # the same values as the lists, converted at C speed
            arrival_s, sizes = np.array(workload.times_s), workload.sizes
        else:
            arrival_s, sizes = np.array(state.arrival_s), np.array(state.size)
        return SimResult.build(
            name=self.config.name or self.name,
            arrival_s=arrival_s,
            done_s=np.array(state.done_s),
            outcome=np.array(state.outcome),
            sizes=sizes,
            slo=self.sim.judge_slo,
            counts=self.recorder.counts(),
            busy_s=state.busy_s,
            decisions=state.decisions,
            slots=self.config.max_concurrent_batches,
            calls=np.array(state.calls).reshape(-1, 4),
        )

    def _add_closed_request(self, client: int) -> int:
        closed = self.closed
        assert closed is not None
        # one unit each by default (drawing nothing), else one draw from the loop's sampler
        size = 1 if closed.sizes is None else int(closed.sample_sizes(1, self.rng)[0])
        return self._add_request(size, client)

    def _add_request(self, size: int, client: int) -> int:
        """A request made during the run (closed loop, or offered): its number."""
        state = self.state
        state.arrival_s.append(self.now)
        state.size.append(size)
        state.done_s.append(math.nan)
        state.outcome.append(Outcome.PENDING)
        state.client.append(client)
        return len(state.arrival_s) - 1

    def _arrive(self, request_id: int, size: int) -> None:
        now = self.now
        deadline = None if self.deadline_s is None else now + self.deadline_s
        self._arrive_request(Request(request_id, now, size, deadline))

    def _arrive_request(self, request: Request[int]) -> None:
        try:
            if self.core.arrive(request, self.now):
                self.poll_pending = True
        except BatcherError:
            self._finish(request.handle, Outcome.REJECTED)

    def _arrive_open(self, index: int, before_s: float) -> int:
        """Queue the open-loop arrivals from ``index`` on, in bulk, as one-by-one arrivals would
        be: those before ``before_s`` (the next completion or timer), or while a poll is pending
        only those at this instant, up to the first that needs a poll. Returns the next index."""
        times = self.state.arrival_s
        if self.poll_pending:  # arrivals at the same instant join one batch; then the poll
            stop = bisect_right(times, self.now, index)
        else:
            stop = bisect_left(times, before_s, index)
        base = self.prepared_from
        if index >= base + len(self.prepared):
            base = self._prepare(index)
        stop = min(stop, base + len(self.prepared))
        end, poll = self.core.arrive_many(self.prepared, index - base, stop - base)
        end += base
        if end > index:
            self.now = times[end - 1]
        if poll:
            self.poll_pending = True
        elif end < stop:  # refused: the one-by-one path raises and counts it
            self.now = times[end]
            self._arrive_request(self.prepared[end - base])
            end += 1
        return end

    def _prepare(self, index: int) -> int:
        """Make the requests ``index`` onwards (up to _PREPARED of them); returns ``index``."""
        state, deadline_s = self.state, self.deadline_s
        stop = min(index + _PREPARED, self.open_count)
        times, sizes = state.arrival_s[index:stop], state.size[index:stop]
        if deadline_s is None:
            self.prepared = list(map(Request, range(index, stop), times, sizes))
        else:
            deadlines = [t + deadline_s for t in times]
            self.prepared = list(map(Request, range(index, stop), times, sizes, deadlines))

        self.prepared_from = index
        return index

    def _poll(self) -> None:
        self.poll_pending = False
        while self.slo_changes and self.slo_changes[0][0] <= self.now:
            self.core.set_slo(self.slo_changes.pop(0)[1], self.now)
        for action in self.core.poll(self.now):
            if type(action) is Dispatch:
                self._dispatch(action.batch)
            elif type(action) is Expire:
                self.core.count_expired(1)
                self._finish(action.request.handle, Outcome.EXPIRED)
            elif type(action) is SetTimer:
                at, seen = action.at_s, self.seen
                self.timer_at = at if at is None or seen is None else seen(at)

    def _note_decision(self, now: float, decision: Decision) -> None:
        self.state.decisions.append((now, decision.window_ms, decision.max_batch_size))

    def _finish(self, request_id: int, outcome: int, at_s: float | None = None) -> None:
        state = self.state
        done = self.now if at_s is None else at_s
        state.done_s[request_id] = done
        state.outcome[request_id] = outcome
        if self.closed is None:
            return
        client = state.client[request_id]
        if client >= 0:
            if self.closed.think_s == 0 and done <= state.arrival_s[request_id]:
                raise ValueError(_no_progress(client, request_id, outcome, done))
            at = max(self.closed.next_arrival(done, self.rng), self.now)  # never in the past
            if self.seen is not None:
                at = self.seen(at)
            heapq.heappush(self.closed_heap, (at, next(self.sequence), client))

    # -- running a batch --------------------------------------------------------------------

    def _dispatch(self, batch: Batch[int]) -> None:
        parts: list[_Part] = []
        requests = batch.requests
        first, last = requests[0].handle, requests[-1].handle
        ids: Sequence[int]
        if last - first + 1 == len(requests):  # FIFO: request numbers increase in a batch
            ids = range(first, last + 1)
        else:
            ids = [r.handle for r in requests]
        end = self._execute(ids, self.now, parts, batch.units)
        self.running_units += batch.units
        heapq.heappush(self.completions, (end, next(self.sequence), batch, parts))

    def _execute(
        self, ids: Sequence[int], start: float, parts: list[_Part], units: int | None = None
    ) -> float:
        """Schedule ``ids`` (``units`` in all, if known) from ``start``, split on OOM; returns
        when the slot frees."""
        if units is None:
            size = self.state.size
            if type(ids) is range:
                units = sum(size[ids[0] : ids[0] + len(ids)])
            else:
                units = sum(size[i] for i in ids)

        model = self.sim.service
        run_units = padded_size(self.buckets, units)  # padding runs too
        service = model.service_s(run_units, self.rng)
        if type(service) is not float or not 0.0 <= service <= MAX_SERVICE_S:  # NaN fails too
            service = check_service_time(model, run_units, service)
        if self.faults is not None:
            service = self._with_faults(start, service)
        memory = self.sim.memory
        if memory is not None and memory.is_oom(model, run_units, start):
            busy = OOM_DETECT_FRACTION * service
            failed_at = self._seen_end(start + busy)
            self.core.record_device_time(busy)
            self.state.busy_s += busy
            parts.append((start, failed_at, ids, units, False))
            # known at dispatch: the controller ticks at the next poll
            halves = self.core.split_failed_call(ids, oom=True, units=units)
            if halves is None:
                return failed_at
            first, second = halves
            after_first = self._execute(first, failed_at, parts)
            return self._execute(second, after_first, parts)
        self.core.record_device_time(service)
        self.state.busy_s += service
        end = self._seen_end(start + service)
        parts.append((start, end, ids, units, True))
        return end

    def _with_faults(self, start: float, service: float) -> float:
        """``service`` for a batch that starts at ``start``, with the replay's slowdowns and
        the first long batch due (each long batch applies once)."""
        assert self.faults is not None
        service = self.faults.service_s(start, service)
        long_batches = self.long_batches
        while long_batches and long_batches[0].at_s <= start:
            service += long_batches.pop(0).extra_s
        return service

    def _seen_end(self, end: float) -> float:
        """When the shell sees a model call that ends at ``end`` (after a loop stall)."""
        return end if self.seen is None else self.seen(end)

    def _complete(self, event: _Completion) -> None:
        _, _, batch, parts = event
        state, core = self.state, self.core
        idle = batch.window_idle_s  # counted once per dispatched batch
        for start, end, ids, units, ok in parts:
            count = len(ids)
            state.calls.extend((start, end, count, units))
            consecutive = type(ids) is range
            if ok:
                if consecutive:
                    arrivals = state.arrival_s[ids[0] : ids[0] + count].tolist()
                else:
                    arrivals = [state.arrival_s[i] for i in ids]
                core.record_answers(arrivals, 0, end)
                core.record_run(end, count, units, end - start, idle)
                idle = 0.0
                outcome = Outcome.OK
            elif count == 1:  # an OOM on a single item: it cannot be split further
                core.count_failed(1)
                outcome = Outcome.FAILED
            else:
                continue  # split and re-run: the halves are parts of their own
            if self.closed is not None:
                for request_id in ids:
                    self._finish(request_id, outcome, end)
            elif consecutive:  # the common, open-loop case, inlined
                state.done_s[ids[0] : ids[0] + count] = array("d", [end]) * count
                state.outcome[ids[0] : ids[0] + count] = array("b", [outcome]) * count
            else:
                done_s, outcomes = state.done_s, state.outcome
                for request_id in ids:
                    done_s[request_id] = end
                    outcomes[request_id] = outcome
        self.running_units -= batch.units
        core.complete(batch, self.now)
        self._poll()

    def _telemetry(self, now: float) -> TelemetrySample:
        memory = self.sim.memory
        if memory is None:
            return TelemetrySample(time_s=now, source="sim")
        total = memory.capacity_at(0.0)
        capacity = memory.capacity_at(now)
        used = self.sim.service.memory_bytes(max(self.running_units, 1))
        free = max(0.0, capacity - (0.0 if math.isnan(used) else used))
        return TelemetrySample(
            time_s=now, mem_total_bytes=int(total), mem_free_bytes=int(free), source="sim"
        )

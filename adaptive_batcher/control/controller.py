"""The sans-IO controller: counters and samples in (with ``now``), a Decision out, once per tick.

The controller knows nothing of engines or event loops:
:class:`~adaptive_batcher.core.batcher_core.BatcherCore` asks :meth:`Controller.due` on every
poll, calls :meth:`Controller.tick` when a tick is due and applies the decision to its engine.
Every decision is a ``controller.decision`` log event with the inputs that drove it. A policy
that raises is logged (``controller.policy_failed``) and the last decision stands: serving never
stops for the controller.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Final

from adaptive_batcher._log import get_logger
from adaptive_batcher.control.guards import (
    BucketGuard,
    BudgetGuard,
    Guard,
    MemoryGuard,
    PowerGuard,
    ShedGuard,
    StallGuard,
    StepGuard,
)
from adaptive_batcher.control.guards.cap_probe import CapProbeGuard
from adaptive_batcher.control.guards.unused_window import UnusedWindowGuard
from adaptive_batcher.control.loop_lag import LoopLag
from adaptive_batcher.control.policy import GuardFactory, Policy, declares_shedding
from adaptive_batcher.control.service_estimator import ServiceTimeEstimator
from adaptive_batcher.control.slack import TailSlack
from adaptive_batcher.control.types import Bounds, Decision, Observation
from adaptive_batcher.metrics.recorder import Counts, Recorder
from adaptive_batcher.slo import SLO
from adaptive_batcher.telemetry.base import TelemetrySample

__all__ = ["Controller", "GuardFactory", "default_guards"]

_log = get_logger()
STALL_MEMORY_S = 30.0
"""How long a loop stall counts towards the recent stall rate, s."""
AFTER_STALL_S = 0.02
"""A tick this long after a loop stall ends, whenever the last came: by then the shell has
taken in the requests the stall held back, and the plan sees the queue it left."""

_LISTED_QUANTILES = (0.5, 0.9, 0.95, 0.99)  # those a Quantiles reading holds


def default_guards(
    warmed: Callable[[], frozenset[int]] | None = None, *, shed_late: bool = False
) -> list[GuardFactory]:
    """The standard guard chain, innermost first: unused window, budget, power back-off, step
    limit, recurring stalls, memory, the cap probe, SLO-aware shedding when ``shed_late`` is
    True, and buckets when ``warmed`` is given."""
    guards: list[GuardFactory] = [
        UnusedWindowGuard,
        BudgetGuard,
        PowerGuard,
        StepGuard,
        StallGuard,
        MemoryGuard,
        CapProbeGuard,
    ]
    if shed_late:
        guards.append(ShedGuard)
    if warmed is not None:
        guards.append(lambda inner: BucketGuard(inner, warmed))
    return guards


WATCHDOG_INTERVALS: Final = 2.0
"""Intervals after the last tick at which a tick is overdue (:meth:`Controller.overdue_at`):
two, so that a poll that comes within a batch of the tick's due time (the usual case) is not
preceded by one more, while a model that holds every slot far longer (a hung call) still lets
the controller tick and set a shedding deadline."""


@dataclass(frozen=True, slots=True)
class _Snapshot:
    now_s: float
    counts: Counts


class Controller:
    """Runs a policy (wrapped in guards) on a tick and keeps the last safe decision.

    Args:
        policy: the control law.
        bounds: the range every decision is clamped into.
        slo: the latency objective (None: policies that need one hold).
        interval_s: seconds between decisions (ticks ride on engine polls: arrivals, timers,
            finished batches).
        interval_batches: also tick after this many finished batches, however soon (None: time
            only). Useful for slow models, where a quarter second holds few batches, or very
            fast traffic, to react within a few batches.
        guards: guard factories, innermost first (default :func:`default_guards`).
        service_estimator: the controller's online estimate of batch service time, fed every
            tick (default: a new one).
        latency_span_s: the span of recent latencies the observation reports.
        tail_slack: how far the window's planning budget may follow the room the measured
            tail leaves (default: a new :class:`~adaptive_batcher.control.slack.TailSlack`;
            ``TailSlack(max_scale=1)``: the plan's bound alone).

    ``decisions`` counts the decisions taken, ``reasons`` the same by their ``reason`` tag.

    Raises:
        ValueError: a non-positive ``interval_s`` or ``latency_span_s``.
        TypeError: a ``tail_slack`` that is not a ``TailSlack`` (or None).
    """

    def __init__(
        self,
        policy: Policy,
        bounds: Bounds,
        *,
        slo: SLO | None = None,
        interval_s: float = 0.25,
        interval_batches: int | None = None,
        guards: Sequence[GuardFactory] | None = None,
        service_estimator: ServiceTimeEstimator | None = None,
        latency_span_s: float = 2.0,
        tail_slack: TailSlack | None = None,
    ) -> None:
        if not interval_s > 0 or not latency_span_s > 0:
            raise ValueError("interval_s and latency_span_s must be > 0")
        if interval_batches is not None and interval_batches < 1:
            raise ValueError(f"interval_batches must be >= 1 or None, got {interval_batches!r}")
        self.interval_batches = interval_batches
        self.bounds = bounds
        self.slo = slo
        self.interval_s = interval_s
        self.latency_span_s = latency_span_s
        self.service_estimator = service_estimator or ServiceTimeEstimator()
        if tail_slack is not None and not isinstance(tail_slack, TailSlack):
            raise TypeError(
                f"tail_slack must be a TailSlack or None, got {type(tail_slack).__name__}"
            )
        self.tail_slack = TailSlack() if tail_slack is None else tail_slack
        self._guard_factories = list(default_guards() if guards is None else guards)
        self.policy = policy
        self.chain: Policy = self._wrap(policy)
        self.sheds = _sheds(self.chain)
        """Whether the policy or a guard of the chain declares shedding (``sheds = True``, as
        ``ShedGuard`` does); kept with the chain, since the core asks on every poll."""
        self.decision: Decision | None = None
        self.decisions = 0
        self.reasons: Counter[str] = Counter()
        self.failures = 0
        self._last: _Snapshot | None = None
        self._rates: deque[tuple[float, float]] = deque()  # (time, per-tick arrival rate)
        self.loop_stall: tuple[float, float] = (-math.inf, -math.inf)  # the latest, (start, end)
        self.loop_stalls = 0
        self._stalls: deque[tuple[float, float]] = deque()  # (start, end), began in memory
        self.loop_lag = LoopLag()

    @property
    def slo_unreachable(self) -> bool:
        """True while the last decision found the SLO out of reach even at the smallest batch
        (a guard says so in the decision; see :class:`~adaptive_batcher.control.BudgetGuard`)."""
        return self.decision is not None and self.decision.slo_unreachable

    def start(self, current: Decision, now: float, counts: Counts) -> None:
        """Begin from the settings in force at ``now`` (the policy is reset to them)."""
        self.adopt(current)
        self._last = _Snapshot(now, counts)

    def adopt(self, current: Decision) -> None:
        """Continue from ``current`` (settings changed from outside, e.g. ``set_limits``): the
        policy is reset to them, clamped into the bounds (bumpless transfer)."""
        self.decision = self.bounds.clamp(current)
        self.chain.reset(self.decision)

    def set_policy(self, policy: Policy) -> None:
        """Switch policy; it takes over from the settings in force at the next tick (bumpless)."""
        old, self.policy = self.chain, policy
        self.chain = self._wrap(policy)
        self.sheds = _sheds(self.chain)
        if self.decision is not None:
            # from the settings the old policy chose: a guard's temporary window 0 (a probe,
            # an unused window) would be kept for good by a policy that keeps what is in force
            in_force = old.chosen(self.decision) if isinstance(old, Guard) else self.decision
            self.chain.reset(in_force)

    def set_slo(self, slo: SLO | None) -> None:
        """Change the objective; it applies from the next tick (the window is planned to its
        budget alone until the measured tail shows room again)."""
        self.slo = slo
        self.tail_slack.reset()

    def note_loop_lag(self, late_s: float, now_s: float) -> None:
        """The shell's heartbeat fired at ``now_s``, ``late_s`` seconds late, short of a stall:
        the next observations set the recent lag aside from the SLO's room
        (``loop_lag_ms``)."""
        self.loop_lag.note(late_s, now_s)

    def loop_lag_ms(self, now_s: float) -> float:
        """The event loop's lag set aside from the SLO at ``now_s``, ms: the recent
        heartbeats' p99 lateness, at most ``LAG_BUDGET_SHARE`` of the SLO's batcher budget (0
        without an SLO; see :class:`~adaptive_batcher.control.loop_lag.LoopLag`)."""
        slo = self.slo
        return self.loop_lag.budgeted_ms(slo.batcher_budget_ms, now_s) if slo else 0.0

    def loop_lag_typical_ms(self, now_s: float) -> float:
        """The event loop's median lag at ``now_s``, ms, at most :meth:`loop_lag_ms` (0
        without an SLO): what shed deadlines set aside."""
        slo = self.slo
        return self.loop_lag.typical_ms(slo.batcher_budget_ms, now_s) if slo else 0.0

    def note_loop_stall(self, start_s: float, end_s: float) -> None:
        """The shell's event loop stood still from ``start_s`` to ``end_s`` (seconds on its
        clock): the batches that ran across it are kept out of the service-time fit (they
        measured the stall), and the next observations say so (``loop_stall_s``)."""
        self.loop_stall = (start_s, end_s)
        self.loop_stalls += 1
        self._stalls.append((start_s, end_s))

    def loop_stall_rate_hz(self, now: float) -> float:
        """Recent stalls per second over the ``n >= 2`` stalls that began within
        ``STALL_MEMORY_S`` of ``now`` (else 0): ``(n - 1)`` gaps over the span from the first
        start to the last, stretched only by the time the next stall is overdue (the span
        since the last start beyond the mean gap), so the rate holds until a stall fails to
        come when the last ones would have it come."""
        starts = [start for start, _ in self._recent_stalls(now)]
        if len(starts) < 2 or now <= starts[0]:
            return 0.0
        gaps = len(starts) - 1
        span = starts[-1] - starts[0]
        overdue = now - starts[-1] - span / gaps
        stretched = span + max(0.0, overdue)
        return gaps / stretched if stretched > 0 else 0.0

    def loop_stall_durations_s(self, now: float) -> tuple[float, ...]:
        """How long each stall counted in :meth:`loop_stall_rate_hz` lasted, s (empty with
        fewer than two)."""
        stalls = self._recent_stalls(now)
        return tuple(end - start for start, end in stalls) if len(stalls) >= 2 else ()

    def _recent_stalls(self, now: float) -> deque[tuple[float, float]]:
        stalls = self._stalls
        while stalls and now - stalls[0][0] > STALL_MEMORY_S:
            stalls.popleft()
        return stalls

    def due(self, now: float, batches: int | None = None) -> bool:
        """True when a tick is due at ``now`` (``batches``: batches finished so far, for
        ``interval_batches``)."""
        last = self._last
        if last is None or now - last.now_s >= self.interval_s:
            return True
        if last.now_s < self.loop_stall[1] + AFTER_STALL_S <= now:
            return True  # the requests a loop stall held back are in: the queue it left
        every = self.interval_batches
        return every is not None and batches is not None and batches - last.counts.batches >= every

    def overdue_at(self) -> float:
        """When a tick is overdue, s: ``WATCHDOG_INTERVALS`` intervals after the last (or the
        start); inf before :meth:`start`. A shedding core with no shedding deadline in force
        polls by then while requests wait or run, even if no batch finishes (a hung model), so
        that the queue is still shed."""
        last = self._last
        return math.inf if last is None else last.now_s + WATCHDOG_INTERVALS * self.interval_s

    def tick(
        self,
        now: float,
        recorder: Recorder,
        queue_depth: int,
        queued_units: int,
        telemetry: TelemetrySample,
        slots: int = 1,
    ) -> Decision | None:
        """Observe, decide, and return the new decision if it differs from the one in force.

        ``slots``: the execution slots in force (the plans count on them).
        """
        counts = recorder.counts()
        if self.decision is None or self._last is None:
            raise RuntimeError("Controller.start() must be called before tick()")
        self.service_estimator.update(
            recorder.batches, counts.batches, self.loop_stall, self.bounds.padded_size
        )
        observation = self._observe(
            now, recorder, counts, (queue_depth, queued_units, slots), telemetry
        )
        floor = observation.predicted_window_floor_ms()
        observation = observation.with_plan_kept(window_floor_ms=floor)
        scale = self.tail_slack.update(observation)
        observation = observation.with_plan_kept(window_budget_scale=scale)
        self._last = _Snapshot(now, counts)
        try:
            proposed = self.chain.decide(observation)
        except Exception as exc:
            self.failures += 1
            _log.error(
                "controller.policy_failed",
                policy=self.chain.name,
                error=repr(exc),
                window_ms=self.decision.window_ms,
                max_batch_size=self.decision.max_batch_size,
            )
            return None
        decision = self.bounds.clamp(proposed)
        self.decisions += 1
        self.reasons[decision.reason] += 1
        _log_decision(observation, decision, self.chain.name)
        changed = decision != self.decision.with_(reason=decision.reason)
        self.decision = decision
        return decision if changed else None

    @property
    def shed_after_s(self) -> float | None:
        """Seconds after arrival at which a still-queued request that joined a queue holding a
        full batch is shed (None: no shedding)."""
        shed = self.decision.shed_after_ms if self.decision is not None else None
        return None if shed is None else shed / 1e3

    @property
    def shed_after_short_s(self) -> float | None:
        """The same for a request that joined a shorter queue (None: no shedding)."""
        decision = self.decision
        if decision is None or decision.shed_after_ms is None:
            return None
        shed = decision.shed_after_short_ms
        return (decision.shed_after_ms if shed is None else shed) / 1e3

    def _wrap(self, policy: Policy) -> Policy:
        chain = policy
        for factory in self._guard_factories:
            chain = factory(chain)
        return chain

    def _observe(
        self,
        now: float,
        recorder: Recorder,
        counts: Counts,
        queue: tuple[int, int, int],
        telemetry: TelemetrySample,
    ) -> Observation:
        assert self._last is not None and self.decision is not None
        queue_depth, queued_units, slots = queue
        before = self._last.counts
        interval = max(now - self._last.now_s, 1e-9)
        batches = counts.batches - before.batches
        items = counts.batch_items - before.batch_items
        units = counts.batch_units - before.batch_units
        answered = (counts.completed - before.completed) + (counts.failed - before.failed)
        arrival_rate = (counts.submitted - before.submitted) / interval
        busy_s = counts.device_busy_s - before.device_busy_s
        model = self.service_estimator
        quantile = self.slo.quantile if self.slo is not None else 0.99
        recent = recorder.latency.quantiles(now, span_s=self.latency_span_s)
        if quantile in _LISTED_QUANTILES:  # the same reading, already taken
            latency = recent.quantile_ms(quantile)
        else:
            latency = recorder.latency.quantile_ms(quantile, now, span_s=self.latency_span_s)
        return Observation(
            now_s=now,
            interval_s=interval,
            tick_interval_s=self.interval_s,
            current=self.decision,
            bounds=self.bounds,
            slo=self.slo,
            latency_ms=latency,
            p50_ms=recent.p50_ms,
            mean_ms=recent.mean_ms,
            latency_samples=recent.count,
            queue_depth=queue_depth,
            queued_units=queued_units,
            arrival_rate_rps=arrival_rate,
            arrival_rate_peak_rps=self._peak_rate(now, arrival_rate),
            throughput_rps=answered / interval,
            goodput_rps=(counts.within_slo - before.within_slo) / interval,
            rejected=counts.rejected - before.rejected,
            expired=counts.expired - before.expired,
            failed=counts.failed - before.failed,
            oom_errors=counts.oom_size_errors - before.oom_size_errors,
            oom_units=_smallest_oom(recorder, counts.oom_size_errors - before.oom_size_errors),
            batches=batches,
            mean_batch_size=items / batches if batches else math.nan,
            fill_ratio=units / batches / self.decision.max_batch_size if batches else math.nan,
            mean_request_units=units / items if items else 1.0,
            window_idle_fraction=_idle_fraction(before, counts, self.decision.window_ms),
            largest_batch_size=_largest(recorder, batches),
            service_median_ms=model.median_ms,
            service_samples=model.samples,
            service_samples_at=model.samples_at,
            service_spread_ms=model.spread_ms,
            service_median_bound_ms=model.median_bound_ms,
            service_body_spread_ms=model.body_spread_ms,
            service_body_p999_ms=model.body_p999_ms,
            service_p99_ms=model.p99_ms,
            service_mean_ms=model.mean_ms,
            service_pauses_ms=model.added_pauses_ms(),
            contention=model.contention,
            last_stall_s=model.last_stall_s,
            recent_stalls=tuple(model.recent_stalls),
            loop_stall_s=self.loop_stall[1],
            loop_stall_rate_hz=self.loop_stall_rate_hz(now),
            loop_stall_durations_s=self.loop_stall_durations_s(now),
            outlier_elasticity=model.outlier_elasticity,
            slots=slots,
            device_ms_per_request=busy_s * 1e3 / answered if answered else math.nan,
            device_busy_fraction=busy_s / interval / max(1, slots),
            telemetry=telemetry,
            answer_share=_answer_share(recorder.answer_shares),
            loop_lag_ms=self.loop_lag_ms(now),
            loop_lag_typical_ms=self.loop_lag_typical_ms(now),
        )

    def _peak_rate(self, now: float, rate: float) -> float:
        """The highest per-tick arrival rate within the last ``latency_span_s`` (this one too)."""
        rates = self._rates
        rates.append((now, rate))
        while rates and rates[0][0] < now - self.latency_span_s:
            rates.popleft()
        return max(r for _, r in rates)


def _sheds(chain: Policy) -> bool:
    """Whether ``chain`` or a guard or policy inside it declares shedding."""
    node: object = chain
    while node is not None:
        if declares_shedding(node):
            return True
        node = getattr(node, "inner", None)
    return False


def _log_decision(observation: Observation, decision: Decision, policy: str) -> None:
    _log.debug(
        "controller.decision",
        policy=policy,
        reason=decision.reason,
        window_ms=round(decision.window_ms, 3),
        max_batch_size=decision.max_batch_size,
        shed_after_ms=decision.shed_after_ms,
        previous_window_ms=round(observation.current.window_ms, 3),
        previous_max_batch_size=observation.current.max_batch_size,
        latency_ms=_round(observation.latency_ms),
        target_ms=_round(observation.target_ms),
        loop_lag_ms=round(observation.loop_lag_ms, 3),
        window_floor_ms=_round(observation.window_floor_ms),
        latency_samples=observation.latency_samples,
        window_budget_scale=round(observation.window_budget_scale, 4),
        queue_depth=observation.queue_depth,
        arrival_rate_rps=round(observation.arrival_rate_rps, 1),
        throughput_rps=round(observation.throughput_rps, 1),
        goodput_rps=round(observation.goodput_rps, 1),
        mean_batch_size=_round(observation.mean_batch_size),
        service_ms_at_cap=_round(observation.service_median_ms(decision.max_batch_size)),
        free_memory_fraction=observation.telemetry.free_fraction,
        device_ms_per_request=_round(observation.device_ms_per_request),
        service_spread=_round(_spread(observation, decision.max_batch_size)),
        contention=round(observation.contention, 3),
        co_tenant_fraction=observation.co_tenant_fraction,
        oom_errors=observation.oom_errors,
    )


ANSWER_QUANTILE = 0.9
"""The quantile of recent streaming batches' answer shares that observations carry: the share
of a batch's time before its first answer varies with the stream's length, and a high one keeps
the shedding deadlines (``ShedGuard``) on the safe side."""


def _answer_share(shares: Sequence[float]) -> float:
    """``ANSWER_QUANTILE`` of ``shares`` (each in [0, 1]), 1 without any (not a stream)."""
    if not shares:
        return 1.0
    ordered = sorted(shares)
    return ordered[min(len(ordered) - 1, int(ANSWER_QUANTILE * len(ordered)))]


def _smallest_oom(recorder: Recorder, calls: int) -> int | None:
    """The fewest units among the last ``calls`` size-caused OOM calls (None: no call, or no
    size known)."""
    kept = recorder.oom_size_units
    sizes = [u for u in islice(kept, max(0, len(kept) - calls), None) if u is not None]
    return min(sizes) if calls > 0 and sizes else None


def _largest(recorder: Recorder, batches: int) -> int:
    """The most items in one of the last ``batches`` batches (as far as the recorder keeps)."""
    samples = recorder.batches
    if batches <= 0 or not samples:
        return 0
    return max(sample.items for sample in islice(samples, max(0, len(samples) - batches), None))


def _idle_fraction(before: Counts, after: Counts, window_ms: float) -> float:
    released = after.window_batches - before.window_batches
    if released <= 0 or window_ms <= 0:
        return math.nan
    idle_s = after.window_idle_s - before.window_idle_s
    return min(1.0, idle_s / released / (window_ms / 1e3))


def _spread(observation: Observation, cap: int) -> float:
    """The error bars at ``cap`` (high over median), NaN without them or at a 0 ms median (a
    model measured at 0 ms: the tick must not fail on its log line)."""
    median = observation.service_median_ms(cap)
    if observation.service_spread_ms is None or not median > 0:
        return math.nan
    return observation.service_spread_ms(cap) / median


def _round(value: float) -> float | None:
    return None if math.isnan(value) else round(value, 3)

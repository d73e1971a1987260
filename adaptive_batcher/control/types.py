"""What the controller sees and what it says: Observation in, Decision out; Bounds around both."""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from adaptive_batcher._validate import (
    check_increasing_ints,
    check_int,
    check_integral,
    check_number,
    check_real,
    check_str,
)
from adaptive_batcher.control.plan import Plan
from adaptive_batcher.slo import SLO
from adaptive_batcher.telemetry.base import TelemetrySample

__all__ = ["STALL_REACH", "Bounds", "Decision", "Observation"]

STALL_REACH = 2.0
"""How many times its own excess a stall of the model may lift the measured tail over the
target (the queue it held back, then the larger batch that drains it): an overshoot beyond
that is the window's, whatever stalled (see :meth:`Observation.stall_set_latency`)."""


@dataclass(frozen=True, slots=True)
class Decision:
    """The knobs a policy sets, and why.

    Attributes:
        window_ms: batching window, ms (finite, >= 0); any real number, stored as a float.
        max_batch_size: batch cap in size units (>= 1); any integral, stored as an int.
        reason: a short machine-readable tag for the log (``pid``, ``memory_pressure``, ...).
        shed_after_ms: SLO-aware shedding: a request still queued this long after arrival fails
            at once with ``DeadlineExceededError`` instead of being served late (applies to
            requests that arrive after the decision, and to those queued when shedding begins;
            None: no shedding); ms (>= 0). It applies to
            requests that arrive into a queue already holding a full batch (their batch will be
            full).
        shed_after_short_ms: the same for requests that arrive into a shorter queue (their
            batch will be smaller, so it may start later); None: ``shed_after_ms``.
        slo_unreachable: a guard found the SLO out of reach even at the smallest batch.
        max_batch_size_ceiling: the largest cap a guard allows whatever else the load asks
            (memory: ``MemoryGuard``), in size units (>= 1); a guard that wraps it never sets
            a cap above it. None: no such ceiling.

    Raises:
        TypeError: a field of the wrong type; ValueError: one out of range (both name it).
    """

    window_ms: float
    max_batch_size: int
    reason: str = ""
    shed_after_ms: float | None = None
    shed_after_short_ms: float | None = None
    slo_unreachable: bool = False
    max_batch_size_ceiling: int | None = None

    def __post_init__(self) -> None:
        _set(self, "window_ms", check_number("Decision.window_ms", self.window_ms, 0.0))
        _set(self, "max_batch_size", check_int("Decision.max_batch_size", self.max_batch_size, 1))
        check_str("Decision.reason", self.reason)
        if self.max_batch_size_ceiling is not None:
            ceiling = check_int("Decision.max_batch_size_ceiling", self.max_batch_size_ceiling, 1)
            _set(self, "max_batch_size_ceiling", ceiling)
        for name in ("shed_after_ms", "shed_after_short_ms"):
            value = getattr(self, name)
            if value is not None:
                checked = check_real(f"Decision.{name}", value)
                if not checked >= 0:
                    raise ValueError(f"Decision.{name} must be >= 0, got {checked!r}")
                _set(self, name, checked)

    def with_(self, **changes: object) -> Decision:
        """A copy with some fields changed (``reason`` usually among them)."""
        return replace(self, **changes)  # type: ignore[arg-type]


def pad_target(buckets: tuple[int, ...], units: int) -> int:
    """The smallest bucket holding ``units`` (the largest bucket if none does)."""
    return buckets[min(bisect.bisect_left(buckets, units), len(buckets) - 1)]


def padded_size(buckets: tuple[int, ...], units: int) -> int:
    """The size a batch of ``units`` runs at: :func:`pad_target`, or ``units`` without
    buckets."""
    return pad_target(buckets, units) if buckets else units


@dataclass(frozen=True, slots=True)
class Bounds:
    """Where any decision must stay; the controller clamps every decision into them.

    Attributes:
        min_window_ms, max_window_ms: window range, ms; real numbers, stored as floats.
        min_batch_size, max_batch_size: cap range, size units; ``max_batch_size`` is the hard cap.
            Integrals, stored as ints.
        batch_sizes: allowed caps ("buckets"), ints >= 1, strictly increasing; any iterable of
            them, stored as a tuple. Empty means any size in range.

    Raises:
        TypeError: a field of the wrong type (message names it).
        ValueError: an empty or inverted range, or buckets below 1 or not increasing.
    """

    min_window_ms: float = 0.0
    max_window_ms: float = 100.0
    min_batch_size: int = 1
    max_batch_size: int = 256
    batch_sizes: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for name in ("min_window_ms", "max_window_ms"):
            _set(self, name, check_real(f"Bounds.{name}", getattr(self, name)))
        for name in ("min_batch_size", "max_batch_size"):
            _set(self, name, check_integral(f"Bounds.{name}", getattr(self, name)))
        _set(self, "batch_sizes", _buckets(self.batch_sizes))
        if not 0.0 <= self.min_window_ms <= self.max_window_ms:
            raise ValueError(
                f"Bounds need 0 <= min_window_ms <= max_window_ms, got "
                f"{self.min_window_ms!r}..{self.max_window_ms!r}"
            )
        if not 1 <= self.min_batch_size <= self.max_batch_size:
            raise ValueError(
                f"Bounds need 1 <= min_batch_size <= max_batch_size, got "
                f"{self.min_batch_size!r}..{self.max_batch_size!r}"
            )

    def clamp(self, decision: Decision) -> Decision:
        """``decision`` with window and cap moved into range (and onto a bucket, if any)."""
        window = min(max(decision.window_ms, self.min_window_ms), self.max_window_ms)
        cap = min(max(decision.max_batch_size, self.min_batch_size), self.max_batch_size)
        if self.batch_sizes:
            cap = self.bucket_at_most(cap)
        if window == decision.window_ms and cap == decision.max_batch_size:
            return decision
        return decision.with_(window_ms=window, max_batch_size=cap)

    def padded_size(self, units: int) -> int:
        """The size a batch of ``units`` runs at (:func:`padded_size`)."""
        return padded_size(self.batch_sizes, units)

    def bucket_at_most(self, size: int) -> int:
        """The largest allowed size <= ``size`` (the smallest allowed size if none is)."""
        if not self.batch_sizes:
            return size
        fitting = [b for b in self.batch_sizes if b <= size]
        return fitting[-1] if fitting else self.batch_sizes[0]

    def cap_candidates(self) -> list[int]:
        """The caps a policy may choose: the buckets, or powers of two in range plus the maximum."""
        if self.batch_sizes:
            return [b for b in self.batch_sizes if self.min_batch_size <= b <= self.max_batch_size]
        sizes = {self.min_batch_size, self.max_batch_size}
        size = 1
        while size < self.max_batch_size:
            if size >= self.min_batch_size:
                sizes.add(size)
            size *= 2
        return sorted(sizes)


_Service = Callable[[int], float]


def _padded(bounds: Bounds) -> Callable[[_Service], _Service]:
    """Wraps a service-time function of the batch size so that it reads the bucket's."""
    if not bounds.batch_sizes:
        return lambda service: service
    return lambda service: lambda units: service(bounds.padded_size(units))


def _units(value: float) -> float:
    """A batch's units as a fixed point's start: 1 when unknown or below 1."""
    return value if value >= 1.0 else 1.0


def _maybe(wrap: Callable[[_Service], _Service], service: _Service | None) -> _Service | None:
    return None if service is None else wrap(service)


def _set(instance: object, name: str, value: object) -> None:
    """Store a checked field of a frozen dataclass (in ``__post_init__``)."""
    object.__setattr__(instance, name, value)


def _buckets(value: object) -> tuple[int, ...]:
    return check_increasing_ints("Bounds.batch_sizes", value, 1, empty=True)


def _no_model(batch_size: int) -> float:
    del batch_size
    return math.nan


@dataclass(frozen=True, slots=True)
class Observation:
    """Everything a policy may look at, measured over the last control tick unless noted.

    The ``service_*_ms`` estimates are the
    :class:`~adaptive_batcher.control.ServiceTimeEstimator` methods of the same names without
    ``service_`` (the table: docs/policies.md, "The service-time estimates"); all but
    ``service_median_ms`` may be None (unknown), and a plan then uses the next one known.

    Attributes:
        now_s: time of the observation, seconds on the batcher's clock.
        interval_s: length of the tick the rates and counts cover, seconds.
        tick_interval_s: the controller's interval between ticks, s: a tick several times
            longer had no poll for that long (no request came, or the loop stood still).
        current: the decision in force during the tick.
        bounds: the range decisions must stay in.
        slo: the latency objective (None: no SLO set).
        latency_ms: end-to-end latency at the SLO's percentile (p99 without an SLO) over the
            recent control span (~2 s), ms; NaN without samples.
        p50_ms, mean_ms: median and mean latency over the same span, ms.
        latency_samples: requests behind those figures.
        queue_depth, queued_units: requests (and units) queued at the tick.
        arrival_rate_rps, throughput_rps, goodput_rps: arrivals, answers, and answers within the
            SLO per second over the tick.
        rejected, expired, failed, oom_errors: counts over the tick (``oom_errors``: the
            model calls that ran out of memory for their batch's size).
        oom_units: the smallest of those calls, size units (None: none, or sizes unknown).
        batches: batches finished in the tick; mean_batch_size their mean items, fill_ratio the
            mean units over the cap in force; mean_request_units the mean units per request
            (1.0 when every item counts as one).
        window_idle_fraction: of the batches released by their window in the tick, the mean
            share of the window spent waiting after their last arrival (NaN: no such batch).
            Near 1, the window collects no company: it only adds latency.
        largest_batch_size: the most items in one of the tick's batches (0: none).
        service_median_ms: the median service time (model compute) of a batch of n units, ms
            (NaN before enough batches have run).
        service_median_bound_ms: the median, never optimistic beyond the sizes known, ms.
        service_spread_ms: the bounded median times the ``spread_quantile`` (0.95) of all the
            measured / predicted ratios, ms.
        service_p99_ms: the bounded median times the ratios' 99th percentile, stalls and
            spikes included, ms: the batch a p99 request rides.
        service_body_spread_ms: the bounded median times the noise body's 0.95 quantile, ms.
        service_mean_ms: the median times the ratios' mean (each capped at their 99th
            percentile), spikes and stalls included, ms: what throughput rests on (None: the
            median).
        service_body_p999_ms: the bounded median times the noise body's 99.9th percentile, ms.
        service_pauses_ms: where outliers are pauses added whatever the batch, the recent
            batches' time over their prediction, ms, each >= 0 (``()``: not known to be
            pauses; see ``ServiceTimeEstimator.added_pauses_ms``).
        service_samples: batches behind the fit.
        service_samples_at: batches of exactly a size (units) behind the fit (None: unknown).
        contention: the service-time fit's level over the fastest it has been (1: as fast as
            ever; 1.5: batches take 50 % longer than they did).
        last_stall_s: when the latest batch ended that the service-time fit held out as an
            isolated outlier (a stall: far beyond the error bars, its neighbours normal), s
            (-inf: none yet).
        loop_stall_s: when the latest stall of the shell's event loop ended, s (-inf: none
            yet): a timer fired ``LOOP_STALL_S`` or more late (see
            :meth:`~adaptive_batcher.core.batcher_core.BatcherCore.poll`). The batches that ran
            across it measured the stall, not the model, and are kept out of the service-time
            fit.
        loop_stall_rate_hz: how often the loop has stalled lately, stalls/s: ``n - 1`` gaps
            over the span of the ``n >= 2`` stalls that began in the last ``STALL_MEMORY_S``
            (30 s, in the controller), stretched by the time the next one is overdue; 0 with
            fewer (a lone stall is an outlier, not a rate).
        loop_stall_durations_s: how long each of those stalls lasted, s (empty with fewer
            than two).
        outlier_elasticity: how the excess time of outlier batches grows with the batch's
            predicted time (about 1: outliers scale with the batch, and a narrower window
            shortens them; about 0: pauses added whatever the batch; NaN: not known); see
            :attr:`~adaptive_batcher.control.ServiceTimeEstimator.outlier_elasticity`.
        arrival_rate_peak_rps: the highest per-tick arrival rate of the recent past (~2 s),
            req/s: what plans are made for, unless no cap keeps up with it (see :meth:`plan`)
            (NaN: unknown; the tick's own rate is used).
        slots: execution slots in force.
        device_ms_per_request: device time per answered request over the tick, ms (NaN without
            answers): the tick's device cost.
        device_busy_fraction: the batcher's own model calls' share of the tick, per slot.
        telemetry: the latest GPU reading (all unknown without a GPU).
        window_budget_scale: the window's planning budget over :attr:`aim_budget_ms` (>= 1): the
            slack the measured tail has shown in the plan's bound
            (:class:`~adaptive_batcher.control.slack.TailSlack`; 1: none, or not measured).
        window_floor_ms: two batches of one at their median times (the tail at the smallest
            window and cap; :meth:`predicted_window_floor_ms`), ms: the part of the latency no
            setting removes, exempt from the SLO's margin by its share of the room (see
            :attr:`aim_budget_ms`; NaN: not known).
        answer_share: the share of a batch's service time that passes before its callers'
            first answer, a high quantile over recent batches (1: answers come at the end; a
            streaming model's come at its first step, and the slot stays busy to the end).
        recent_stalls: ``(end_s, excess_ms)`` of the latest batches the service-time fit held
            out as stalls (oldest first): when each ended, and by how much it outlasted its
            prediction (empty: none, or not listed).
        loop_lag_ms: the shell's event-loop lag set aside from the SLO's room, ms (see
            :class:`~adaptive_batcher.control.loop_lag.LoopLag`; 0: none, as in the simulator):
            a request meets it before its submission, like preprocessing.
        loop_lag_typical_ms: the loop's median lag, at most ``loop_lag_ms``, ms: what shed
            deadlines set aside (:attr:`shed_room_ms`).
        power: throughput / mean latency (Kleinrock's power), req/s per s; NaN when unknown.
    """

    now_s: float
    interval_s: float
    current: Decision
    bounds: Bounds
    slo: SLO | None = None
    latency_ms: float = math.nan
    p50_ms: float = math.nan
    mean_ms: float = math.nan
    latency_samples: int = 0
    queue_depth: int = 0
    queued_units: int = 0
    arrival_rate_rps: float = 0.0
    throughput_rps: float = 0.0
    goodput_rps: float = 0.0
    rejected: int = 0
    expired: int = 0
    failed: int = 0
    oom_errors: int = 0
    oom_units: int | None = None
    batches: int = 0
    mean_batch_size: float = math.nan
    fill_ratio: float = math.nan
    mean_request_units: float = 1.0
    window_idle_fraction: float = math.nan
    largest_batch_size: int = 0
    service_median_ms: Callable[[int], float] = field(default=_no_model, repr=False)
    service_samples: int = 0
    service_samples_at: Callable[[int], int] | None = field(default=None, repr=False)
    service_spread_ms: Callable[[int], float] | None = field(default=None, repr=False)
    service_median_bound_ms: Callable[[int], float] | None = field(default=None, repr=False)
    service_body_spread_ms: Callable[[int], float] | None = field(default=None, repr=False)
    service_body_p999_ms: Callable[[int], float] | None = field(default=None, repr=False)
    service_p99_ms: Callable[[int], float] | None = field(default=None, repr=False)
    service_mean_ms: Callable[[int], float] | None = field(default=None, repr=False)
    service_pauses_ms: Sequence[float] = field(default=(), repr=False)
    contention: float = 1.0
    last_stall_s: float = -math.inf
    loop_stall_s: float = -math.inf
    tick_interval_s: float = 0.25
    loop_stall_rate_hz: float = 0.0
    loop_stall_durations_s: tuple[float, ...] = ()
    outlier_elasticity: float = math.nan
    arrival_rate_peak_rps: float = math.nan
    slots: int = 1
    device_ms_per_request: float = math.nan
    device_busy_fraction: float = math.nan
    telemetry: TelemetrySample = field(default_factory=TelemetrySample)
    window_budget_scale: float = 1.0
    window_floor_ms: float = math.nan
    answer_share: float = 1.0
    loop_lag_ms: float = 0.0
    loop_lag_typical_ms: float = 0.0
    recent_stalls: tuple[tuple[float, float], ...] = ()
    _plan: Plan | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def co_tenant_fraction(self) -> float | None:
        """How much of the GPU's busy time is not this batcher's: NVML utilization (the share
        of time any kernel ran, from any process) minus the batcher's own busy share, at
        least 0; None without NVML. A co-tenant slows our batches; the service-time model sees
        that in the measured times (its error bars widen, its contention factor rises), so
        this is a signal for logs and metrics, and never read as "no headroom"."""
        util = self.telemetry.gpu_util_pct
        if util is None or math.isnan(self.device_busy_fraction):
            return None
        return max(0.0, util / 100.0 - min(1.0, self.device_busy_fraction))

    @property
    def planning_rate_rps(self) -> float:
        """The arrival rate plans are made for: the recent peak, at least the tick's rate."""
        peak = self.arrival_rate_peak_rps
        return self.arrival_rate_rps if math.isnan(peak) else max(peak, self.arrival_rate_rps)

    def plan(self) -> Plan:
        """Predictions for this tick (see :class:`~adaptive_batcher.control.plan.Plan`); made
        once per observation, so the policy and the guards share what it computes.

        The plan is made for :attr:`planning_rate_rps`, the recent peak, unless no cap keeps
        up with the peak while the tick's own rate is lower: the peak was an overload that has
        passed (why: docs/policies.md, "The plan"). An overload that goes on shows in the
        tick's own rate and backlog."""
        if self._plan is None:
            plan = self._make_plan(self.planning_rate_rps)
            if self.arrival_rate_rps < self.planning_rate_rps and plan.overloaded(self.budget_ms):
                plan = self._make_plan(self.arrival_rate_rps)
            _set(self, "_plan", plan)
        assert self._plan is not None
        return self._plan

    def with_plan_kept(
        self, *, window_budget_scale: float | None = None, window_floor_ms: float | None = None
    ) -> Observation:
        """A copy with a new :attr:`window_budget_scale` or :attr:`window_floor_ms` (None: kept),
        sharing this tick's plan, which neither changes."""
        copy = replace(
            self,
            window_budget_scale=(
                self.window_budget_scale if window_budget_scale is None else window_budget_scale
            ),
            window_floor_ms=self.window_floor_ms if window_floor_ms is None else window_floor_ms,
        )
        _set(copy, "_plan", self._plan)
        return copy

    def predicted_window_floor_ms(self) -> float:
        """The tail latency inside the batcher at the smallest window and the smallest cap,
        every batch at its median time
        (:meth:`~adaptive_batcher.control.plan.Plan.typical_latency_ms`), at the fastest the
        device has been (over :attr:`contention`), ms: with a smallest cap of 1, a batch of one
        waited out and then one's own, the latency no setting and no load removes. A slowdown
        does not raise it: slower batches are no reason to spend the margin. NaN without an
        SLO or before the service-time model is ready."""
        plan = self.plan()
        if self.slo is None or not plan.ready:
            return math.nan
        floor = plan.typical_latency_ms(plan.min_window_ms, plan.caps[0])
        return floor / max(1.0, self.contention)

    def _make_plan(self, rate_rps: float) -> Plan:
        bounds = self.bounds
        pad = _padded(bounds)  # a batch's service time is its bucket's: padding runs too
        return Plan(
            rate_units_per_s=rate_rps * self.mean_request_units,
            backlog_units=self.queued_units,
            caps=tuple(bounds.cap_candidates()),
            service_median_ms=pad(self.service_median_ms),
            service_body_spread_ms=pad(
                self.service_body_spread_ms or self.service_spread_ms or self.service_median_ms
            ),
            service_median_bound_ms=_maybe(pad, self.service_median_bound_ms),
            service_body_p999_ms=_maybe(pad, self.service_body_p999_ms),
            service_p99_ms=_maybe(pad, self.service_p99_ms),
            service_mean_ms=_maybe(pad, self.service_mean_ms),
            pauses_ms=self.service_pauses_ms,
            room_ms=self.room_ms if self.slo is not None else math.inf,
            typical_room_ms=self.shed_room_ms if self.slo is not None else math.inf,
            slots=self.slots,
            min_window_ms=bounds.min_window_ms,
            max_window_ms=bounds.max_window_ms,
            padded=bool(bounds.batch_sizes),
            start_units=_units(self.mean_batch_size * self.mean_request_units),
        )

    @property
    def power(self) -> float:
        """Throughput over mean latency (Kleinrock 1979), NaN when either is unknown or 0."""
        if not self.mean_ms > 0 or not self.throughput_rps > 0:
            return math.nan
        return self.throughput_rps / (self.mean_ms / 1e3)

    @property
    def target_ms(self) -> float:
        """The latency the controller aims the measured tail at, ms: :attr:`aim_budget_ms`
        (NaN without an SLO). The batcher measures from a request's submission, so the time
        spent before it (``SLO.preprocess_ms``, :attr:`loop_lag_ms`) is already out of its
        budget."""
        return self.aim_budget_ms

    @property
    def room_ms(self) -> float:
        """The SLO's latency less preprocessing and :attr:`loop_lag_ms`, ms: what the batcher's
        worst case (a burst's full batch behind a full batch, a shed request's start) must
        fit; the budget adds the target's margin for the p99 plan (NaN without an SLO)."""
        return self.slo.room_ms - self.loop_lag_ms if self.slo is not None else math.nan

    @property
    def shed_room_ms(self) -> float:
        """The SLO's latency less preprocessing and :attr:`loop_lag_typical_ms`, ms: what a
        shed deadline leaves a request (it must fail only those that cannot make it, and
        most requests meet the loop's usual lag, not its p99; NaN without an SLO)."""
        return self.slo.room_ms - self.loop_lag_typical_ms if self.slo is not None else math.nan

    @property
    def budget_ms(self) -> float:
        """Queueing + compute time allowed inside the batcher by the SLO's target, ms: the
        SLO's ``batcher_budget_ms`` less :attr:`loop_lag_ms` (NaN without an SLO). Caps are
        planned to it."""
        if self.slo is None:
            return math.nan
        return self.slo.batcher_budget_ms - self.loop_lag_ms

    @property
    def aim_budget_ms(self) -> float:
        """The budget the window and the measured tail are aimed at, ms (NaN without an SLO):
        :attr:`budget_ms` plus the part of the margin's reserve that the floor exempts,
        ``(1 - margin) * room * share**2`` with ``share = min(floor, room) / room``,
        ``floor`` = :attr:`window_floor_ms` and ``room`` = :attr:`room_ms`: the reserve is
        ``(1 - margin) * (room - floor * share)``, so a floor that fills the room is exempt
        and a small one keeps its margin (docs/policies.md, "The margin"). :attr:`budget_ms`
        without a floor."""
        slo = self.slo
        if slo is None:
            return math.nan
        floor, room = self.window_floor_ms, self.room_ms
        if not floor >= 0.0:  # NaN: no floor known
            return self.budget_ms
        share = min(floor, room) / room
        return self.budget_ms + (1.0 - slo.margin) * room * share * share

    @property
    def window_budget_ms(self) -> float:
        """The budget the window is planned to: :attr:`aim_budget_ms` times
        :attr:`window_budget_scale`, at most :attr:`room_ms` (no window is planned to a tail
        past the SLO itself; NaN without an SLO)."""
        return min(self.aim_budget_ms * self.window_budget_scale, self.room_ms)

    def stall_set_latency(self, settle_s: float) -> bool:
        """True when the event loop stalled within ``settle_s`` seconds, or when an outlier
        batch ended within it, outliers do not scale with the batch (``outlier_elasticity``
        below 0.5, or unknown), and the stall was long enough to explain the overshoot (its
        excess at least 1 / ``STALL_REACH`` of ``latency_ms - target_ms``; see
        :attr:`recent_stalls`): the latency measured now is then the queue behind the stall,
        no sign of the window (docs/policies.md, "PID")."""
        if self.now_s - self.loop_stall_s < settle_s:
            return True  # the loop stood still: its latency is no sign of the window's
        recent = self.now_s - self.last_stall_s < settle_s
        if not recent or self.outlier_elasticity >= 0.5:
            return False
        return STALL_REACH * self._stall_excess_ms(settle_s) >= self.latency_ms - self.target_ms

    def _stall_excess_ms(self, settle_s: float) -> float:
        """The largest excess of the stalls listed that ended within ``settle_s``, ms (inf
        when none is listed: the excess is not known)."""
        since = self.now_s - settle_s
        excesses = [excess for end, excess in self.recent_stalls if end > since]
        return max(excesses) if excesses else math.inf

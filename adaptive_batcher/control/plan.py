"""What a (window, cap) will do, predicted from the arrival rate and the service-time model.

A :class:`Plan` predicts, for a candidate window and cap, the batch that will really form
(:meth:`Plan.batch_units`), the tail latency it gives (:meth:`Plan.latency_ms`) and its device
cost (:meth:`Plan.cost_ms_per_unit`), and from them the widest window a latency budget allows
(:meth:`Plan.widest_window_ms`) and the caps that fit it, keep up or serve the most
(:meth:`Plan.tail_cap`, :meth:`Plan.stable_cap`, :meth:`Plan.throughput_cap`). Rates are in
size units per second (requests times their mean size), times in ms. The model behind each
method, its figures and sources: docs/policies.md, "The plan".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from statistics import NormalDist
from typing import TypeVar

import numpy as np

from adaptive_batcher.control.tail import (
    exceed_probability,
    in_flight_points_ms,
    latency_quantile_ms,
    lognormal_sigma,
)

__all__ = [
    "BISTABLE_RATIO",
    "CHEAPER_BY",
    "PAUSE_GRID",
    "PAUSE_TIE",
    "POISSON_Z",
    "RIDE_BUSY_MAX",
    "SPREAD_Z",
    "STABILITY_HEADROOM",
    "TAIL_QUANTILE",
    "THROUGHPUT_TIE",
    "Plan",
]

STABILITY_HEADROOM = 1.15
"""Serve 15 % more than arrives when possible, so queues drain after bursts."""

POISSON_Z = 2.33
"""Standard deviations of Poisson noise added to a batch for its 99th percentile."""

TAIL_QUANTILE = 0.99
"""The quantile of a request's latency that :meth:`Plan.latency_ms` predicts."""

SPREAD_Z = NormalDist().inv_cdf(0.95)
"""The normal score of the error bars' quantile (the service-time estimator's
``spread_quantile``, 0.95): with the median it gives the noise body's sigma."""

CHEAPER_BY = 1.1
"""A smaller cap is chosen for its cost only when it is at least 10 % cheaper per unit: the
arrivals are not quite Poisson, and a smaller cap gives up headroom for bursts."""

THROUGHPUT_TIE = 0.05
"""Throughputs within 5 % of the best are a tie the fit cannot resolve; the throughput cap takes
the largest cap among them, whose full batches drain a backlog fastest where the time per item
falls with the batch (docs/policies.md, "The plan")."""

BISTABLE_RATIO = 1.25
"""With buckets, a cycle whose batches are this many times those it settles at from small ones
is one that padding sustains (see :meth:`Plan.floor_cap`)."""

RIDE_BUSY_MAX = 0.75
"""Where even the smallest window leaves the batch a p99 request rides no room, the window
still narrows to fit that batch as best it can while the device, at its mean batch time, is
busy at most this share of the time; busier, the constraint gives way (the extra batches, each
risking a stall or a spike, would queue behind each other). Where the outliers are pauses that
overrun the room by themselves, they are priced instead (:meth:`Plan.pause_late_share`).
Figures: docs/benchmarks.md, "The batch a p99 request rides, priced as a pause"."""

PAUSE_GRID = 16
"""Where pauses leave the batch a p99 request rides no room at any window, the windows the plan
prices their late answers at: this many steps from the smallest window to the widest whose
tail fits the budget (see :meth:`Plan.pause_late_share`)."""

PAUSE_TIE = 1e-3
"""Late shares within this of the least are a tie; the widest window among them, the cheapest,
is taken."""

_FIXED_POINT_STEPS = 6
_BISECTION_STEPS = 14


@dataclass(frozen=True)
class Plan:
    """Predictions for one tick.

    Attributes:
        rate_units_per_s: the planning arrival rate (the recent peak), size units per second.
        backlog_units: units queued at the tick.
        caps: the caps allowed (bounds' candidates), increasing.
        service_median_ms: the median service time of a batch of n units, ms (NaN: no
            estimate yet).
        service_body_spread_ms: the service time with the error bars of the noise's body,
            never optimistic beyond the sizes known, ms (window plans).
        service_median_bound_ms: the median, never optimistic beyond the sizes known, ms
            (latency promises; default: ``service_median_ms``).
        service_body_p999_ms: the body's 99.9th percentile, a rare batch's time, ms (None: no
            such constraint).
        service_p99_ms: the 99th percentile of all batches, stalls and spikes included: the
            batch a p99 request rides, ms (None: no such constraint).
        service_mean_ms: the mean, spikes and stalls included: what the throughput of full
            batches rests on, ms (None: ``service_median_ms``).
        pauses_ms: where outliers are pauses added whatever the batch, the recent batches'
            time over their prediction, ms, each >= 0 (``()``: not known to be pauses); see
            :meth:`pause_late_share`.
        room_ms: what a window's tail latency with ``service_body_p999_ms`` or ``service_p99_ms``
            must fit: the SLO's latency less preprocessing, ms (windows only; :meth:`cap` takes
            its room as an argument).
        typical_room_ms: the room most requests have (the loop's usual lag set aside, not its
            p99), ms: what a pause must overrun to make a request late
            (:meth:`pause_late_share`; None: ``room_ms``).
        slots: execution slots.
        min_window_ms, max_window_ms: the window range allowed, ms.
        padded: batches run padded to a bucket (the service functions read the bucket's time):
            a wider window is then not always cheaper (see :meth:`cheapest_cap`).
        start_units: where the realised batch's fixed point starts, units (padded plans only:
            a batch's time flat across a bucket can sustain a large batch as well as a small
            one, and the batcher stays in the one it is in; default 1).

    The service estimates are named as the estimator's (see
    :mod:`adaptive_batcher.control.service_estimator`). A plan is made for one tick: the
    service functions must not change while it is in use, as it remembers the caps, tail
    service times, batches, noise and widest windows it has computed (a policy and the guards
    ask for the same ones, and a window search evaluates the same batch sizes many times).
    """

    rate_units_per_s: float
    backlog_units: int
    caps: Sequence[int]
    service_median_ms: Callable[[int], float]
    service_body_spread_ms: Callable[[int], float]
    slots: int = 1
    min_window_ms: float = 0.0
    max_window_ms: float = 100.0
    service_median_bound_ms: Callable[[int], float] | None = None
    service_body_p999_ms: Callable[[int], float] | None = None
    service_p99_ms: Callable[[int], float] | None = None
    service_mean_ms: Callable[[int], float] | None = None
    pauses_ms: Sequence[float] = ()
    room_ms: float = math.inf
    typical_room_ms: float | None = None
    padded: bool = False
    start_units: float = 1.0
    _body_spread_ms: dict[int, float] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    _body_p999_ms: dict[int, float] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    _p99_ms: dict[int, float] = field(default_factory=dict, init=False, repr=False, compare=False)
    _stable: dict[tuple[float, float], int | None] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    _fits: dict[float, list[int]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    _widest_ms: dict[tuple[float, int], float] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    _batch_units: dict[int, dict[float, float]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    _noise: dict[int, tuple[float, float]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    _in_flight_points_ms: dict[int, np.ndarray] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    _pauses_at: dict[int, tuple[np.ndarray, float]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    @property
    def ready(self) -> bool:
        """True once the service-time estimator predicts (before that, nothing here is known)."""
        return bool(self.caps) and not math.isnan(self.service_median_ms(self.caps[0]))

    # -- caps --------------------------------------------------------------------------------

    def throughput_units_per_s(self, cap: int) -> float:
        """Units per second that full batches of ``cap`` give on all slots, at their mean
        time."""
        service = (self.service_mean_ms or self.service_median_ms)(cap)
        return math.inf if service <= 0 else self.slots * cap / (service / 1e3)

    def demand_units_per_s(self, budget_ms: float) -> float:
        """Arrivals plus the backlog drained within one budget, units per second. The backlog
        is what is queued beyond one batch at the largest cap (a window's batch in the making
        is not a backlog)."""
        budget_s = budget_ms / 1e3
        backlog = max(0, self.backlog_units - self.caps[-1]) if self.caps else 0
        drain = backlog / budget_s if budget_s > 0 else 0.0
        return self.rate_units_per_s + drain

    def stable_cap(self, budget_ms: float, headroom: float = STABILITY_HEADROOM) -> int | None:
        """The smallest cap that keeps up with the demand with ``headroom`` (else without it);
        None when none keeps up (overload) or the model is not ready."""
        key = (budget_ms, headroom)
        if key not in self._stable:
            self._stable[key] = self._search_stable_cap(budget_ms, headroom)
        return self._stable[key]

    def _search_stable_cap(self, budget_ms: float, headroom: float) -> int | None:
        if not self.ready:
            return None
        demand = self.demand_units_per_s(budget_ms)
        for factor in (headroom, 1.0):  # demand times the headroom, then the demand itself
            for cap in self.caps:
                if self.throughput_units_per_s(cap) >= demand * factor:
                    return cap
        return None

    def tail_cap(self, budget_ms: float) -> int | None:
        """The largest cap whose two-batch latency (median fit) fits ``budget_ms``; None if none
        fits or the model is not ready."""
        if not self.ready:
            return None
        fitting = self._fitting(budget_ms)
        return fitting[-1] if fitting else None

    def throughput_cap(self, budget_ms: float = math.inf) -> int | None:
        """The cap with the highest throughput among those whose two-batch latency fits
        ``budget_ms`` (among all if none fits), the largest within ``THROUGHPUT_TIE`` of it;
        None if the model is not ready."""
        if not self.ready:
            return None
        candidates = self._fitting(budget_ms) or self.caps
        best = max(candidates, key=self.throughput_units_per_s)
        tied = self.throughput_units_per_s(best) * (1.0 - THROUGHPUT_TIE)
        return max(
            cap for cap in candidates if cap == best or self.throughput_units_per_s(cap) >= tied
        )

    def _fitting(self, budget_ms: float) -> list[int]:
        """The caps whose two-batch latency fits ``budget_ms`` (never optimistic beyond the
        sizes the model knows); none when even two batches of the smallest cap, with the
        noise's error bars, do not fit: the constraint is out of reach, and gives way (see
        docs/policies.md, "The plan")."""
        fitting = self._fits.get(budget_ms)
        if fitting is None:
            bound = self.service_median_bound_ms or self.service_median_ms
            if 2.0 * self._service_body_spread(self.caps[0]) > budget_ms:
                fitting = []
            else:
                fitting = [cap for cap in self.caps if 2.0 * bound(cap) <= budget_ms]
            self._fits[budget_ms] = fitting
        return fitting

    def overloaded(self, budget_ms: float) -> bool:
        """True when no cap keeps up with the demand (the model being ready)."""
        return self.ready and self.stable_cap(budget_ms) is None

    def cap(self, budget_ms: float, room_ms: float | None = None) -> int | None:
        """The cap to run at: the tail cap (the most headroom for bursts: two batches within
        ``room_ms``, the SLO's latency less preprocessing; default ``budget_ms``), never below
        the stability cap for ``budget_ms``; under overload, or when even a batch of the
        smallest cap cannot meet the room, the highest-throughput cap (natural batching then
        sizes the batches: a cap that barely keeps up would only queue). None while the model
        is not ready."""
        if not self.ready:
            return None
        stable = self.stable_cap(budget_ms)
        if stable is None:
            return self.throughput_cap()
        tail = self.tail_cap(budget_ms if room_ms is None else room_ms)
        if tail is None:
            return max(stable, self.throughput_cap() or stable)
        return max(tail, stable)

    def cheapest_cap(self, budget_ms: float, low: int, high: int) -> int:
        """Among the caps from ``low`` to ``high``, the one whose batches cost the least device
        time per unit at the widest window ``budget_ms`` allows (:meth:`padded_cost_ms_per_unit`),
        ``high`` unless another is cheaper by ``CHEAPER_BY``. With buckets, a window-sized batch
        between two buckets runs padded to the larger one, and a smaller cap that batches fill
        may cost less (docs/policies.md, "The plan"). ``high`` while the model is not ready."""
        if not self.ready:
            return high
        best, best_cost = high, self.padded_cost_ms_per_unit(budget_ms, high)
        for cap in reversed([c for c in self.caps if low <= c < high]):
            cost = self.padded_cost_ms_per_unit(budget_ms, cap)
            if cost * CHEAPER_BY < best_cost:
                best, best_cost = cap, cost
        return best

    def floor_cap(self, budget_ms: float) -> int | None:
        """The least cap a decision may take: the stability cap; with padding, a smaller one
        that still keeps up (without headroom) when the stability cap's own batches cannot meet
        ``budget_ms`` (:meth:`fitting_cap`). None under overload or before the model is ready."""
        stable = self.stable_cap(budget_ms)
        if stable is None or not self.padded or not self._sustains_large_cycle(stable, budget_ms):
            return stable
        keeps_up = self.stable_cap(budget_ms, headroom=1.0) or stable
        return self.fitting_cap(budget_ms, keeps_up, stable)

    def _sustains_large_cycle(self, cap: int, budget_ms: float) -> bool:
        """True when padding can hold ``cap`` in a large cycle that misses ``budget_ms``: from
        full batches the cycle settles ``BISTABLE_RATIO`` times larger than from small ones, and
        misses. A cycle that is the same from both is the load's, and a cap without headroom
        would only queue (every size a bucket, SLO 10 ms at 95 % load: attainment 0.89 against
        0.997)."""
        window = self.min_window_ms
        full = replace(self, start_units=float(cap))
        if full.fits_budget(window, cap, budget_ms):
            return False
        small = replace(self, start_units=1.0).batch_units(window, cap)
        return full.batch_units(window, cap) > BISTABLE_RATIO * small

    def fitting_cap(self, budget_ms: float, low: int, high: int) -> int:
        """The largest cap from ``low`` to ``high`` whose tail latency at the smallest window
        fits ``budget_ms`` (``low`` if none does): with padding, a smaller bucket can break a
        large batch's self-sustaining cycle (see ``start_units``)."""
        for cap in reversed([c for c in self.caps if low <= c <= high]):
            if self.fits_budget(self.min_window_ms, cap, budget_ms):
                return cap
        return low

    def padded_cost_ms_per_unit(self, budget_ms: float, cap: int) -> float:
        """Expected device time per unit at ``cap`` and the widest window ``budget_ms`` allows,
        ms, the window's arrivals Poisson (one request, then Poisson for the rest of the
        mean): ``E[s(min(N, cap))] / E[min(N, cap)]``, ``s`` the service of the padded size."""
        window = self.widest_window_ms(budget_ms, cap)
        mean = self.batch_units(window, self.caps[-1])  # before the cap cuts it
        spent = served = 0.0
        for units, weight in _poisson_batches(mean - 1.0):
            n = min(units, cap)
            spent += weight * self._service(n)
            served += weight * n
        return spent / served if served > 0 else math.inf

    # -- windows -----------------------------------------------------------------------------

    def batch_units(self, window_ms: float, cap: int) -> float:
        """The batch that forms with this window and cap, units (see the module docstring).

        The iteration stops early once a step leaves ``n`` unchanged: every further step would
        compute the same value again.
        """
        return self._batch_function(cap)(window_ms)

    def latency_ms(self, window_ms: float, cap: int) -> float:
        """Predicted tail latency (about the 99th percentile) inside the batcher, ms."""
        return self._latency_function(cap)(window_ms)

    def fits_budget(self, window_ms: float, cap: int, budget_ms: float) -> bool:
        """True when :meth:`latency_ms` is within ``budget_ms``, decided without computing it:
        at most ``1 - TAIL_QUANTILE`` of the requests are later than ``budget_ms``."""
        return self._budget_fits_function(cap, budget_ms)(window_ms)

    def typical_latency_ms(self, window_ms: float, cap: int) -> float:
        """:meth:`latency_ms` with every batch at its median time: the tail that the queue
        and the batch sizes give, without the service time's noise, ms."""
        return self._latency_function(cap, self._service)(window_ms)

    def _batch_function(self, cap: int) -> Callable[[float], float]:
        """:meth:`batch_units` at ``cap``, as a function of the window (the plan's figures bound
        once, for a search that evaluates it many times; each window's batch computed once per
        plan)."""
        rate_per_ms, slots, service = (
            self.rate_units_per_s / 1e3,
            self.slots,
            self.service_median_ms,
        )
        top = float(cap)
        start = self.start_units if self.padded else 1.0
        known = self._batch_units.setdefault(cap, {})

        def batch_units(window_ms: float) -> float:
            n = known.get(window_ms)
            if n is None:
                n = known[window_ms] = _realised_units(
                    window_ms, rate_per_ms, service, slots, top, start
                )
            return n

        return batch_units

    def _latency_function(
        self,
        cap: int,
        service: Callable[[float], float] | None = None,
        own: Callable[[float], float] | None = None,
    ) -> Callable[[float], float]:
        """:meth:`latency_ms` at ``cap``, as a function of the window (with the tail service
        times ``service`` for the batch waited out, default the error bars', and ``own`` for
        the request's own batch, default ``service``)."""
        batch_units, high, slots, top = (
            self._batch_function(cap),
            service or self._service_body_spread,
            self.slots,
            float(cap),
        )
        last = own or high
        if service is None and own is None:
            return self._tail_latency_function(batch_units, top)

        def latency_ms(window_ms: float) -> float:
            n = batch_units(window_ms)
            n_high = _poisson_high(n, top)
            return max(window_ms, high(n) / slots) + last(n_high)

        return latency_ms

    def _budget_fits_function(self, cap: int, budget_ms: float) -> Callable[[float], bool]:
        """Whether a window's p99 latency (:meth:`latency_ms`) fits ``budget_ms`` at ``cap``:
        the share of requests later than it, one evaluation, against ``1 - TAIL_QUANTILE``."""
        late = self._late_share_function(cap, budget_ms)
        return lambda window_ms: late(window_ms) <= 1.0 - TAIL_QUANTILE

    def _late_share_function(self, cap: int, latency_ms: float) -> Callable[[float], float]:
        """The share of requests later than ``latency_ms`` at ``cap``, as a function of the
        window: the batch in flight of the window's realised size, its own of that size's
        Poisson high, each lognormal with the noise body's error bars."""
        noise, batch_units, top = self._noise_function(), self._batch_function(cap), float(cap)
        slots, points_ms = self.slots, self._in_flight_points_function()

        def late(window_ms: float) -> float:
            n = batch_units(window_ms)
            n_high = _poisson_high(n, top)
            return exceed_probability(
                window_ms, noise(n), noise(n_high), latency_ms, slots, points_ms(n)
            )

        return late

    def _noise_function(self) -> Callable[[float], tuple[float, float]]:
        """``(median, sigma)`` of a batch's lognormal time at a size, units: the median never
        optimistic beyond the sizes known, sigma from the noise body's error bars (computed
        once per batch size, the size rounded, at least 1)."""
        bound, known = self.service_median_bound_ms or self.service_median_ms, self._noise

        def at_size(size: int) -> tuple[float, float]:
            median = bound(size)
            return median, lognormal_sigma(self._service_body_spread(size), median, SPREAD_Z)

        return lambda units: _memoised(known, at_size, units)

    def _in_flight_points_function(self) -> Callable[[float], np.ndarray]:
        """:func:`~adaptive_batcher.control.tail.in_flight_points_ms` of a batch in flight of a
        size (units) on the plan's slots, computed once per batch size (rounded, at least 1)."""
        noise, known, slots = self._noise_function(), self._in_flight_points_ms, self.slots

        def at_size(size: int) -> np.ndarray:
            return in_flight_points_ms(noise(size), slots)

        return lambda units: _memoised(known, at_size, units)

    def _tail_latency_function(
        self, batch_units: Callable[[float], float], top: float
    ) -> Callable[[float], float]:
        """The p99 of a request's latency
        (:func:`~adaptive_batcher.control.tail.latency_quantile_ms`): the batch in flight of
        the window's realised size, its own of that size's Poisson high, each lognormal with
        the noise body's error bars."""
        noise = self._noise_function()

        def latency_ms(window_ms: float) -> float:
            n = batch_units(window_ms)
            n_high = _poisson_high(n, top)
            return latency_quantile_ms(
                window_ms, noise(n), noise(n_high), TAIL_QUANTILE, self.slots
            )

        return latency_ms

    def busy_share(self, window_ms: float, cap: int) -> float:
        """The share of the slots' time kept busy at the planning rate by the batches that
        form at this window and cap when each takes its mean time (stalls and spikes included:
        the queue a stall holds back makes the next batch larger)."""
        mean, rate_per_ms, slots = (
            self.service_mean_ms or self.service_median_ms,
            self.rate_units_per_s / 1e3,
            self.slots,
        )
        n = _realised_units(window_ms, rate_per_ms, mean, slots, float(cap), 1.0)
        return rate_per_ms * mean(max(1, round(n))) / n / slots

    def cost_ms_per_unit(self, window_ms: float, cap: int) -> float:
        """Predicted device time per unit served, ms."""
        n = self.batch_units(window_ms, cap)
        return self._service(n) / n

    def widest_window_ms(self, budget_ms: float, cap: int) -> float:
        """The widest window in range whose predicted tail latency fits ``budget_ms`` (the
        smallest window of the range if none does), ms."""
        key = (budget_ms, cap)
        widest = self._widest_ms.get(key)
        if widest is None:
            widest = self._widest_ms[key] = self._search_widest_ms(budget_ms, cap)
        return widest

    def _search_widest_ms(self, budget_ms: float, cap: int) -> float:
        low, high = self.min_window_ms, self.max_window_ms
        if not self.ready:
            return low
        fits = self._fits_function(budget_ms, cap)
        if not fits(low):
            return low
        if not fits(high):
            for _ in range(_BISECTION_STEPS):
                middle = (low + high) / 2.0
                if fits(middle):
                    low = middle
                else:
                    high = middle
            high = low
        if self.prices_pauses(cap):
            return self._most_answered_ms(self.min_window_ms, high, cap)
        return high

    def _fits_function(self, budget_ms: float, cap: int) -> Callable[[float], bool]:
        """Whether a window's tail latency fits ``budget_ms`` and, with the rare batches'
        times, the room (see the module docstring); the room first, the cheaper check."""
        fits_budget, room_ms = self._budget_fits_function(cap, budget_ms), self.room_ms
        # the rare batches' constraint out of reach at any window is dropped: the smallest
        # window would only cost more (natural batches at an SLO of 20 ms on resnet50: 1.44x
        # the cost oracle's device time, and more late answers than the p99 plan's window)
        low = self.min_window_ms
        rare, riding = self._room_latency_functions(cap)
        in_reach = [latency for latency in rare if latency(low) <= room_ms]
        if riding and self._keeps_riding(riding[0], cap):
            in_reach += riding
        return lambda window_ms: (
            all(latency(window_ms) <= room_ms for latency in in_reach) and fits_budget(window_ms)
        )

    def _keeps_riding(self, riding: Callable[[float], float], cap: int) -> bool:
        """Whether the batch a p99 request rides must fit the room: where it does at the
        smallest window; out of reach, unless pauses are priced instead
        (:meth:`prices_pauses`), where the device has time for the extra batches of a narrow
        window (each risks a stall, but none waits for them)."""
        low = self.min_window_ms
        if riding(low) <= self.room_ms:
            return True
        if self.prices_pauses(cap):
            return False
        return self.busy_share(low, cap) <= RIDE_BUSY_MAX

    def prices_pauses(self, cap: int) -> bool:
        """Whether pauses leave the batch a p99 request rides no room at any window, even at
        the loop's usual lag: the window is then the one that answers the most
        (:meth:`pause_late_share`), and a narrower one would only meet more pauses. A pause
        that overruns the room only with the loop's p99 lag still narrows the window."""
        if not self.pauses_ms:
            return False
        _, riding = self._room_latency_functions(cap)
        return bool(riding) and not riding[0](self.min_window_ms) <= self._typical_room_ms

    @property
    def _typical_room_ms(self) -> float:
        return self.room_ms if self.typical_room_ms is None else self.typical_room_ms

    def _most_answered_ms(self, low: float, high: float, cap: int) -> float:
        """Of ``PAUSE_GRID`` windows from ``low`` to ``high``, the widest whose
        :meth:`pause_late_share` is within ``PAUSE_TIE`` of the least, ms."""
        windows = np.linspace(low, high, PAUSE_GRID + 1) if high > low else np.array([low])
        shares = np.array([self.pause_late_share(float(w), cap) for w in windows])
        return float(windows[shares <= shares.min() + PAUSE_TIE].max())

    def pause_late_share(self, window_ms: float, cap: int) -> float:
        """The share of the requests that the pauses (:attr:`pauses_ms`, one per recent
        batch) make late at this window and cap, at the batches it forms at their mean time.

        A request rides a paused batch with that batch's chance of a pause; having waited a
        uniform share of the batch's cycle (the window, or the batch in flight), it is late
        when the wait, its batch's median time and the pause overrun the room. Each pause
        also makes late the arrivals of its last ``pause - (room - s)`` ms (``s``: the batch
        its backlog forms, median time), and a window that forms fewer batches meets fewer
        pauses: at ``r`` units/ms in batches of ``n``, ``r / n`` batches a ms. Why and the
        figures: docs/policies.md, "The plan"."""
        if not self.pauses_ms:
            return 0.0
        pauses, behind_ms = self._pause_terms(cap)
        rate_per_ms, slots = self.rate_units_per_s / 1e3, self.slots
        mean = self.service_mean_ms or self.service_median_ms
        n = _realised_units(window_ms, rate_per_ms, mean, slots, float(cap), 1.0)
        own = self._service(n)
        cycle = max(window_ms, own / slots)
        over = own + pauses - self._typical_room_ms
        ride = np.clip((over + cycle) / cycle, 0.0, 1.0) if cycle > 0 else 1.0 * (over > 0)
        return float(ride.sum() / len(self.pauses_ms) + rate_per_ms / n * behind_ms)

    def _pause_terms(self, cap: int) -> tuple[np.ndarray, float]:
        """The pauses above 0, ms, and the mean over all batches of the time in which a
        pause makes an arrival late, ms (see :meth:`pause_late_share`), once per cap."""
        terms = self._pauses_at.get(cap)
        if terms is None:
            every = np.asarray(self.pauses_ms, dtype=float)
            pauses = every[every > 0.0]
            rate_per_ms, behind = self.rate_units_per_s / 1e3, 0.0
            room_ms = self._typical_room_ms
            for pause in pauses[pauses > room_ms - self._service(float(cap))]:
                after = self._service(min(float(cap), 1.0 + rate_per_ms * float(pause)))
                behind += max(0.0, float(pause) - (room_ms - after))
            terms = self._pauses_at[cap] = (pauses, behind / len(every))
        return terms

    def _room_latency_functions(
        self, cap: int
    ) -> tuple[list[Callable[[float], float]], list[Callable[[float], float]]]:
        """The latencies that must fit the room: with rare batches, and riding a tail batch
        (none without a finite room)."""
        if not self.room_ms < math.inf:
            return [], []
        rare, riding = [], []
        if self.service_body_p999_ms is not None:
            rare.append(self._latency_function(cap, self._service_body_p999))
        if self.service_p99_ms is not None:
            riding.append(self._latency_function(cap, own=self._service_p99))
        return rare, riding

    def _service(self, units: float) -> float:
        return self.service_median_ms(max(1, round(units)))

    def _service_body_p999(self, units: float) -> float:
        assert self.service_body_p999_ms is not None
        return _memoised(self._body_p999_ms, self.service_body_p999_ms, units)

    def _service_p99(self, units: float) -> float:
        assert self.service_p99_ms is not None
        return _memoised(self._p99_ms, self.service_p99_ms, units)

    def _service_body_spread(self, units: float) -> float:
        return _memoised(self._body_spread_ms, self.service_body_spread_ms, units)


def _realised_units(
    window_ms: float,
    rate_per_ms: float,
    service: Callable[[int], float],
    slots: int,
    top: float,
    start: float,
) -> float:
    """The batch that forms, units: the fixed point of ``n = 1 + rate * max(window,
    service(n) / slots)``, at most ``top``, from ``start`` (see the module docstring); it stops
    early once a step leaves ``n`` unchanged."""
    n = min(top, max(start, 1.0 + rate_per_ms * window_ms))
    for _ in range(_FIXED_POINT_STEPS):
        cycle = max(window_ms, service(max(1, round(n))) / slots)
        previous, n = n, min(top, 1.0 + rate_per_ms * cycle)
        if n == previous:
            break
    return n


def _poisson_batches(mean: float) -> list[tuple[int, float]]:
    """``(1 + k, P(k))`` for ``k ~ Poisson(mean)`` over ``mean +- 5`` standard deviations."""
    if mean <= 0:
        return [(1, 1.0)]
    spread = 5.0 * math.sqrt(mean)
    first, last = max(0, math.floor(mean - spread)), math.ceil(mean + spread)
    log_mean = math.log(mean)
    return [
        (1 + k, math.exp(k * log_mean - mean - math.lgamma(k + 1))) for k in range(first, last + 1)
    ]


def _poisson_high(units: float, top: float) -> float:
    """A batch of ``units`` on average at its 99th percentile (``POISSON_Z`` standard
    deviations of Poisson noise more), at most ``top``."""
    return min(top, units + POISSON_Z * math.sqrt(units))


_Value = TypeVar("_Value")


def _memoised(cache: dict[int, _Value], service: Callable[[int], _Value], units: float) -> _Value:
    """``service`` at ``units`` rounded to a batch size (at least 1), computed once per size."""
    n = max(1, round(units))
    value = cache.get(n)
    if value is None:
        value = cache[n] = service(n)
    return value

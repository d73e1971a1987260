"""``BudgetGuard``: the window and cap within the SLO's budget."""

from __future__ import annotations

import math
from typing import Final

from adaptive_batcher._log import get_logger
from adaptive_batcher.control.guards.base import Guard, smallest_seen
from adaptive_batcher.control.policy import Policy
from adaptive_batcher.control.types import Decision, Observation
from adaptive_batcher.slo import SLO

__all__ = ["BudgetGuard"]

_log = get_logger()


UNREACHABLE_REARM_S: Final = 60.0
"""How long the SLO must have been within reach before :class:`BudgetGuard` warns again that it
is not, s: a fit that flaps at the verdict's edge (frequent spikes) warned every few ticks."""


class BudgetGuard(Guard):
    """Keep any policy's (window, cap) inside what the latency budget allows, as planned.

    From the tick's :class:`~adaptive_batcher.control.plan.Plan`:

    * the cap is kept between the stability cap (the smallest that keeps up with the recent
      peak demand: never fewer answers than arrive) and the plan's cap (the largest whose
      two-batch latency fits the SLO's room, or the stability cap if larger); under overload (no
      cap keeps up) it is the highest-throughput cap, whatever the policy said;
    * the window is cut to the widest whose predicted tail latency, for the batch that will
      really form at that cap, fits the window's budget (the aim's, with the slack the measured
      tail has shown: ``Observation.window_budget_ms``); under overload it is 0.

    Before the service-time fit is ready (its first batches), the guard still acts on the
    measured latency: when ``min_samples`` latencies put the SLO's percentile above the target,
    the window is scaled by ``target / latency`` (``budget.blind``), since a window that is
    measurably late cannot wait for a model of the batches it makes slowly (a 250 ms window at
    60 req/s forms its eighth batch after 2 s).

    When the SLO cannot be met even by a batch of one (``2 * service(smallest cap)`` past
    ``Observation.aim_budget_ms``, which lies above two batches of one unless they overrun the
    room: the SLO's latency less preprocessing), the guard says so once
    (``controller.slo_unreachable`` warning; again only after ``UNREACHABLE_REARM_S`` within
    reach, or for a new SLO), flags the decision (``slo_unreachable``) and
    degrades to the lowest-latency setting: window 0, with the cap still kept where it keeps
    up. The verdict rests on what the batches have shown: the
    service-time fit is flat below the smallest batch it has seen, so after a cold burst of
    full batches (512 at 32 ms) it reads a batch of one at 32 ms where the device takes 3.7. The
    guard tracks the smallest batch seen, in units (at most the smallest mean batch of a tick,
    :attr:`smallest_units_seen`); while that is above the smallest cap, ``service(smallest
    cap)`` is the fit's trend from there (its secant from that size to twice it) continued
    down to the smallest cap: a fit flat there keeps its value, one that grows in proportion
    (a burst's full batches, the only sizes seen) says nothing is known yet, and no verdict
    is given until smaller batches are seen.
    """

    def __init__(self, inner: Policy, min_samples: int = 20) -> None:
        super().__init__(inner)
        self.min_samples = min_samples
        self.slo_unreachable = False
        self.smallest_units_seen = math.inf
        """The smallest batch seen so far is at most this many units (inf: no batch yet)."""
        self._warned = False  # the warning is given and not re-armed
        self._warned_for: SLO | None = None  # the SLO it was given for
        self._reachable_since_s = math.inf  # the SLO has been within reach since (inf: not)

    def correct(self, observation: Observation, decision: Decision) -> Decision:
        self._note_batches(observation)
        budget = observation.budget_ms
        plan = observation.plan()
        if math.isnan(budget):
            return decision
        if not plan.ready:
            return self._blind(observation, decision)
        unreachable = self._note_reachability(observation, plan.caps[0], observation.aim_budget_ms)
        stable = plan.floor_cap(budget)  # the stability cap (with buckets, see the plan)
        if stable is None:  # overload: only throughput matters now
            cap = plan.throughput_cap() or decision.max_batch_size
            window = 0.0
        else:
            ceiling = plan.cap(budget, observation.room_ms) or decision.max_batch_size
            cap = min(max(decision.max_batch_size, stable), ceiling)
            window_budget = observation.window_budget_ms  # the budget, with measured slack
            window = 0.0 if unreachable else plan.widest_window_ms(window_budget, cap)
        if cap == decision.max_batch_size and decision.window_ms <= window and not unreachable:
            return decision
        reason = "slo_unreachable" if unreachable else "budget"
        return decision.with_(
            window_ms=min(decision.window_ms, window),
            max_batch_size=cap,
            reason=reason,
            slo_unreachable=unreachable,
        )

    def _blind(self, observation: Observation, decision: Decision) -> Decision:
        """Without a service-time fit: scale a measurably late window by target / latency."""
        latency, target = observation.latency_ms, observation.target_ms
        if observation.latency_samples < self.min_samples or not latency > target:
            return decision
        window = observation.current.window_ms * target / latency
        if decision.window_ms <= window:
            return decision
        return decision.with_(window_ms=window, reason="budget.blind")

    def _note_batches(self, observation: Observation) -> None:
        """Lower :attr:`smallest_units_seen` to the tick's mean batch, in units (its smallest
        batch was at most that)."""
        self.smallest_units_seen = smallest_seen(self.smallest_units_seen, observation)

    def _floor_service_ms(self, observation: Observation, smallest: int) -> float:
        """The service time of a batch of ``smallest`` units as far as the batches seen show
        it, ms (NaN before any batch): the fit's own value once a batch that small was seen,
        else its trend from the smallest batch seen continued down, at least 0 (see the class)."""
        seen = self.smallest_units_seen
        if seen <= smallest:
            return observation.service_median_ms(smallest)
        if math.isinf(seen):
            return math.nan
        fit = (
            observation.service_median_bound_ms or observation.service_median_ms
        )  # in proportion beyond
        size = int(seen)
        at_seen = fit(size)
        slope = max(fit(2 * size) - at_seen, 0.0) / size
        return max(at_seen - slope * (size - smallest), 0.0)

    def _note_reachability(self, observation: Observation, smallest: int, budget: float) -> bool:
        floor_service = self._floor_service_ms(observation, smallest)
        unreachable = 2.0 * floor_service > budget  # False for NaN: no verdict yet
        now_s = observation.now_s
        if unreachable:
            self._reachable_since_s = math.inf
        else:
            self._reachable_since_s = min(self._reachable_since_s, now_s)
            if now_s - self._reachable_since_s >= UNREACHABLE_REARM_S:
                self._warned = False
        if observation.slo != self._warned_for:
            self._warned = False  # a new SLO is a new verdict
        if unreachable and not self._warned:
            self._warned, self._warned_for = True, observation.slo
            _log.warning(
                "controller.slo_unreachable",
                budget_ms=round(budget, 3),
                two_batches_ms=round(2.0 * floor_service, 3),
                service_ms_at_smallest=round(floor_service, 3),
                smallest_batch_size=smallest,
                smallest_units_seen=self.smallest_units_seen,
            )
        self.slo_unreachable = unreachable
        return unreachable

"""Guards: decorators around any policy that keep its decisions safe.

Each guard is itself a :class:`~adaptive_batcher.policies.Policy`: it asks the policy it wraps,
then corrects the answer (smoothing and safety as decorators around the algorithm, as in Netflix
concurrency-limits). The default chain (:func:`~adaptive_batcher.control.default_guards`),
innermost first: unused window, budget, power back-off, memory, then SLO-aware shedding when
asked for, then buckets; the controller clamps the result to the bounds.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from adaptive_batcher._log import get_logger
from adaptive_batcher.control.capacity import choose_cap, stability_cap, throughput_cap
from adaptive_batcher.control.policy import Policy
from adaptive_batcher.control.types import Decision, Observation

__all__ = [
    "BucketGuard",
    "BudgetGuard",
    "Guard",
    "MemoryGuard",
    "PowerGuard",
    "ShedGuard",
    "UnusedWindowGuard",
]

_log = get_logger()

SHED_SERVICE_SAFETY = 1.1  # the batch a late request joins may run ~10 % longer than the median


class Guard:
    """Base of the guards: forwards to ``inner`` and lets a subclass correct the decision."""

    def __init__(self, inner: Policy) -> None:
        self.inner = inner
        self.name = f"{type(self).__name__}({inner.name})"

    def reset(self, current: Decision) -> None:
        self.inner.reset(current)

    def decide(self, observation: Observation) -> Decision:
        return self.correct(observation, self.inner.decide(observation))

    def correct(self, observation: Observation, decision: Decision) -> Decision:
        """Return ``decision`` or a safer one."""
        raise NotImplementedError


class UnusedWindowGuard(Guard):
    """Window to 0 when waiting brings no company (MLServer #777).

    Two signs that the window only adds latency: batches stay at about one item although the
    window is open (a closed-loop client with one request in flight), or the batches the window
    releases spent most of it waiting after their last arrival (``window_idle_fraction``:
    closed-loop clients fewer than the cap, who all wait in the queue while nobody else can
    come; or traffic too thin to fill a window). The guard then holds the window at 0 until the
    arrival rate rises by ``rearm_factor`` over the highest rate seen with the window shut
    (closed-loop clients come faster once the window is shut; that alone must not reopen it).

    Args:
        min_mean_batch: a window whose batches average fewer items than this is unused.
        max_idle_fraction: a window whose released batches waited more than this share of it
            after their last arrival is unused.
        min_batches: batches a tick must have for its figures to count.
        rearm_factor: arrival-rate growth that lets the policy open the window again.
    """

    def __init__(
        self,
        inner: Policy,
        min_mean_batch: float = 1.5,
        max_idle_fraction: float = 0.5,
        min_batches: int = 5,
        rearm_factor: float = 1.5,
    ) -> None:
        super().__init__(inner)
        self.min_mean_batch = min_mean_batch
        self.max_idle_fraction = max_idle_fraction
        self.min_batches = min_batches
        self.rearm_factor = rearm_factor
        self.closed = False
        self.closed_at_rate_rps: float | None = None

    def correct(self, observation: Observation, decision: Decision) -> Decision:
        current = observation.current
        lonely = observation.mean_batch_size < self.min_mean_batch
        idle = observation.window_idle_fraction > self.max_idle_fraction  # False for NaN
        unused = (
            current.window_ms > 0 and observation.batches >= self.min_batches and (lonely or idle)
        )
        rate = observation.arrival_rate_rps
        if unused:
            self.closed = True
            self.closed_at_rate_rps = None  # measured on the first tick with the window shut
        elif self.closed:
            reference = self.closed_at_rate_rps
            if reference is None:
                # closed-loop clients come faster once the window is shut: that rate, not the
                # one seen with the window open, is what a real rise in load must exceed
                self.closed_at_rate_rps = rate
            elif rate > self.rearm_factor * reference:
                self.closed = False
            else:
                self.closed_at_rate_rps = max(reference, rate)
        if self.closed and decision.window_ms > 0:
            return decision.with_(window_ms=0.0, reason="window_unused")
        return decision


class BudgetGuard(Guard):
    """Keep queueing + compute inside the SLO's latency budget.

    The window is cut to ``budget - 2 * service(cap)`` and the cap to
    :func:`~adaptive_batcher.control.capacity.choose_cap` for the budget: the largest whose
    predicted latency fits, but never one that falls behind the arrivals and backlog. When the
    SLO cannot be met even by a batch of one (``2 * service(smallest cap) > budget``), the guard
    says so once (``controller.slo_unreachable`` warning, ``slo_unreachable`` flag) and degrades
    to the lowest-latency setting: window 0, the cap left to the policy and the other guards.
    """

    def __init__(self, inner: Policy) -> None:
        super().__init__(inner)
        self.slo_unreachable = False

    def correct(self, observation: Observation, decision: Decision) -> Decision:
        budget = observation.budget_ms
        smallest = observation.bounds.cap_candidates()[0]
        floor_service = observation.service_ms(smallest)
        if math.isnan(budget) or math.isnan(floor_service):
            return decision
        unreachable = 2.0 * floor_service > budget
        if unreachable and not self.slo_unreachable:
            _log.warning(
                "controller.slo_unreachable",
                budget_ms=round(budget, 3),
                service_ms_at_smallest=round(floor_service, 3),
                smallest_batch_size=smallest,
            )
        self.slo_unreachable = unreachable
        if unreachable:
            return decision.with_(window_ms=0.0, reason="slo_unreachable", slo_unreachable=True)
        cap = decision.max_batch_size
        ceiling = choose_cap(observation, budget, 0.0)
        if ceiling is not None and cap > ceiling:
            cap = ceiling
        room = max(0.0, budget - 2.0 * observation.service_ms(cap))
        if cap == decision.max_batch_size and decision.window_ms <= room:
            return decision
        return decision.with_(
            window_ms=min(decision.window_ms, room), max_batch_size=cap, reason="budget"
        )


class PowerGuard(Guard):
    """Step back when raising window or cap made throughput / latency fall (Kleinrock's power).

    After a tick in which the window or the cap went up, the guard compares power before and
    after; if it fell by more than ``tolerance``, it returns to the settings before the increase
    and refuses increases for ``hold_ticks`` ticks.
    """

    def __init__(self, inner: Policy, tolerance: float = 0.1, hold_ticks: int = 8) -> None:
        super().__init__(inner)
        self.tolerance = tolerance
        self.hold_ticks = hold_ticks
        self._before: tuple[Decision, float] | None = None
        self._hold = 0

    def correct(self, observation: Observation, decision: Decision) -> Decision:
        current, power = observation.current, observation.power
        if self._before is not None and not math.isnan(power):
            previous, previous_power = self._before
            self._before = None
            if power < (1.0 - self.tolerance) * previous_power:
                self._hold = self.hold_ticks
                return previous.with_(reason="power_backoff")
        if self._hold > 0:
            self._hold -= 1
            if _raises(decision, current):
                return decision.with_(
                    window_ms=min(decision.window_ms, current.window_ms),
                    max_batch_size=min(decision.max_batch_size, current.max_batch_size),
                    reason="power_hold",
                )
            return decision
        if _raises(decision, current) and not math.isnan(power):
            self._before = (current, power)
        return decision


class ShedGuard(Guard):
    """SLO-aware shedding: fail at once the requests that can no longer meet the SLO.

    With shedding on, batches too slow to meet the SLO are pointless, so the cap is held at or
    below ``best``, the highest-throughput cap whose two-batch latency fits the budget (under
    overload it is set to it: the most requests served within the SLO). A request that has not
    started ``p99_ms - preprocess_ms - 1.1 * service(best)`` after its arrival cannot finish
    within the SLO (10 % for batches slower than the median; ``best``, as a burst may follow its
    arrival); serving it late only delays the requests behind it (under overload every request
    would miss). The guard sets ``shed_after_ms`` to that time, so such a request fails with
    ``DeadlineExceededError`` at that moment (the same idea as BentoML's cork dispatcher, which
    cancels requests whose predicted latency exceeds its max latency, and Clockwork's admission
    control). When even that leaves no time (the SLO is out of reach), nothing is shed: late
    answers beat none.
    """

    def correct(self, observation: Observation, decision: Decision) -> Decision:
        slo = observation.slo
        if slo is None or math.isnan(observation.service_ms(decision.max_batch_size)):
            return decision
        cap = decision.max_batch_size
        best = throughput_cap(observation, observation.budget_ms) or cap
        # never a batch too slow to meet the SLO; under overload, the most served within it
        cap = best if stability_cap(observation) is None else min(cap, best)
        # a request admitted now may run in the largest such batch when a burst follows
        slowest = SHED_SERVICE_SAFETY * max(
            observation.service_ms(cap), observation.service_ms(best)
        )
        shed_after = slo.p99_ms - slo.preprocess_ms - slowest
        if shed_after <= 0:  # the SLO is out of reach: answer late rather than not at all
            return decision.with_(max_batch_size=cap, shed_after_ms=None)
        return decision.with_(max_batch_size=cap, shed_after_ms=shed_after)


class MemoryGuard(Guard):
    """Shrink the cap under GPU memory pressure and after out-of-memory errors.

    * Free memory below ``min_free_fraction`` of the total (from telemetry): the cap ceiling
      becomes ``shrink * cap``.
    * Any out-of-memory error in the tick: the ceiling becomes half the cap in force (the runtime
      has already re-run the failed batch split in halves, so no request was lost), and that cap
      is remembered as too big for ``forget_s``.

    The ceiling holds for ``cooldown_s`` after the last pressure, then rises by ``recover`` per
    tick, never to a cap remembered as too big, until it no longer binds. Probing upward this way
    finds the largest cap that fits in a few steps instead of failing batch after batch.
    """

    def __init__(
        self,
        inner: Policy,
        min_free_fraction: float = 0.1,
        shrink: float = 0.75,
        cooldown_s: float = 10.0,
        recover: float = 1.25,
        forget_s: float = 60.0,
    ) -> None:
        super().__init__(inner)
        self.min_free_fraction = min_free_fraction
        self.shrink = shrink
        self.cooldown_s = cooldown_s
        self.recover = recover
        self.forget_s = forget_s
        self.ceiling: int | None = None
        self.too_big: int | None = None
        self._pressure_at = -math.inf
        self._too_big_at = -math.inf

    def correct(self, observation: Observation, decision: Decision) -> Decision:
        now = observation.now_s
        reason = self._update(observation)
        if reason:
            _log.warning(
                "controller.memory_guard",
                reason=reason,
                cap_ceiling=self.ceiling,
                too_big=self.too_big,
                free_fraction=observation.telemetry.free_fraction,
                oom_errors=observation.oom_errors,
            )
        elif self.ceiling is not None and now - self._pressure_at >= self.cooldown_s:
            self._recover(observation.bounds.max_batch_size, now)
        if self.ceiling is not None and decision.max_batch_size > self.ceiling:
            return decision.with_(max_batch_size=self.ceiling, reason=reason or "memory_ceiling")
        return decision

    def _update(self, observation: Observation) -> str:
        cap_now = observation.current.max_batch_size
        free = observation.telemetry.free_fraction
        if observation.oom_errors > 0:
            self.too_big = cap_now if self.too_big is None else min(self.too_big, cap_now)
            self._too_big_at = observation.now_s
            self.ceiling = max(1, cap_now // 2)
        elif free is not None and free < self.min_free_fraction:
            self.ceiling = max(1, int(cap_now * self.shrink))
        else:
            return ""
        self._pressure_at = observation.now_s
        return "out_of_memory" if observation.oom_errors > 0 else "memory_pressure"

    def _recover(self, hard_cap: int, now: float) -> None:
        assert self.ceiling is not None
        if self.too_big is not None and now - self._too_big_at >= self.forget_s:
            self.too_big = None
        ceiling = math.ceil(self.ceiling * self.recover)
        if self.too_big is not None:
            ceiling = min(ceiling, self.too_big - 1)
        self.ceiling = max(self.ceiling, ceiling)
        if self.ceiling >= hard_cap:
            self.ceiling = None


class BucketGuard(Guard):
    """Caps only among warmed batch sizes: cold shapes cost 100-970 ms of p99 on an H200
    (../shared/profiles/h200/executor_diag_*.csv).

    Args:
        warmed: returns the warmed sizes now (e.g. ``lambda: batcher.warmed_sizes``); when it is
            empty the guard lets every size through.
    """

    def __init__(self, inner: Policy, warmed: Callable[[], frozenset[int]]) -> None:
        super().__init__(inner)
        self.warmed = warmed

    def correct(self, observation: Observation, decision: Decision) -> Decision:
        sizes = sorted(self.warmed())
        if not sizes or decision.max_batch_size in sizes:
            return decision
        fitting = [s for s in sizes if s <= decision.max_batch_size]
        cap = fitting[-1] if fitting else sizes[0]
        return decision.with_(max_batch_size=cap, reason="bucket")


def _raises(decision: Decision, current: Decision) -> bool:
    return (
        decision.window_ms > current.window_ms or decision.max_batch_size > current.max_batch_size
    )

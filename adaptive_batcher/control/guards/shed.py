"""``ShedGuard``: SLO-aware shedding, and the cap that answers the most within the SLO."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import ClassVar, Final

from adaptive_batcher.control.guards.base import (
    CAP_PROBE,
    STEP_MAX_CUT,
    Guard,
    cut_at_most,
    smallest_seen,
)
from adaptive_batcher.control.plan import Plan
from adaptive_batcher.control.policy import Policy
from adaptive_batcher.control.types import Decision, Observation

__all__ = ["ShedGuard"]


SHED_SWITCH_GAIN: Final = 0.05
"""The least share more answers within the SLO for which :class:`ShedGuard` takes, under
overload, a cap whose batches do not keep up over one whose two batches fit the SLO: the
requests already queued keep the deadlines of the cap they arrived under, and a larger one's
full batches answer them late (docs/policies.md, "ShedGuard")."""


class ShedGuard(Guard):
    """SLO-aware shedding: fail at once the requests that can no longer meet the SLO.

    A request that has not started by ``room - s(n)`` after its arrival (``room`` =
    ``latency_ms - preprocess_ms`` less the loop's lag, :attr:`Observation.room_ms`),
    where ``n`` is the batch it will run in, cannot finish within the SLO: serving it late only
    delays the requests behind it. For a streaming model ``s(n)`` is the share of the batch's
    time before its first answer (``Observation.answer_share``): its callers' latency ends
    there. The guard sets two such deadlines (the core gives each
    arrival one, by the queue it joins):

    * ``shed_after_ms``, for a request that arrives into a queue already holding a full batch
      (``n = cap``), with the error bars observed (``Observation.service_spread_ms``);
    * ``shed_after_short_ms``, for one that arrives into a shorter queue: ``n`` is the batch the
      plan predicts at this window, with its median time (a request is shed only if even a
      typical batch would finish late).

    The cap is held at or below the largest whose two-batch latency fits that room; under
    overload (or when keeping up would need a larger one) it is the highest-throughput such cap,
    unless a larger one answers more within the room: with natural batches that keep up, or
    with full batches of requests that waited no longer than its deadline. Away from overload
    its cut halves the cap in force a tick at most (``STEP_MAX_CUT``, as
    :class:`~adaptive_batcher.control.guards.step.StepGuard`): the fit it follows is as noisy as
    the policy's input. It never exceeds the decision's
    ``max_batch_size_ceiling`` (memory). When even a full batch's
    deadline leaves no time, nothing is shed (late answers beat none), unless the load is an
    overload: then a request not begun within one batch's time is shed, so that the queue, and
    the lateness of every answer, stays bounded. A cap probe's cap is kept (``CAP_PROBE``: the
    fit this guard would choose by is the one the probe measures). Before the service-time fit
    is ready (the first batches, or a model that hangs on its first calls), a request not begun
    within the SLO's room is shed: whatever its batch takes, it is late. The law and its figures:
    docs/policies.md, "ShedGuard". Sources: BentoML's cork dispatcher, Clockwork's admission
    control (Gujarati et al., OSDI 2020).
    """

    sheds: ClassVar[bool] = True  # see Policy

    def __init__(self, inner: Policy) -> None:
        super().__init__(inner)
        self.smallest_units_seen = math.inf
        """The smallest batch run so far is at most this many units (inf: none yet)."""

    def correct(self, observation: Observation, decision: Decision) -> Decision:
        self.smallest_units_seen = smallest_seen(self.smallest_units_seen, observation)
        slo, plan = observation.slo, observation.plan()
        if slo is None:
            return decision
        room = observation.room_ms
        if not plan.ready:  # no batch time known yet: one that has waited the room is late
            return decision.with_(shed_after_ms=room, shed_after_short_ms=room)
        share = observation.answer_share  # a stream's callers are answered at its first step
        high = observation.service_spread_ms or observation.service_median_ms
        typical = observation.service_median_bound_ms or observation.service_median_ms
        high_answer, typical_answer = _answered(high, share), _answered(typical, share)
        # the deadlines enforce the SLO itself, so a full batch behind a full batch must fit
        # the room, not the target (whose margin is the p99 plan's)
        best = plan.throughput_cap(room) or decision.max_batch_size
        stable = plan.stable_cap(observation.budget_ms)
        # overload, or keeping up needs batches too slow for the SLO: the most answers within
        # it; otherwise never a batch too slow for it (the largest cap that fits, not the
        # fit's throughput argmax: a spike in the fit must not cut the cap of a light load)
        tail = plan.tail_cap(room)
        fits = tail or best
        overload = stable is None or stable > best
        if overload:
            # no cap both keeps up and fits twice: the most answers within the SLO; where not
            # even two of the smallest fit, the one batch whose wait gathers the most does
            arriving = _at_mean_rate(observation, plan)
            off_grid = _fill_cap(arriving, room, high_answer)
            if tail is None:
                best = (
                    _one_batch_cap(arriving, room, typical_answer, high_answer, off_grid)
                    or _unexplored_cap(plan, self.smallest_units_seen, room, typical_answer)
                    or best
                )
            cap = _goodput_cap(arriving, room, best, high_answer, off_grid, share) or best
            smaller = _superlinear_cap(plan, self.smallest_units_seen, room, typical_answer)
            cap = min(cap, smaller or cap)
        else:  # a cut by the fit, as noisy as the PID's input, halves the cap a tick at most
            cut = decision.with_(max_batch_size=min(decision.max_batch_size, fits))
            cap = min(decision.max_batch_size, cut_at_most(observation, cut, STEP_MAX_CUT))
        if decision.reason == CAP_PROBE:  # the fit above the cap is what a probe measures
            cap = decision.max_batch_size
        cap = min(cap, decision.max_batch_size_ceiling or cap)  # memory's ceiling holds
        # error bars wider than the room (event-loop stalls on a saturated machine) leave the
        # typical batch's deadline; only if even that leaves no time is the SLO out of reach
        # away from overload a deadline binds only for a request held back (a pause): it may
        # count on the loop's usual lag; under overload every answer comes at its deadline,
        # and the lag's tail must fit as the caps' does
        deadline_room = room if overload else observation.shed_room_ms
        full = deadline_room - high_answer(cap)
        if full <= 0:
            full = deadline_room - typical_answer(cap)
        if full <= 0:  # the SLO is out of reach: answer late rather than not at all, but
            # under overload a queue left to grow makes every answer later without end: a
            # request not begun within one batch has a full batch ahead of it, and is failed
            late = typical(cap) if overload else None
            return decision.with_(max_batch_size=cap, shed_after_ms=late, shed_after_short_ms=late)
        realised = max(1, round(plan.batch_units(decision.window_ms, cap)))
        short = max(full, deadline_room - typical_answer(realised))
        return decision.with_(max_batch_size=cap, shed_after_ms=full, shed_after_short_ms=short)


def _answered(service: Callable[[int], float], share: float) -> Callable[[int], float]:
    """The time from a batch's start to its callers' answers, ms: ``share`` of ``service``
    (a streaming model's first step; ``service`` itself at 1)."""
    if share >= 1.0:
        return service
    return lambda units: share * service(units)


def _one_batch_cap(
    plan: Plan,
    room_ms: float,
    typical: Callable[[int], float],
    high: Callable[[int], float],
    off_grid: int | None = None,
) -> int | None:
    """The cap whose batches answer the most within ``room_ms`` where not even two of the
    smallest fit it (a device slowed down many times), None when no batch fits once. Shedding
    keeps each request's wait within what one typical batch (``typical``, ms) leaves of the
    room, so a cap answers its throughput while that wait gathers a full batch, in proportion
    below that (:func:`_shed_answers`): a cap whose one batch just fits leaves no wait and
    answers almost nothing. Ties go to the higher throughput. ``off_grid``, a cap between the
    candidates (:func:`_fill_cap`), fills within the deadline that is set, ``room - high(cap)``
    (``high``: with the error bars). ``typical`` and ``high`` run to the callers' answers
    (a stream's first step: :func:`_answered`)."""
    answers = {cap: _shed_answers(plan, cap, room_ms - typical(cap)) for cap in plan.caps}
    if off_grid is not None:
        waited = room_ms - high(off_grid)
        answers[off_grid] = _shed_answers(plan, off_grid, waited) / (1.0 + SHED_SWITCH_GAIN)
    chosen = max(answers, key=lambda cap: (answers[cap], plan.throughput_units_per_s(cap)))
    return chosen if answers[chosen] > 0 else None


def _unexplored_cap(
    plan: Plan, smallest_units_seen: float, room_ms: float, typical: Callable[[int], float]
) -> int | None:
    """The largest cap below every batch run so far (``smallest_units_seen``), where the fit
    is flat (the same time at the cap and one unit above: it knows nothing there), that could
    answer within ``room_ms`` if its time shrank in proportion to its size (the most a
    smaller batch can gain), or None. Where no cap's batch answers within the room as the fit
    reads it, the fit is flat below the sizes it knows (a cold start straight into overload
    runs full batches only), so a smaller batch's time is unknown, not known to be as slow.
    Taken for a tick, its batches teach the fit their time; the next smaller one follows
    while none answers, so the cost is bounded by the number of candidates."""
    if math.isinf(smallest_units_seen):
        return None
    seen = int(smallest_units_seen)
    at_seen = typical(seen)
    below = [
        cap
        for cap in plan.caps
        if cap < seen
        and typical(cap + 1) <= typical(cap) * (1.0 + 1e-9)  # the fit is flat there: unknown
        and at_seen * cap / seen < room_ms
    ]
    return below[-1] if below else None


def _superlinear_cap(
    plan: Plan, smallest_units_seen: float, room_ms: float, typical: Callable[[int], float]
) -> int | None:
    """Under overload, the cap to try below every batch run so far (see
    :func:`_unexplored_cap`) where the fit grows faster than in proportion from the smallest
    size run (twice it takes more than twice its time, by ``SHED_SWITCH_GAIN``), or None.
    There a smaller batch answers more per second, which the fit, flat below the sizes it
    knows, cannot show: a cold start into overload runs full batches of the first cap only
    (1 ms + 0.02 n^2 ms, run at 16 and 32 only, reads 8 at 16's time where it takes 2.3 ms and
    answers a third more per second). Once run, a size is known, so each cap is tried once."""
    if math.isinf(smallest_units_seen):
        return None
    seen = int(smallest_units_seen)
    if typical(2 * seen) <= 2.0 * (1.0 + SHED_SWITCH_GAIN) * typical(seen):
        return None
    return _unexplored_cap(plan, smallest_units_seen, room_ms, typical)


def _fill_cap(plan: Plan, room_ms: float, service: Callable[[int], float]) -> int | None:
    """A cap between the plan's candidates (unpadded plans only: a padded batch runs at its
    bucket), or None: the largest whose deadline still gathers a full batch, the most ``n``
    with ``rate x (room - service(n)) >= n`` (``service``: the batch's time, ms, as the
    deadline counts it; by bisection, as it grows with ``n``), where its full batches do not
    keep up with the arrivals. Under overload with shedding such a cap's full batches answer
    its whole throughput within the room, and a larger one answers less
    (:func:`_shed_answers`): between two powers of two it can answer a fifth more than either
    (a 4x slowdown of resnet50 at 30 % load: 82 against 64). Off the grid, it is taken only
    for ``SHED_SWITCH_GAIN`` more answers than the grid's best: its requests wait little, so
    a batch past its error bars misses whole."""
    caps, per_ms = plan.caps, plan.rate_units_per_s / 1e3
    if plan.padded or not caps or not per_ms > 0:
        return None

    def fills(n: int) -> bool:
        return per_ms * (room_ms - service(n)) >= n

    low, high = caps[0], caps[-1]
    if not fills(low) or fills(high):
        return None
    while high - low > 1:  # fills(low) and not fills(high)
        middle = (low + high) // 2
        low, high = (middle, high) if fills(middle) else (low, middle)
    if low in caps or plan.throughput_units_per_s(low) >= plan.rate_units_per_s:
        return None  # a cap that keeps up: its natural batches, not full ones, are the law's
    return low


def _at_mean_rate(observation: Observation, plan: Plan) -> Plan:
    """``plan`` at the tick's own arrival rate where that is below the plan's (the recent
    peak): which cap answers the most within the SLO is a question about the arrivals to come,
    and near saturation a natural batch sized for the peak is several times the mean's."""
    rate = observation.arrival_rate_rps * observation.mean_request_units
    if not 0.0 < rate < plan.rate_units_per_s:
        return plan
    return replace(plan, rate_units_per_s=rate)


def _goodput_cap(
    plan: Plan,
    room_ms: float,
    best: int,
    high: Callable[[int], float],
    off_grid: int | None = None,
    share: float = 1.0,
) -> int | None:
    """A cap above ``best`` (the highest-throughput cap whose two full batches fit
    ``room_ms``; it sheds what it cannot keep up with) whose batches answer more of the
    arrivals within the room, or None. Where the cap keeps up, the batches that form at window
    0 hold what arrived during the batch before (:func:`_natural_batch`), ``n`` units; a
    request waits up to one cycle (``s(n) / slots``) and then rides its batch to its answers
    (``share`` of it: 1, or a stream's first step), so about ``(room - share * s(n)) / cycle``
    of them meet the room. Where it does not, its batches run full of the requests that have
    waited at most ``room - high(cap)`` (``high``: the time from a batch's start to its
    callers' answers with its error bars, ms; the shedding deadline drops the rest), so it
    answers its throughput within the room while that wait gathers a full batch
    (:func:`_shed_answers`); it is taken only for ``SHED_SWITCH_GAIN`` more answers than the
    alternative, and ``off_grid`` (a cap between the candidates, :func:`_fill_cap`) for as
    much again.
    With ``best``, ``throughput(best) / rate`` of them meet it (why: docs/policies.md,
    "ShedGuard")."""
    rate = plan.rate_units_per_s
    if not rate > 0:
        return None
    chosen, most = None, min(rate, plan.throughput_units_per_s(best))
    for cap in sorted({*plan.caps, off_grid or 0}):
        if cap <= best:
            continue
        units = _natural_batch(plan, cap)
        if units is None:
            answered = _shed_answers(plan, cap, room_ms - high(cap)) / (1.0 + SHED_SWITCH_GAIN)
            if cap == off_grid:
                answered /= 1.0 + SHED_SWITCH_GAIN
        else:
            service = plan.service_median_ms(units)
            answered_ms = share * service  # its own batch, to its answers
            within = min(1.0, max(0.0, (room_ms - answered_ms) / (service / plan.slots)))
            answered = within * rate
        if answered > most:
            chosen, most = cap, answered
    return chosen


def _shed_answers(plan: Plan, cap: int, wait_ms: float) -> float:
    """Units per second answered within the room by full batches of ``cap`` that do not keep
    up with the arrivals, when a request may wait ``wait_ms`` before its batch begins (the
    deadline sheds it after): the cap's throughput while ``wait_ms`` of arrivals fill a batch,
    in proportion below that; 0 when no wait is left."""
    if wait_ms <= 0:
        return 0.0
    gathered = plan.rate_units_per_s * wait_ms / 1e3
    return plan.throughput_units_per_s(cap) * min(1.0, gathered / cap)


def _natural_batch(plan: Plan, cap: int) -> int | None:
    """The batch that forms at window 0 and ``cap``: the least ``n`` that holds what arrives
    while one batch runs, ``n >= 1 + rate * s(n) / slots`` (by bisection; service time grows
    with ``n``); None when full batches of ``cap`` do not keep up with the arrivals."""
    per_ms = plan.rate_units_per_s / 1e3 / plan.slots
    if plan.throughput_units_per_s(cap) < plan.rate_units_per_s:
        return None
    low, high = 1, cap  # 1 holds too little (unless the service takes no time), cap enough
    while low < high:
        middle = (low + high) // 2
        if middle >= 1.0 + per_ms * plan.service_median_ms(middle):
            high = middle
        else:
            low = middle + 1
    return low

"""Guards: decorators around any policy that keep its decisions safe.

Each guard is itself a :class:`~adaptive_batcher.policies.Policy`: it asks the policy it wraps,
then corrects the answer (smoothing and safety as decorators around the algorithm, as in Netflix
concurrency-limits). The default chain (:func:`~adaptive_batcher.control.default_guards`),
innermost first: unused window (its own module, :mod:`adaptive_batcher.control.unused_window`),
budget, power back-off, step limit, memory, then SLO-aware shedding when asked for, then
buckets; the controller clamps the result to the bounds.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from typing import ClassVar, Final

from adaptive_batcher._log import get_logger
from adaptive_batcher.control.plan import Plan
from adaptive_batcher.control.policy import Policy
from adaptive_batcher.control.types import Decision, Observation
from adaptive_batcher.slo import SLO

__all__ = [
    "BucketGuard",
    "BudgetGuard",
    "Guard",
    "MemoryGuard",
    "PowerGuard",
    "ShedGuard",
    "StallGuard",
    "StepGuard",
]

_log = get_logger()

STEP_MAX_CUT: Final = 0.5
"""The least share of the cap in force that one tick's cut may leave, where the cut follows the
service-time fit (:class:`StepGuard`, and :class:`ShedGuard` away from overload)."""

UNREACHABLE_REARM_S: Final = 60.0
"""How long the SLO must have been within reach before :class:`BudgetGuard` warns again that it
is not, s: a fit that flaps at the verdict's edge (frequent spikes) warned every few ticks."""


class Guard:
    """Base of the guards: forwards to ``inner`` and lets a subclass correct the decision."""

    def __init__(self, inner: Policy) -> None:
        self.inner = inner
        self.name = f"{type(self).__name__}({inner.name})"

    def reset(self, current: Decision) -> None:
        self.inner.reset(current)

    def decide(self, observation: Observation) -> Decision:
        return self.correct(observation, self.inner.decide(observation))

    def chosen(self, in_force: Decision) -> Decision:
        """The settings the policy chose, given ``in_force``: a guard that holds a temporary
        override (the unused-window guard's 0) gives back what it displaced; by default, what
        the guard inside says, else ``in_force``."""
        inner = self.inner
        return inner.chosen(in_force) if isinstance(inner, Guard) else in_force

    def correct(self, observation: Observation, decision: Decision) -> Decision:
        """Return ``decision`` or a safer one."""
        raise NotImplementedError


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
        self.smallest_units_seen = _smallest_seen(self.smallest_units_seen, observation)

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


def _smallest_seen(smallest: float, observation: Observation) -> float:
    """``smallest`` (units; inf: no batch yet) lowered to the tick's mean batch in units: the
    tick's smallest batch was at most that."""
    if observation.batches > 0:
        mean_units = observation.fill_ratio * observation.current.max_batch_size
        if mean_units >= 1.0:  # False for NaN
            floor = math.floor(mean_units + 1e-9)  # a mean of whole units, in floats
            return min(smallest, floor)
    return smallest


class PowerGuard(Guard):
    """Step back when raising the cap made Kleinrock's power fall, beyond its noise.

    Power is throughput over mean latency (Kleinrock 1979); here it is normalised by the arrival
    rate (``throughput / arrivals / mean latency``), so the tick-to-tick swing of arrival counts
    (about 14 % per 250 ms tick at 200 req/s) does not read as a change. Only cap raises made
    while batches fill (``fill_ratio >= 0.9``: the cap binds, so raising it should raise
    throughput) are judged; window changes are the cost lever and are judged by the latency
    feedback, not here. A raise is judged on ``settle_ticks`` ticks after it, against the mean
    and spread of the log-power over up to ``history`` ticks before it at unchanged settings:
    the guard returns to the settings before the raise, and refuses raises for ``hold_ticks``
    ticks, only if the mean fell by more than ``tolerance`` and by more than ``z`` standard
    errors (a two-sample test with the spread seen before the raise).

    A raise from a cap that cannot keep up with the demand (the plan's stability cap is above
    it, or no cap keeps up) is neither judged nor refused: it answers a rise in load, whose
    queue lowers power whatever the cap, and stepping back would leave a cap that only queues
    (at the onset of a burst, the old guard read the burst's queue as damage from the raise
    and held the cap below the highest-throughput one while the backlog drained).

    Args:
        tolerance: smallest relative fall acted on, in (0, 1).
        z: standard errors the fall must exceed.
        settle_ticks: ticks measured after a raise.
        history: ticks kept to estimate the mean and spread before a raise.
        hold_ticks: ticks without raises after a back-off.
    """

    def __init__(
        self,
        inner: Policy,
        tolerance: float = 0.1,
        z: float = 3.0,
        settle_ticks: int = 2,
        history: int = 16,
        hold_ticks: int = 8,
    ) -> None:
        super().__init__(inner)
        self.tolerance = tolerance
        self.z = z
        self.settle_ticks = settle_ticks
        self.hold_ticks = hold_ticks
        self._history: deque[float] = deque(maxlen=history)
        self._trial: tuple[Decision, float, float, int] | None = None  # before, mean, var, n
        self._after: list[float] = []
        self._hold = 0

    def correct(self, observation: Observation, decision: Decision) -> Decision:
        current = observation.current
        sample = _log_power(observation)
        if self._trial is not None:
            verdict = self._judge(sample)
            if verdict is not None:
                return verdict.with_(reason="power_backoff")
            return decision if self._trial is None else _no_raise(decision, current, "power_trial")
        if sample is not None:
            self._history.append(sample)
        if self._hold > 0:
            self._hold -= 1
            if _keeps_up_only_above(observation, current.max_batch_size):
                return decision
            return _no_raise(decision, current, "power_hold")
        binding = observation.fill_ratio >= 0.9  # False for NaN
        if (
            decision.max_batch_size > current.max_batch_size
            and binding
            and not _keeps_up_only_above(observation, current.max_batch_size)
        ):
            self._start_trial(current)
        return decision

    def _start_trial(self, before: Decision) -> None:
        values = list(self._history)
        if len(values) < 3:
            return
        mean = sum(values) / len(values)
        variance = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
        self._trial = (before, mean, variance, len(values))
        self._after = []

    def _judge(self, sample: float | None) -> Decision | None:
        """Collect a sample after the raise; the settings to return to, if the raise hurt."""
        assert self._trial is not None
        if sample is not None:
            self._after.append(sample)
        if len(self._after) < self.settle_ticks:
            return None
        before, mean, variance, count = self._trial
        after = sum(self._after) / len(self._after)
        self._trial = None
        self._history.clear()  # the settings changed: a new baseline
        standard_error = math.sqrt(variance / count + variance / len(self._after))
        fell = mean - after
        if fell > -math.log(1.0 - self.tolerance) and fell > self.z * standard_error:
            self._hold = self.hold_ticks
            return before
        return None


def _keeps_up_only_above(observation: Observation, cap: int) -> bool:
    """True when the plan says ``cap`` cannot keep up with the demand (overload, or a
    stability cap above it): a raise from it is then no trial of the operating point, and the
    fall of power that follows is the load's (the queue of a burst), not the raise's."""
    plan = observation.plan()
    if not plan.ready or math.isnan(observation.budget_ms):
        return False
    stable = plan.stable_cap(observation.budget_ms)
    return stable is None or stable > cap


def _log_power(observation: Observation) -> float | None:
    """log(throughput / arrivals / mean latency), or None when a figure is missing."""
    arrivals, power = observation.arrival_rate_rps, observation.power
    if not (arrivals > 0 and power > 0):
        return None
    return math.log(power / arrivals)


def _no_raise(decision: Decision, current: Decision, reason: str) -> Decision:
    """``decision`` with no knob above its value in ``current``."""
    if not _raises(decision, current):
        return decision
    return decision.with_(
        window_ms=min(decision.window_ms, current.window_ms),
        max_batch_size=min(decision.max_batch_size, current.max_batch_size),
        reason=reason,
    )


def _cut_at_most(observation: Observation, decision: Decision, max_cut: float) -> int:
    """``decision``'s cap, raised where it falls below ``max_cut`` of the cap in force (to that
    share, rounded up and clamped to the bounds)."""
    floor = math.ceil(observation.current.max_batch_size * max_cut)
    if decision.max_batch_size >= floor:
        return decision.max_batch_size
    cap = observation.bounds.clamp(decision.with_(max_batch_size=floor)).max_batch_size
    return max(cap, decision.max_batch_size)


class StepGuard(Guard):
    """Rate-limit cap cuts: a cap falls to no less than ``max_cut`` of itself per tick.

    One noisy tick must not take the cap from 32 to 2; a cap that really must fall gets there
    in a few ticks (halving each time). The window, planned for the cap cut to, is narrowed to
    the widest whose tail fits the window's budget at the cap kept (with an SLO and a ready
    plan): a window planned for batches of 128 is not one for batches of 256. Memory pressure
    and out-of-memory errors act outside this guard (:class:`MemoryGuard` wraps it) and cut at
    once.

    Args:
        max_cut: the least fraction of the cap in force a tick may leave, in (0, 1].
    """

    def __init__(self, inner: Policy, max_cut: float = STEP_MAX_CUT) -> None:
        super().__init__(inner)
        self.max_cut = max_cut

    def correct(self, observation: Observation, decision: Decision) -> Decision:
        cap = _cut_at_most(observation, decision, self.max_cut)
        if cap == decision.max_batch_size:
            return decision
        window = decision.window_ms
        plan = observation.plan()
        if observation.slo is not None and plan.ready:  # the window was planned for the cut
            window = min(window, plan.widest_window_ms(observation.window_budget_ms, cap))
        return decision.with_(max_batch_size=cap, window_ms=window, reason="step")


CAP_PROBE: Final = "cap_probe"
"""The reason :class:`~adaptive_batcher.control.cap_probe.CapProbeGuard` gives the cap it raises
for a probe; :class:`ShedGuard` keeps that cap (its deadlines follow it)."""


WINDOW_UNUSED: Final = "window_unused"
"""The reason :class:`~adaptive_batcher.control.unused_window.UnusedWindowGuard` gives the
window it holds: 0, or a share of a fixed set of clients' round trip."""


class StallGuard(Guard):
    """Narrow the window while the event loop stalls again and again.

    A lone stall is an outlier (the PID and the estimator leave it alone); stalls that recur
    are part of the load. Every request waiting in a window when the loop stalls misses with
    it, so each ms of window costs ``stall rate x arrival rate`` answers per second. The
    stalls spend part of the SLO's tail (``1 - percentile / 100``) themselves: whatever the
    batcher does, a request that arrives in the last ``stall - (room - batch)`` of a stall
    misses (the room: the SLO's latency less preprocessing; the batch: a batch of one's
    fitted time, which runs after the stall), a share ``rate x mean`` of that part. While the loop
    stalls at ``loop_stall_rate_hz`` (0 unless two or more stalls began in the last 30 s),
    the window is at most ``tail_share * (tail - that share) / loop_stall_rate_hz``: the
    requests it exposes spend at most ``tail_share`` of the tail the stalls leave (window 0
    once they leave none). The ceiling lifts as the rate decays. A window held for a fixed set
    of closed-loop clients (reason ``window_unused``) is left alone: a stall catches every
    request they have in flight, whatever the window. Source: docs/policies.md,
    "StallGuard".

    Args:
        tail_share: the share of the SLO's tail (``1 - percentile / 100``) the window may spend
            on stalls, in (0, 1].
    """

    def __init__(self, inner: Policy, tail_share: float = 0.5) -> None:
        super().__init__(inner)
        self.tail_share = tail_share

    def correct(self, observation: Observation, decision: Decision) -> Decision:
        rate = observation.loop_stall_rate_hz
        slo = observation.slo
        if rate <= 0.0 or slo is None or decision.reason == WINDOW_UNUSED:
            # (a window held for a fixed set of closed-loop clients: a stall catches all their
            # requests in flight, whatever the window)
            return decision
        tail = 1.0 - slo.percentile / 100.0
        left = max(0.0, tail - _stalls_miss_share(observation, slo))
        ceiling_ms = 1e3 * self.tail_share * left / rate
        if decision.window_ms <= ceiling_ms:
            return decision
        return decision.with_(window_ms=ceiling_ms, reason="stall.recurring")


def _stalls_miss_share(observation: Observation, slo: SLO) -> float:
    """The share of arrivals that the recent loop stalls send past ``slo`` by themselves:
    those arriving in the last ``stall - (room - batch)`` of each (the room: the SLO's latency
    less preprocessing; the batch: the fitted time of a batch of one, which runs after the
    stall), ``rate x mean`` of that part."""
    durations = observation.loop_stall_durations_s
    if not durations:
        return 0.0
    batch_ms = observation.service_median_ms(1)
    batch_ms = 0.0 if math.isnan(batch_ms) else batch_ms
    latency_s = (slo.room_ms - batch_ms) / 1e3
    late_s = sum(max(0.0, d - latency_s) for d in durations) / len(durations)
    return observation.loop_stall_rate_hz * late_s


SHED_SWITCH_GAIN: Final = 0.05
"""The least share more answers within the SLO for which :class:`ShedGuard` takes, under
overload, a cap whose batches do not keep up over one whose two batches fit the SLO: the
requests already queued keep the deadlines of the cap they arrived under, and a larger one's
full batches answer them late (docs/policies.md, "ShedGuard")."""


class ShedGuard(Guard):
    """SLO-aware shedding: fail at once the requests that can no longer meet the SLO.

    A request that has not started by ``latency_ms - preprocess_ms - s(n)`` after its arrival,
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
    its cut halves the cap in force a tick at most (``STEP_MAX_CUT``, as :class:`StepGuard`):
    the fit it follows is as noisy as the policy's input. It never exceeds the decision's
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
        self.smallest_units_seen = _smallest_seen(self.smallest_units_seen, observation)
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
            cap = min(decision.max_batch_size, _cut_at_most(observation, cut, STEP_MAX_CUT))
        if decision.reason == CAP_PROBE:  # the fit above the cap is what a probe measures
            cap = decision.max_batch_size
        cap = min(cap, decision.max_batch_size_ceiling or cap)  # memory's ceiling holds
        # error bars wider than the room (event-loop stalls on a saturated machine) leave the
        # typical batch's deadline; only if even that leaves no time is the SLO out of reach
        full = room - high_answer(cap)
        if full <= 0:
            full = room - typical_answer(cap)
        if full <= 0:  # the SLO is out of reach: answer late rather than not at all, but
            # under overload a queue left to grow makes every answer later without end: a
            # request not begun within one batch has a full batch ahead of it, and is failed
            late = typical(cap) if overload else None
            return decision.with_(max_batch_size=cap, shed_after_ms=late, shed_after_short_ms=late)
        realised = max(1, round(plan.batch_units(decision.window_ms, cap)))
        short = max(full, room - typical_answer(realised))
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


FREED_SHARE: Final = 0.5
"""The share of the memory in use at an out-of-memory error that must be free again before
:class:`MemoryGuard` forgets the size that failed ahead of ``forget_s`` (a squeeze by a
co-tenant that has ended)."""


class MemoryGuard(Guard):
    """Shrink the cap under GPU memory pressure and after out-of-memory errors.

    * Free memory below ``min_free_fraction`` of the total (from telemetry): the cap ceiling
      becomes ``shrink * cap``, once per episode of pressure, and again only when free memory
      has halved since (a co-tenant holding most of a large GPU leaves the free fraction low
      however small the batches: shrinking on every tick took the cap to 1 without an
      out-of-memory error; out-of-memory errors find the cap that fits).
    * Any out-of-memory error put down to its batch's size in the tick (the smallest batch that
      failed, ``Observation.oom_units``; the cap in force where unknown): the ceiling becomes
      half the cap, or 3/4 of that batch where that is less or where a larger size already
      failed (a bisection between the halves that ran, when the runtime re-ran the batch split
      in halves, so no request was lost, and the size that failed); that size is remembered as
      too big for ``forget_s``, or until telemetry shows at least ``FREED_SHARE`` of the memory
      then in use free again (a co-tenant's squeeze has ended). A batch larger than the cap in
      force was dispatched before the cap fell (on another slot): it is remembered, and cuts
      nothing.

    The ceiling holds for ``cooldown_s`` after the last pressure, then rises by ``recover`` per
    tick, at most halfway to a size remembered as too big and never to it, until it no longer
    binds; an error while it rises brings it back no lower than the highest ceiling that held a
    cooldown. Probing upward this way finds the largest cap that fits in a few steps instead of
    failing batch after batch. The ceiling travels with the decision
    (``Decision.max_batch_size_ceiling``): a guard that wraps this one (``ShedGuard``) never
    sets a cap above it.
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
        self._pressure_free: float | None = None  # the free fraction at the last shrink
        self._too_big_at = -math.inf
        self._too_big_free: float | None = None  # the free fraction when too_big failed
        self.fits: int | None = None  # the highest ceiling that held a cooldown, no error
        self._ceiling_at = -math.inf  # when the ceiling last changed

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
            self._recover(
                observation.bounds.max_batch_size, now, observation.telemetry.free_fraction
            )
        if self.ceiling is None:
            return decision
        ceiling = min(self.ceiling, decision.max_batch_size_ceiling or self.ceiling)
        if decision.max_batch_size > ceiling:
            decision = decision.with_(max_batch_size=ceiling, reason=reason or "memory_ceiling")
        return decision.with_(max_batch_size_ceiling=ceiling)

    def _update(self, observation: Observation) -> str:
        cap_now = observation.current.max_batch_size
        free = observation.telemetry.free_fraction
        if observation.oom_errors > 0:
            failed = observation.oom_units or cap_now  # the smallest batch that failed
            narrowing = self.too_big is not None and failed < self.too_big
            self.too_big = failed if self.too_big is None else min(self.too_big, failed)
            self._too_big_at, self._too_big_free = observation.now_s, free
            if failed > cap_now:  # dispatched before the cap fell (another slot's batch)
                return ""
            # halve the cap at a first error; bisect between the halves that ran and the
            # batch that failed when that is smaller, or below a size already known too big,
            # never below a ceiling that held a cooldown (unless that one failed now)
            bisected = (3 * failed) // 4
            ceiling = bisected if narrowing else min(cap_now // 2, bisected)
            self.fits = self.fits if self.fits is not None and self.fits < failed else None
            self.ceiling = max(1, ceiling, self.fits or 0)
            self._pressure_free = free  # this pressure is answered: no shrink for it too
        elif free is not None and free < self.min_free_fraction:
            falling = self._pressure_free is None or free < self._pressure_free / 2.0
            self._pressure_at = observation.now_s
            if not falling:  # the same pressure: shrinking again would not relieve it
                return ""
            self._pressure_free = free
            self.ceiling = max(1, int(cap_now * self.shrink))
            # less memory: what fitted may not fit now
            self.fits, self._ceiling_at = None, observation.now_s
            return "memory_pressure"
        else:
            self._pressure_free = None
            return ""
        self._pressure_at = self._ceiling_at = observation.now_s
        return "out_of_memory"

    def _recover(self, hard_cap: int, now: float, free: float | None) -> None:
        assert self.ceiling is not None
        if self.too_big is not None and (
            now - self._too_big_at >= self.forget_s or self._freed_since_too_big(free)
        ):
            self.too_big = None
        if now - self._ceiling_at >= self.cooldown_s:  # it held a cooldown without an error
            self.fits = max(self.fits or 0, self.ceiling)
        ceiling = math.ceil(self.ceiling * self.recover)
        if self.too_big is not None:  # probe halfway to the size known too big
            ceiling = min(ceiling, max(self.ceiling + 1, (self.ceiling + self.too_big) // 2))
            ceiling = min(ceiling, self.too_big - 1)
        if ceiling > self.ceiling:
            self.ceiling, self._ceiling_at = ceiling, now
        if self.ceiling >= hard_cap:
            self.ceiling = None

    def _freed_since_too_big(self, free: float | None) -> bool:
        """True when at least half the memory in use at the error that made ``too_big`` is
        free now (a co-tenant left: the size that failed may fit). Our own batches' memory
        stays held by the framework's allocator cache, so an error of our own size does not
        read as freed; without telemetry, never."""
        at_error = self._too_big_free
        if free is None or at_error is None:
            return False
        return free >= at_error + FREED_SHARE * (1.0 - at_error)


class BucketGuard(Guard):
    """Caps only among warmed batch sizes (a cold shape's first call is slow: the tuning
    guide, "Buckets and warm-up").

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

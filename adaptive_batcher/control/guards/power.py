"""``PowerGuard``: step back when a raise of the cap made Kleinrock's power fall."""

from __future__ import annotations

import math
from collections import deque

from adaptive_batcher.control.guards.base import Guard, no_raise
from adaptive_batcher.control.policy import Policy
from adaptive_batcher.control.types import Decision, Observation

__all__ = ["PowerGuard"]


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
            return decision if self._trial is None else no_raise(decision, current, "power_trial")
        if sample is not None:
            self._history.append(sample)
        if self._hold > 0:
            self._hold -= 1
            if _keeps_up_only_above(observation, current.max_batch_size):
                return decision
            return no_raise(decision, current, "power_hold")
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

"""PID on the SLO latency error, trimming a window planned from the batches that really form.

Each tick :class:`PID` asks the tick's :class:`~adaptive_batcher.control.plan.Plan` for the cap
(the largest whose two batches fit the SLO's room, never below the smallest that keeps up with
demand; under overload, the highest-throughput cap) and for the widest window whose predicted
tail latency fits the planning budget ``window_budget * (1 + u)`` (the SLO's budget, widened
by the room the measured tail shows: :class:`~adaptive_batcher.control.slack.TailSlack`).
``u`` in [-1, 0] is the output of a velocity-form PID on the normalised latency error
``(target - latency) / target``, with conditional integration (none while overloaded, nor for
``settle_s`` after an overload or a stall; stalls that hold it ``settle_s`` without a break
relax ``u`` toward 0) and derivative on the measurement. The law, its
reason tags and the figures behind it: docs/policies.md, "PID". Source: Åström & Hägglund,
"Advanced PID Control", 2006.
"""

from __future__ import annotations

import math
from typing import ClassVar

from adaptive_batcher._validate import check_int, check_number
from adaptive_batcher.control.types import Decision, Observation

__all__ = ["PID"]


class PID:
    """PID trim of a model-planned (window, cap) on the SLO latency error.

    Args:
        kp: proportional gain on the change of the normalised error, per tick.
        ki: integral gain: output change per tick per unit of normalised error.
        kd: derivative gain on the normalised measurement's second difference.
        min_samples: latency samples needed in the span before the PID integrates.
        max_window_ms: ceiling of the window, ms (default: the bounds' maximum).
        settle_s: after an overload, seconds without integration, and after a stall, seconds
            without narrowing (the latency span of the measurement, so the samples the overload
            or the stall made late have left it).

    Raises:
        TypeError: an argument of the wrong type (the message names it, as ``PID.kp``).
        ValueError: a negative gain, or ``min_samples`` < 1.
    """

    name = "pid"
    parameters: ClassVar[tuple[str, ...]] = (
        "kp",
        "ki",
        "kd",
        "min_samples",
        "max_window_ms",
        "settle_s",
    )

    def __init__(
        self,
        kp: float = 0.3,
        ki: float = 0.15,
        kd: float = 0.05,
        min_samples: int = 20,
        max_window_ms: float | None = None,
        settle_s: float = 2.0,
    ) -> None:
        self.kp = check_number("PID.kp", kp, 0.0)
        self.ki = check_number("PID.ki", ki, 0.0)
        self.kd = check_number("PID.kd", kd, 0.0)
        self.min_samples = check_int("PID.min_samples", min_samples, 1)
        self.max_window_ms = (
            None if max_window_ms is None else check_number("PID.max_window_ms", max_window_ms, 0)
        )
        self.settle_s = check_number("PID.settle_s", settle_s, 0.0)
        self.output = 0.0
        self._error: float | None = None
        self._measurements: list[float] = []
        self._overloaded_at = -math.inf
        self._held_since = math.inf  # since when stalls have held the overshoot without a break

    def reset(self, current: Decision) -> None:
        """Take over from ``current``: the plan is trusted again, derivative memory cleared."""
        del current
        self.output = 0.0
        self._error = None
        self._measurements = []
        self._held_since = math.inf

    def decide(self, observation: Observation) -> Decision:
        """The next (window, cap); the law: docs/policies.md, "PID"."""
        slo, plan = observation.slo, observation.plan()
        if slo is None or not plan.ready:
            return observation.current.with_(reason="pid.hold")
        budget = observation.budget_ms
        if plan.overloaded(budget):
            self._overloaded_at = observation.now_s
            cap = plan.cap(budget, observation.room_ms) or observation.current.max_batch_size
            return Decision(0.0, cap, "pid.overload")
        stalled = self._feedback(observation)
        slack = observation.window_budget_scale > 1.0
        cap = plan.cap(budget, observation.room_ms) or observation.current.max_batch_size
        priced = plan.prices_pauses(cap)
        if slack or priced:
            # the measured tail shows room, or pauses beyond the SLO's reach set it: the slack
            # or the window that answers the most, not a trim, is in force
            self.output = 0.0
        trimmed = observation.window_budget_ms * (1.0 + self.output)
        if plan.padded:  # a bucket that batches fill may beat a wider, padded one
            floor = min(plan.floor_cap(budget) or cap, cap)
            cap = plan.fitting_cap(budget, floor, plan.cheapest_cap(trimmed, floor, cap))
        window = plan.widest_window_ms(trimmed, cap)
        if self.max_window_ms is not None:
            window = min(window, self.max_window_ms)
        return Decision(window, cap, _reason(stalled, self.output, slack, priced))

    def _feedback(self, observation: Observation) -> bool:
        """Update ``u`` from the latency error (conditional integration, see the module);
        True when an overshoot was left alone because a stall set it."""
        latency = observation.latency_ms
        settling = observation.now_s - self._overloaded_at < self.settle_s
        if settling or observation.latency_samples < self.min_samples or math.isnan(latency):
            self._error = None
            self._held_since = math.inf  # a tick unread breaks a run of holds as one read does
            return False
        target = observation.target_ms
        error = max(-2.0, min(1.0, (target - latency) / target))
        if error < 0 and observation.stall_set_latency(self.settle_s):
            # the overshoot follows a stall (of the loop, or a batch far beyond the error
            # bars) still in the measurement: the queue behind it, not the window, set it
            self._error = None
            self._relax_while_held(observation.now_s)
            return True
        self._held_since = math.inf
        self._measurements = [*self._measurements[-2:], latency]
        self.output = max(-1.0, min(0.0, self.output + self._step(error, target)))
        self._error = error
        return False

    def _relax_while_held(self, now_s: float) -> None:
        """Stalls that recur blind the feedback for good: once they have held it for
        ``settle_s`` without a break, the trim decays toward the plan by ``ki`` a tick (a
        trim made before the stalls were known would otherwise hold a narrow window whose
        emptier batches meet more of them)."""
        self._held_since = min(self._held_since, now_s)
        if now_s - self._held_since >= self.settle_s:
            self.output *= 1.0 - min(self.ki, 1.0)

    def _step(self, error: float, target_ms: float) -> float:
        previous = self._error if self._error is not None else error
        change = self.kp * (error - previous) + self.ki * error
        if len(self._measurements) == 3:  # velocity-form derivative on the raw measurement
            oldest, older, newest = self._measurements
            change -= self.kd * (newest - 2.0 * older + oldest) / target_ms
        return change


def _reason(stalled: bool, output: float, slack: bool, priced: bool = False) -> str:
    """``pid.pauses`` where the plan prices pauses beyond the SLO's reach (the window that
    answers the most), else ``pid.stall`` while a stall holds the window, ``pid.trim``
    (narrowed by the feedback), ``pid.slack`` (the plan, to a budget widened by the measured
    tail's room) or ``pid.plan`` (the plan trusted)."""
    if priced:
        return "pid.pauses"
    if stalled:
        return "pid.stall"
    if output != 0.0:
        return "pid.trim"
    return "pid.slack" if slack else "pid.plan"

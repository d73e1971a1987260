"""PID on the latency error against the SLO, driving window and cap in split range.

The measurement is the end-to-end latency at the SLO's percentile over the last ~2 s; the
setpoint is the SLO's target (``margin * p99_ms``). Both are divided by the target, so the error
``e = (target - latency) / target`` is dimensionless and the same gains serve a 4 ms model and a
400 ms one (no per-model tuning).

One output ``u`` in [-1, 1] drives two actuators in sequence ("split-range control", a standard
process-control arrangement):

* ``u`` in [0, 1]: there is slack; the cap is the largest whose predicted latency
  (``2 * service(cap)``) fits the budget, and the window is ``u * W`` with ``W`` what the cap
  leaves of the budget (``budget - 2 * service(cap)``, at most the bounds' maximum window). The
  cap is chosen first: a window must never starve the cap (a burst arriving to a small cap and a
  long window queues for a whole control tick).
* ``u`` in [-1, 0): latency is over target even with no window; the window is 0 and the cap's
  latency budget shrinks to ``(1 + 0.9 * u) * budget``, so batches get shorter.

In both ranges the cap never drops below the smallest cap that keeps up with the arrivals and
the backlog, and under overload it is the highest-throughput cap (see
:func:`adaptive_batcher.control.capacity.choose_cap`): a smaller cap would only grow the queue.

PID practice (Åström & Hägglund, "Advanced PID Control", 2006): velocity (incremental) form, so
clamping the output is the anti-windup and a switch-over is bumpless (``reset`` derives ``u`` from
the settings in force); derivative on the measurement, not the error, so setpoint changes (a new
SLO) cause no derivative kick.
"""

from __future__ import annotations

import math
from typing import ClassVar

from adaptive_batcher._validate import check_int, check_number
from adaptive_batcher.control.capacity import choose_cap
from adaptive_batcher.control.types import Decision, Observation

__all__ = ["PID"]


class PID:
    """PID control of (window, cap) on the SLO latency error.

    Args:
        kp: proportional gain on the change of the normalised error, per tick.
        ki: integral gain: output change per tick per unit of normalised error.
        kd: derivative gain on the normalised measurement's second difference.
        min_samples: latency samples needed in the span before the PID acts (else it holds).
        max_window_ms: ceiling of the window range; default: the bounds' maximum.

    Raises:
        TypeError: an argument of the wrong type (the message names it, as ``PID.kp``).
        ValueError: a negative gain, or ``min_samples`` < 1.
    """

    name = "pid"
    parameters: ClassVar[tuple[str, ...]] = ("kp", "ki", "kd", "min_samples", "max_window_ms")

    def __init__(
        self,
        kp: float = 0.3,
        ki: float = 0.15,
        kd: float = 0.05,
        min_samples: int = 20,
        max_window_ms: float | None = None,
    ) -> None:
        self.kp = check_number("PID.kp", kp, 0.0)
        self.ki = check_number("PID.ki", ki, 0.0)
        self.kd = check_number("PID.kd", kd, 0.0)
        self.min_samples = check_int("PID.min_samples", min_samples, 1)
        self.max_window_ms = (
            None if max_window_ms is None else check_number("PID.max_window_ms", max_window_ms, 0)
        )
        self.output = 0.0
        self._error: float | None = None
        self._measurements: list[float] = []
        self._current: Decision | None = None

    def reset(self, current: Decision) -> None:
        """Continue from ``current``: ``u`` is set from its window; derivative memory cleared."""
        self._current = current
        self._error = None
        self._measurements = []

    def decide(self, observation: Observation) -> Decision:
        if self._current is None:
            self.reset(observation.current)
        slo = observation.slo
        latency = observation.latency_ms
        if slo is None or observation.latency_samples < self.min_samples or math.isnan(latency):
            return observation.current.with_(reason="pid.hold")
        span = self._window_range_ms(observation)
        if self._error is None and span > 0:  # bumpless: start from the window in force
            self.output = min(1.0, observation.current.window_ms / span)
        target = slo.target_ms
        error = max(-2.0, min(1.0, (target - latency) / target))
        self._measurements = [*self._measurements[-2:], latency]
        self.output = max(-1.0, min(1.0, self.output + self._step(error, target)))
        self._error = error
        return self._actuate(observation, span)

    def _step(self, error: float, target_ms: float) -> float:
        previous = self._error if self._error is not None else error
        change = self.kp * (error - previous) + self.ki * error
        if len(self._measurements) == 3:  # velocity-form derivative on the raw measurement
            oldest, older, newest = self._measurements
            change -= self.kd * (newest - 2.0 * older + oldest) / target_ms
        return change

    def _window_range_ms(self, observation: Observation) -> float:
        """What the window may use: the budget left by two batches at the full-budget cap,
        within the bounds (and ``max_window_ms``)."""
        ceiling = observation.bounds.max_window_ms
        if self.max_window_ms is not None:
            ceiling = min(ceiling, self.max_window_ms)
        budget = observation.budget_ms
        if math.isnan(budget):
            return ceiling
        cap = choose_cap(observation, budget, 0.0)
        room = budget if cap is None else budget - 2.0 * observation.service_ms(cap)
        return max(0.0, min(ceiling, room))

    def _actuate(self, observation: Observation, window_range_ms: float) -> Decision:
        u = self.output
        budget = observation.budget_ms * (1.0 if u >= 0 else 1.0 + 0.9 * u)
        cap = choose_cap(observation, budget, 0.0)  # the cap first: a window never starves it
        if cap is None:  # the service model is not ready yet
            cap = observation.current.max_batch_size
        window = u * window_range_ms if u > 0 else 0.0
        reason = "pid.slack" if u > 0 else ("pid.tighten" if u < 0 else "pid.neutral")
        return Decision(window, cap, reason)

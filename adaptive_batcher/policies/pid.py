"""PID on the SLO latency error, trimming a window planned from the batches that really form.

The objective is the seed's trade: meet the SLO at the least device cost. Fuller batches cost
less device time per request, and the window is what fills them, so the window should spend the
latency budget the SLO leaves, and no more. Each tick the policy asks the tick's
:class:`~adaptive_batcher.control.plan.Plan` (arrival rate, service-time fit with its error
bars) for:

* the cap: the largest whose two-batch latency fits the SLO's room (headroom for bursts), never
  below the smallest that keeps up with demand; under overload, the highest-throughput cap;
* the window: the widest whose predicted tail latency (the realised batch, not the cap's worst
  case) fits a *planning budget*.

The feedback part is a PID on the latency error: the measurement is the end-to-end latency at
the SLO's percentile over the recent span, the setpoint the SLO's ``target_ms``; the error
``e = (target - latency) / target`` is dimensionless, so the same gains serve a 4 ms model and a
400 ms one. Its output ``u`` in [-1, 0] scales the planning budget, ``budget * (1 + u)``: at 0
the plan is trusted; when latency overshoots the target anyway (the model is optimistic: noise,
stalls, a busy machine) ``u`` falls and the window narrows, down to 0 at ``u = -1``. The cap is
never the actuator: a smaller cap only lowers throughput, and a burst would queue.

PID practice (Åström & Hägglund, "Advanced PID Control", 2006): velocity (incremental) form, so
clamping the output is the anti-windup; conditional integration (no integration while the
batcher is overloaded, when the window is not what sets the latency, nor for ``settle_s``
after an overload, while the latency measure still holds it), which makes recovery after
overload immediate (the integrator state from before the overload is kept); likewise no
narrowing for ``settle_s`` after a stall (a batch the service-time estimator held out as an
isolated outlier): the queue behind it, not the window, made that latency (unless outliers
scale with the batch, ``outlier_elasticity >= 0.5``: then smaller batches shorten them);
derivative on the measurement, not the error, so an SLO change causes no derivative kick.
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

    def reset(self, current: Decision) -> None:
        """Take over from ``current``: the plan is trusted again, derivative memory cleared."""
        del current
        self.output = 0.0
        self._error = None
        self._measurements = []

    def decide(self, observation: Observation) -> Decision:
        """The next (window, cap); see the module docstring for the law."""
        slo, plan = observation.slo, observation.plan()
        if slo is None or not plan.ready:
            return observation.current.with_(reason="pid.hold")
        budget = observation.budget_ms
        if plan.overloaded(budget):
            self._overloaded_at = observation.now_s
            cap = plan.cap(budget, observation.room_ms) or observation.current.max_batch_size
            return Decision(0.0, cap, "pid.overload")
        stalled = self._feedback(observation)
        cap = plan.cap(budget, observation.room_ms) or observation.current.max_batch_size
        window = plan.widest_window_ms(budget * (1.0 + self.output), cap)
        if self.max_window_ms is not None:
            window = min(window, self.max_window_ms)
        return Decision(window, cap, _reason(stalled, self.output))

    def _feedback(self, observation: Observation) -> bool:
        """Update ``u`` from the latency error (conditional integration, see the module);
        True when an overshoot was left alone because a stall set it."""
        latency = observation.latency_ms
        settling = observation.now_s - self._overloaded_at < self.settle_s
        if settling or observation.latency_samples < self.min_samples or math.isnan(latency):
            self._error = None
            return False
        target = observation.target_ms
        error = max(-2.0, min(1.0, (target - latency) / target))
        if error < 0 and _stall_set_latency(observation, self.settle_s):
            # the overshoot follows a stall (of the loop, or a batch far beyond the error
            # bars) still in the measurement: the queue behind it, not the window, set it
            self._error = None
            return True
        self._measurements = [*self._measurements[-2:], latency]
        self.output = max(-1.0, min(0.0, self.output + self._step(error, target)))
        self._error = error
        return False

    def _step(self, error: float, target_ms: float) -> float:
        previous = self._error if self._error is not None else error
        change = self.kp * (error - previous) + self.ki * error
        if len(self._measurements) == 3:  # velocity-form derivative on the raw measurement
            oldest, older, newest = self._measurements
            change -= self.kd * (newest - 2.0 * older + oldest) / target_ms
        return change


def _reason(stalled: bool, output: float) -> str:
    """``pid.stall`` while a stall holds the window, else ``pid.plan`` (the plan trusted) or
    ``pid.trim`` (narrowed by the feedback)."""
    if stalled:
        return "pid.stall"
    return "pid.plan" if output == 0.0 else "pid.trim"


def _stall_set_latency(observation: Observation, settle_s: float) -> bool:
    """True when the event loop stalled within ``settle_s``, or when an outlier batch ended
    within it and outliers do not scale with
    the batch (``outlier_elasticity`` below 0.5, or unknown): narrowing the window would then
    only add batches, each risking a stall, where outliers that scale with the batch's work
    (10x spikes on resnet50 at 45 % load: batches of 150-500 ran 110-310 ms) are shortened by
    a narrower window's smaller batches."""
    if observation.now_s - observation.loop_stall_s < settle_s:
        return True  # the loop stood still: its latency is no sign of the window's
    recent = observation.now_s - observation.last_stall_s < settle_s
    return recent and not observation.outlier_elasticity >= 0.5

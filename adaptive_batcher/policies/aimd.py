"""AIMD on the batch cap: the control law of Clipper (Crankshaw et al., NSDI 2017).

Clipper raises the batch size by a fixed amount while the latency of a batch stays under the
objective and cuts it by 10 % when it goes over. As in Clipper, the measured quantity is the
batch's own processing time: the fitted service time of a batch at the cap in force
(``observation.service_median_ms(cap)``, medians of measured batches), compared with the SLO's
``latency_ms``. Queueing is not seen, exactly as in Clipper; that is its known weakness under
overload, and why it is a baseline here. Before the service-time estimator has data, the
end-to-end latency at the SLO percentile is compared with the target instead.
"""

from __future__ import annotations

import math
from typing import ClassVar

from adaptive_batcher._validate import check_int, check_number, check_optional_int
from adaptive_batcher.control.types import Decision, Observation

__all__ = ["AIMD"]


class AIMD:
    """Additive increase, multiplicative decrease of the batch cap; the window is left alone.

    Each tick, with an SLO and latency samples:

    - batch latency over the SLO (``service_median_ms(cap) > slo.latency_ms``; before the
      service-time estimator has data, ``latency_ms > target_ms``): ``cap = floor(cap *
      backoff)``, at least one unit lower ("aimd.decrease");
    - otherwise, if batches filled (``fill_ratio >= fill_threshold``): ``cap += step``
      ("aimd.increase"); raising a cap that is never reached teaches nothing;
    - otherwise, and without an SLO, latency samples or batches: the cap is held ("aimd.hold").

    The result is clamped into ``observation.bounds``. With buckets (``bounds.batch_sizes``) the
    additive steps accumulate in the policy until they reach the next bucket (the cap in force is
    the largest bucket at most the accumulated cap), so a step smaller than the gap between
    buckets still climbs; a decrease starts from the cap in force and lands on the bucket at most
    ``floor(cap * backoff)``. When the cap in force is not the one this policy last chose (a guard
    or another policy changed it), the policy continues from the cap in force.

    Args:
        step: additive increase, size units per tick (int >= 1); the paper gives no value, 1 is
            the +1 of Netflix concurrency-limits' AIMDLimit.
        backoff: multiplicative decrease factor, in (0, 1); 0.9 (a 10 % cut) as in Clipper.
        fill_threshold: the ``fill_ratio`` at or above which batches count as full, in [0, 1].
        window_ms: a fixed window, ms (>= 0); None keeps the window in force.
        start_batch_size: the cap to start from when the policy first takes over, units
            (int >= 1; None: the cap in force). Clipper starts small and climbs.

    Raises:
        TypeError: ``step`` not an int, or a number argument not a number.
        ValueError: an argument out of range; the message names it (``AIMD.step``, ...).
    """

    name = "aimd"
    parameters: ClassVar[tuple[str, ...]] = (
        "step",
        "backoff",
        "fill_threshold",
        "window_ms",
        "start_batch_size",
    )

    def __init__(
        self,
        step: int = 1,
        backoff: float = 0.9,
        fill_threshold: float = 0.8,
        window_ms: float | None = None,
        start_batch_size: int | None = None,
    ) -> None:
        self.step = check_int("AIMD.step", step, 1)
        self.backoff = check_number("AIMD.backoff", backoff, 0.0, strict=True)
        if not self.backoff < 1.0:
            raise ValueError(f"AIMD.backoff must be in (0, 1), got {backoff!r}")
        self.fill_threshold = check_number("AIMD.fill_threshold", fill_threshold, 0.0)
        if not self.fill_threshold <= 1.0:
            raise ValueError(f"AIMD.fill_threshold must be in [0, 1], got {fill_threshold!r}")
        self.window_ms = None if window_ms is None else check_number("AIMD.window_ms", window_ms, 0)
        self.start_batch_size = check_optional_int("AIMD.start_batch_size", start_batch_size, 1)
        self._cap: int | None = None  # accumulated cap, units (above the bucket in force)
        self._last_cap: int | None = None  # the cap this policy last chose

    def reset(self, current: Decision) -> None:
        """Continue from ``current`` (bumpless transfer); the first time, from
        ``start_batch_size`` if given."""
        if self._cap is None and self.start_batch_size is not None:
            self._cap = self.start_batch_size
            self._last_cap = None  # nothing chosen yet: the cap in force is not compared
        else:
            self._cap = self._last_cap = current.max_batch_size

    @staticmethod
    def _measure(observation: Observation) -> tuple[float, float]:
        """(batch latency, its limit), ms: Clipper's batch time vs the SLO when known."""
        batch_ms = observation.service_median_ms(observation.current.max_batch_size)
        if observation.slo is not None and not math.isnan(batch_ms):
            return batch_ms, observation.slo.latency_ms
        if observation.latency_samples == 0:
            return math.nan, math.nan
        return observation.latency_ms, observation.target_ms

    def decide(self, observation: Observation) -> Decision:
        """The next (window, cap); see the class docstring for the rule."""
        current, bounds = observation.current, observation.bounds
        if self._cap is None or self._last_cap not in (None, current.max_batch_size):
            self.reset(current)
        assert self._cap is not None
        latency_ms, limit_ms = self._measure(observation)
        if observation.slo is None or math.isnan(latency_ms):
            reason = "aimd.hold"
        elif latency_ms > limit_ms:
            cut = math.floor(current.max_batch_size * self.backoff + 1e-9)
            self._cap = min(cut, current.max_batch_size - 1)
            reason = "aimd.decrease"
        elif observation.fill_ratio >= self.fill_threshold:  # False for NaN (no batches)
            self._cap += self.step
            reason = "aimd.increase"
        else:
            reason = "aimd.hold"
        self._cap = min(max(self._cap, bounds.min_batch_size), bounds.max_batch_size)
        window_ms = current.window_ms if self.window_ms is None else self.window_ms
        decision = bounds.clamp(Decision(window_ms, self._cap, reason))
        self._last_cap = decision.max_batch_size
        return decision

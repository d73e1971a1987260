"""The slack the measured tail shows in the plan's bound: how far the window's planning budget
may exceed the SLO's budget.

The plan charges each request with several tails at once (the whole window, and the service
time of a batch well above the mean size; docs/policies.md, "The plan"), so at the window it
picks, the latency measured at the SLO's percentile often sits below the target: the margin
applied twice. :class:`TailSlack` turns the measured room into a scale on the budget the window
is planned to (``Observation.window_budget_ms``), so that the measured tail, not the bound,
meets the target. The law and its figures: docs/policies.md, "Measured slack".
"""

from __future__ import annotations

import math

from adaptive_batcher._validate import check_number
from adaptive_batcher.control.types import Observation

__all__ = ["DEFAULT_MAX_SCALE", "TailSlack"]

DEFAULT_MAX_SCALE = 1.25
"""The widest window budget the measured tail may earn, over the SLO's budget."""

TRIM_SUFFIX = ".trim"
"""How the reason of a window a policy's feedback narrowed below its plan ends (``pid.trim``)."""


class TailSlack:
    """The window's planning budget over the SLO's budget (>= 1), from the measured tail.

    Each tick, with ``y`` the latency at the SLO's percentile ``q`` over the recent span and
    ``r`` the target (``margin * latency_ms``):

    * ``y > r``: ``scale = max(1, scale * r / y)`` (back at once, in proportion);
    * ``y < r`` with at least ``rise_samples / (1 - q)`` samples behind ``y`` (so that
      ``rise_samples`` requests lie above the percentile):
      ``scale = min(max_scale, scale * (1 + gain * (r - y) / r))``;
    * otherwise held: too few samples, no SLO, for ``settle_s`` after a stall of the loop or
      of the model (:meth:`~adaptive_batcher.control.types.Observation.stall_set_latency`),
      whose latency is the queue behind it, not the window's, or while the window in force is
      a feedback trim (its reason ends in ``.trim``): room under the target there measures the
      trim, not slack in the plan.

    After a :meth:`reset` (a new SLO) it does not rise for ``settle_s`` from its next tick: the
    span then holds latencies of settings planned for the old SLO, no measure of the window
    planned now. (Holding it after the first tick as well was measured and not kept:
    docs/benchmarks.md, "Measured slack".)

    Args:
        max_scale: the largest scale, >= 1 (1: the plan's bound alone, as before).
        gain: the share of the relative room taken per tick, > 0.
        rise_samples: requests above the percentile before the scale may rise, > 0.
        settle_s: how long after a stall the scale is held, and after a :meth:`reset` it may
            not rise, seconds (>= 0; the latency span's length).

    Raises:
        TypeError, ValueError: an argument of the wrong type or out of range (named).
    """

    def __init__(
        self,
        max_scale: float = DEFAULT_MAX_SCALE,
        gain: float = 0.15,
        rise_samples: float = 5.0,
        settle_s: float = 2.0,
    ) -> None:
        self.max_scale = check_number("TailSlack.max_scale", max_scale, 1.0)
        self.gain = check_number("TailSlack.gain", gain, 0.0, strict=True)
        self.rise_samples = check_number("TailSlack.rise_samples", rise_samples, 0.0, strict=True)
        self.settle_s = check_number("TailSlack.settle_s", settle_s, 0.0)
        self.scale = 1.0
        self._reset_pending = False  # a reset whose first tick has not come yet
        self._reset_at_s = -math.inf  # that tick's time, seconds

    def reset(self) -> None:
        """Back to 1, and no rise for ``settle_s`` from the next tick (a new SLO)."""
        self.scale = 1.0
        self._reset_pending = True

    def update(self, observation: Observation) -> float:
        """The scale after this tick's measurement (see the class)."""
        if self._reset_pending:
            self._reset_at_s, self._reset_pending = observation.now_s, False
        slo, latency = observation.slo, observation.latency_ms
        if slo is None or math.isnan(latency) or observation.stall_set_latency(self.settle_s):
            return self.scale
        target = observation.target_ms
        settled = observation.now_s - self._reset_at_s >= self.settle_s
        if latency > target:
            self.scale = max(1.0, self.scale * target / latency)
        elif (
            settled
            and not _trimmed(observation)
            and observation.latency_samples >= self.rise_samples / (1.0 - slo.quantile)
        ):
            room = (target - latency) / target
            self.scale = min(self.max_scale, self.scale * (1.0 + self.gain * room))
        return self.scale


def _trimmed(observation: Observation) -> bool:
    """Whether the window in force is a feedback trim below the plan (docs/policies.md,
    "Measured slack")."""
    return observation.current.reason.endswith(TRIM_SUFFIX)

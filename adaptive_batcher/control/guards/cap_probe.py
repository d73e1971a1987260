"""The cap probe: no cut of the cap is permanent while the batches above it go unmeasured.

The service-time fit learns a size only from batches of that size. Once the cap is below a size,
batches of it no longer run, so a fit that went wrong there (one slow batch pooled with a few
others, a cold start's spikes) stays wrong, and the plan keeps the cap where the wrong fit put
it. :class:`CapProbeGuard` raises the cap to the next candidate for a few ticks while the cap
binds with a backlog behind it; those batches measure the size again, and the plan decides from
there. Probes back off while the plan goes back below them. Why and the figures:
docs/policies.md, "CapProbeGuard".
"""

from __future__ import annotations

import math
from typing import Final

from adaptive_batcher._validate import check_int, check_number
from adaptive_batcher.control.guards.base import CAP_PROBE, Guard
from adaptive_batcher.control.policy import Policy
from adaptive_batcher.control.types import Decision, Observation

__all__ = ["BINDING_FILL", "CAP_PROBE", "CapProbeGuard"]

BINDING_FILL: Final = 0.9
"""The tick's mean batch over the cap at or above which the cap binds."""


class CapProbeGuard(Guard):
    """Raise a cap that has bound with a backlog for a while to the next candidate, briefly.

    A probe starts when, for ``after_s`` without a break, the batches fill the cap in force
    (``fill_ratio >= BINDING_FILL``) while more than a full batch waits and that backlog has not
    shrunk (the cap does not keep up), the decision keeps that cap, the next candidate above it
    is allowed (the bounds, the decision's memory ceiling), its batch, by the fit, fits the
    SLO's room on its own (the tail risk a probe may take), the fit gives it fewer items a
    second than the cap in force, and its figure rests on fewer than ``min_samples`` batches of
    its size (a figure measured that often is the device's; a probe would only pay for it). It
    holds the next candidate for ``probe_ticks`` ticks (reason ``cap_probe``), then gives the
    decision back to the policy. Probes are ``every_s`` apart: ``first_every_s`` at first and
    after a probe whose cap the policy then keeps, doubled up to ``max_every_s`` after each it
    does not.

    Args:
        inner: the policy (or guard) whose decisions this guard corrects.
        after_s: how long the cap must bind with a backlog before a probe, s (> 0).
        probe_ticks: ticks a probe lasts (>= 1).
        min_samples: batches of the next candidate's size behind the fit from which its figure
            counts as measured, and no probe goes there (>= 1).
        first_every_s: the least time between the starts of two probes, s (> 0).
        max_every_s: the most it backs off to, s (>= ``first_every_s``).

    Raises:
        TypeError, ValueError: an argument of the wrong type or out of range (named).
    """

    def __init__(
        self,
        inner: Policy,
        after_s: float = 1.0,
        probe_ticks: int = 2,
        min_samples: int = 8,
        first_every_s: float = 5.0,
        max_every_s: float = 60.0,
    ) -> None:
        super().__init__(inner)
        self.after_s = check_number("CapProbeGuard.after_s", after_s, 0.0, strict=True)
        self.probe_ticks = check_int("CapProbeGuard.probe_ticks", probe_ticks, 1)
        self.min_samples = check_int("CapProbeGuard.min_samples", min_samples, 1)
        self.first_every_s = check_number(
            "CapProbeGuard.first_every_s", first_every_s, 0.0, strict=True
        )
        self.max_every_s = check_number(
            "CapProbeGuard.max_every_s", max_every_s, self.first_every_s
        )
        self.probes = 0
        """Probes started so far."""
        self.kept = 0
        """Probes whose cap (or a larger one) the policy chose right after."""
        self._every_s = self.first_every_s
        self._last_start_s = -math.inf
        self._binding_since_s = math.inf  # since when the cap binds with a backlog
        self._backlog_then = 0  # the backlog then, units
        self._probe: tuple[int, int] | None = None  # (probed cap, the cap it displaced)
        self._ticks_left = 0

    def reset(self, current: Decision) -> None:
        self._probe, self._ticks_left = None, 0
        self._binding_since_s = math.inf
        super().reset(current)

    def chosen(self, in_force: Decision) -> Decision:
        if self._probe is not None and in_force.reason == CAP_PROBE:
            return super().chosen(in_force.with_(max_batch_size=self._probe[1]))
        return super().chosen(in_force)

    def correct(self, observation: Observation, decision: Decision) -> Decision:
        self._note_binding(observation)
        if self._probe is not None:
            return self._continue(observation, decision)
        probe = self._probe_cap(observation, decision)
        if probe is None:
            return decision
        self._probe, self._ticks_left = (probe, decision.max_batch_size), self.probe_ticks - 1
        self._last_start_s = observation.now_s
        self.probes += 1
        return decision.with_(max_batch_size=probe, reason=CAP_PROBE)

    def _continue(self, observation: Observation, decision: Decision) -> Decision:
        """A tick while a probe is in force: hold it, or end it and back off unless kept."""
        assert self._probe is not None
        probe, _ = self._probe
        if self._ticks_left > 0 and observation.slo is not None:
            self._ticks_left -= 1
            if decision.max_batch_size < probe:
                return decision.with_(max_batch_size=probe, reason=CAP_PROBE)
            return decision
        kept = decision.max_batch_size >= probe
        self.kept += kept
        self._every_s = self.first_every_s if kept else min(self.max_every_s, 2 * self._every_s)
        self._probe, self._binding_since_s = None, math.inf
        return decision

    def _note_binding(self, observation: Observation) -> None:
        """Track since when the cap in force has bound with more than a batch waiting, and the
        backlog then."""
        cap = observation.current.max_batch_size
        binding = observation.fill_ratio >= BINDING_FILL and observation.queued_units > cap
        if not binding:  # also False for NaN: no batch finished in the tick
            self._binding_since_s = math.inf
        elif self._binding_since_s == math.inf:
            self._binding_since_s = observation.now_s
            self._backlog_then = observation.queued_units

    def _probe_cap(self, observation: Observation, decision: Decision) -> int | None:
        """The next candidate above a cap that has bound long enough, if a probe is due and
        allowed, else None."""
        cap, now = observation.current.max_batch_size, observation.now_s
        if (
            observation.slo is None
            or decision.max_batch_size != cap  # the policy moves the cap itself
            or now - self._binding_since_s < self.after_s
            or observation.queued_units < self._backlog_then  # the cap drains the backlog
            or now - self._last_start_s < self._every_s
        ):
            return None
        above = [c for c in observation.bounds.cap_candidates() if c > cap]
        ceiling = decision.max_batch_size_ceiling
        if not above or (ceiling is not None and above[0] > ceiling):
            return None
        plan, larger, measured = observation.plan(), above[0], observation.service_samples_at
        if (
            not plan.ready
            or (measured is not None and measured(larger) >= self.min_samples)
            or plan.service_median_ms(larger) > observation.room_ms  # the tail risk
            or plan.throughput_units_per_s(larger) >= plan.throughput_units_per_s(cap)
        ):
            return None
        return larger

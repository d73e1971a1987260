"""The guards' base class, the reasons they share and the helpers of more than one guard."""

from __future__ import annotations

import math
from typing import Final

from adaptive_batcher.control.policy import Policy
from adaptive_batcher.control.types import Decision, Observation

__all__ = ["Guard"]


STEP_MAX_CUT: Final = 0.5
"""The least share of the cap in force that one tick's cut may leave, where the cut follows the
service-time fit (:class:`~adaptive_batcher.control.guards.step.StepGuard`, and
:class:`~adaptive_batcher.control.guards.shed.ShedGuard` away from overload)."""


CAP_PROBE: Final = "cap_probe"
"""The reason :class:`~adaptive_batcher.control.guards.cap_probe.CapProbeGuard` gives the cap it
raises for a probe; :class:`~adaptive_batcher.control.guards.shed.ShedGuard` keeps that cap (its
deadlines follow it)."""


WINDOW_UNUSED: Final = "window_unused"
"""The reason :class:`~adaptive_batcher.control.guards.unused_window.UnusedWindowGuard` gives the
window it holds: 0, or a share of a fixed set of clients' round trip."""


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


def smallest_seen(smallest: float, observation: Observation) -> float:
    """``smallest`` (units; inf: no batch yet) lowered to the tick's mean batch in units: the
    tick's smallest batch was at most that."""
    if observation.batches > 0:
        mean_units = observation.fill_ratio * observation.current.max_batch_size
        if mean_units >= 1.0:  # False for NaN
            floor = math.floor(mean_units + 1e-9)  # a mean of whole units, in floats
            return min(smallest, floor)
    return smallest


def no_raise(decision: Decision, current: Decision, reason: str) -> Decision:
    """``decision`` with no knob above its value in ``current``."""
    if not raises(decision, current):
        return decision
    return decision.with_(
        window_ms=min(decision.window_ms, current.window_ms),
        max_batch_size=min(decision.max_batch_size, current.max_batch_size),
        reason=reason,
    )


def cut_at_most(observation: Observation, decision: Decision, max_cut: float) -> int:
    """``decision``'s cap, raised where it falls below ``max_cut`` of the cap in force (to that
    share, rounded up and clamped to the bounds)."""
    floor = math.ceil(observation.current.max_batch_size * max_cut)
    if decision.max_batch_size >= floor:
        return decision.max_batch_size
    cap = observation.bounds.clamp(decision.with_(max_batch_size=floor)).max_batch_size
    return max(cap, decision.max_batch_size)


def raises(decision: Decision, current: Decision) -> bool:
    """Whether ``decision`` sets a knob above its value in ``current``."""
    return (
        decision.window_ms > current.window_ms or decision.max_batch_size > current.max_batch_size
    )

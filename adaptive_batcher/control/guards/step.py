"""``StepGuard``: a cap falls to no less than a share of itself per tick."""

from __future__ import annotations

from adaptive_batcher.control.guards.base import STEP_MAX_CUT, Guard, cut_at_most
from adaptive_batcher.control.policy import Policy
from adaptive_batcher.control.types import Decision, Observation

__all__ = ["StepGuard"]


class StepGuard(Guard):
    """Rate-limit cap cuts: a cap falls to no less than ``max_cut`` of itself per tick.

    One noisy tick must not take the cap from 32 to 2; a cap that really must fall gets there
    in a few ticks (halving each time). The window, planned for the cap cut to, is narrowed to
    the widest whose tail fits the window's budget at the cap kept (with an SLO and a ready
    plan): a window planned for batches of 128 is not one for batches of 256. Memory pressure
    and out-of-memory errors act outside this guard
    (:class:`~adaptive_batcher.control.guards.memory.MemoryGuard` wraps it) and cut at once.

    Args:
        max_cut: the least fraction of the cap in force a tick may leave, in (0, 1].
    """

    def __init__(self, inner: Policy, max_cut: float = STEP_MAX_CUT) -> None:
        super().__init__(inner)
        self.max_cut = max_cut

    def correct(self, observation: Observation, decision: Decision) -> Decision:
        cap = cut_at_most(observation, decision, self.max_cut)
        if cap == decision.max_batch_size:
            return decision
        window = decision.window_ms
        plan = observation.plan()
        if observation.slo is not None and plan.ready:  # the window was planned for the cut
            window = min(window, plan.widest_window_ms(observation.window_budget_ms, cap))
        return decision.with_(max_batch_size=cap, window_ms=window, reason="step")

"""``BucketGuard``: caps only among warmed batch sizes."""

from __future__ import annotations

from collections.abc import Callable

from adaptive_batcher.control.guards.base import Guard
from adaptive_batcher.control.policy import Policy
from adaptive_batcher.control.types import Decision, Observation

__all__ = ["BucketGuard"]


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

"""``MemoryGuard``: shrink the cap under GPU memory pressure and after out-of-memory errors."""

from __future__ import annotations

import math
from typing import Final

from adaptive_batcher._log import get_logger
from adaptive_batcher.control.guards.base import Guard
from adaptive_batcher.control.policy import Policy
from adaptive_batcher.control.types import Decision, Observation

__all__ = ["MemoryGuard"]

_log = get_logger()


FREED_SHARE: Final = 0.5
"""The share of the memory in use at an out-of-memory error that must be free again before
:class:`MemoryGuard` forgets the size that failed ahead of ``forget_s`` (a squeeze by a
co-tenant that has ended)."""


class MemoryGuard(Guard):
    """Shrink the cap under GPU memory pressure and after out-of-memory errors.

    * Free memory below ``min_free_fraction`` of the total (from telemetry): the cap ceiling
      becomes ``shrink * cap``, once per episode of pressure, and again only when free memory
      has halved since (a co-tenant holding most of a large GPU leaves the free fraction low
      however small the batches: shrinking on every tick took the cap to 1 without an
      out-of-memory error; out-of-memory errors find the cap that fits).
    * Any out-of-memory error put down to its batch's size in the tick (the smallest batch that
      failed, ``Observation.oom_units``; the cap in force where unknown): the ceiling becomes
      half the cap, or 3/4 of that batch where that is less or where a larger size already
      failed (a bisection between the halves that ran, when the runtime re-ran the batch split
      in halves, so no request was lost, and the size that failed); that size is remembered as
      too big for ``forget_s``, or until telemetry shows at least ``FREED_SHARE`` of the memory
      then in use free again (a co-tenant's squeeze has ended). A batch larger than the cap in
      force was dispatched before the cap fell (on another slot): it is remembered, and cuts
      nothing.

    The ceiling holds for ``cooldown_s`` after the last pressure, then rises by ``recover`` per
    tick, at most halfway to a size remembered as too big and never to it, until it no longer
    binds; an error while it rises brings it back no lower than the highest ceiling that held a
    cooldown. Probing upward this way finds the largest cap that fits in a few steps instead of
    failing batch after batch. The ceiling travels with the decision
    (``Decision.max_batch_size_ceiling``): a guard that wraps this one (``ShedGuard``) never
    sets a cap above it.
    """

    def __init__(
        self,
        inner: Policy,
        min_free_fraction: float = 0.1,
        shrink: float = 0.75,
        cooldown_s: float = 10.0,
        recover: float = 1.25,
        forget_s: float = 60.0,
    ) -> None:
        super().__init__(inner)
        self.min_free_fraction = min_free_fraction
        self.shrink = shrink
        self.cooldown_s = cooldown_s
        self.recover = recover
        self.forget_s = forget_s
        self.ceiling: int | None = None
        self.too_big: int | None = None
        self._pressure_at = -math.inf
        self._pressure_free: float | None = None  # the free fraction at the last shrink
        self._too_big_at = -math.inf
        self._too_big_free: float | None = None  # the free fraction when too_big failed
        self.fits: int | None = None  # the highest ceiling that held a cooldown, no error
        self._ceiling_at = -math.inf  # when the ceiling last changed

    def correct(self, observation: Observation, decision: Decision) -> Decision:
        now = observation.now_s
        reason = self._update(observation)
        if reason:
            _log.warning(
                "controller.memory_guard",
                reason=reason,
                cap_ceiling=self.ceiling,
                too_big=self.too_big,
                free_fraction=observation.telemetry.free_fraction,
                oom_errors=observation.oom_errors,
            )
        elif self.ceiling is not None and now - self._pressure_at >= self.cooldown_s:
            self._recover(
                observation.bounds.max_batch_size, now, observation.telemetry.free_fraction
            )
        if self.ceiling is None:
            return decision
        ceiling = min(self.ceiling, decision.max_batch_size_ceiling or self.ceiling)
        if decision.max_batch_size > ceiling:
            decision = decision.with_(max_batch_size=ceiling, reason=reason or "memory_ceiling")
        return decision.with_(max_batch_size_ceiling=ceiling)

    def _update(self, observation: Observation) -> str:
        cap_now = observation.current.max_batch_size
        free = observation.telemetry.free_fraction
        if observation.oom_errors > 0:
            failed = observation.oom_units or cap_now  # the smallest batch that failed
            narrowing = self.too_big is not None and failed < self.too_big
            self.too_big = failed if self.too_big is None else min(self.too_big, failed)
            self._too_big_at, self._too_big_free = observation.now_s, free
            if failed > cap_now:  # dispatched before the cap fell (another slot's batch)
                return ""
            # halve the cap at a first error; bisect between the halves that ran and the
            # batch that failed when that is smaller, or below a size already known too big,
            # never below a ceiling that held a cooldown (unless that one failed now)
            bisected = (3 * failed) // 4
            ceiling = bisected if narrowing else min(cap_now // 2, bisected)
            self.fits = self.fits if self.fits is not None and self.fits < failed else None
            self.ceiling = max(1, ceiling, self.fits or 0)
            self._pressure_free = free  # this pressure is answered: no shrink for it too
        elif free is not None and free < self.min_free_fraction:
            falling = self._pressure_free is None or free < self._pressure_free / 2.0
            self._pressure_at = observation.now_s
            if not falling:  # the same pressure: shrinking again would not relieve it
                return ""
            self._pressure_free = free
            self.ceiling = max(1, int(cap_now * self.shrink))
            # less memory: what fitted may not fit now
            self.fits, self._ceiling_at = None, observation.now_s
            return "memory_pressure"
        else:
            self._pressure_free = None
            return ""
        self._pressure_at = self._ceiling_at = observation.now_s
        return "out_of_memory"

    def _recover(self, hard_cap: int, now: float, free: float | None) -> None:
        assert self.ceiling is not None
        if self.too_big is not None and (
            now - self._too_big_at >= self.forget_s or self._freed_since_too_big(free)
        ):
            self.too_big = None
        if now - self._ceiling_at >= self.cooldown_s:  # it held a cooldown without an error
            self.fits = max(self.fits or 0, self.ceiling)
        ceiling = math.ceil(self.ceiling * self.recover)
        if self.too_big is not None:  # probe halfway to the size known too big
            ceiling = min(ceiling, max(self.ceiling + 1, (self.ceiling + self.too_big) // 2))
            ceiling = min(ceiling, self.too_big - 1)
        if ceiling > self.ceiling:
            self.ceiling, self._ceiling_at = ceiling, now
        if self.ceiling >= hard_cap:
            self.ceiling = None

    def _freed_since_too_big(self, free: float | None) -> bool:
        """True when at least half the memory in use at the error that made ``too_big`` is
        free now (a co-tenant left: the size that failed may fit). Our own batches' memory
        stays held by the framework's allocator cache, so an error of our own size does not
        read as freed; without telemetry, never."""
        at_error = self._too_big_free
        if free is None or at_error is None:
            return False
        return free >= at_error + FREED_SHARE * (1.0 - at_error)

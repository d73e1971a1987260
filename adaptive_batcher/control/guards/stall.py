"""``StallGuard``: narrow the window while the event loop stalls again and again."""

from __future__ import annotations

import math

from adaptive_batcher.control.guards.base import WINDOW_UNUSED, Guard
from adaptive_batcher.control.policy import Policy
from adaptive_batcher.control.types import Decision, Observation
from adaptive_batcher.slo import SLO

__all__ = ["StallGuard"]


class StallGuard(Guard):
    """Narrow the window while the event loop stalls again and again.

    A lone stall is an outlier (the PID and the estimator leave it alone); stalls that recur
    are part of the load. Every request waiting in a window when the loop stalls misses with
    it, so each ms of window costs ``stall rate x arrival rate`` answers per second. The
    stalls spend part of the SLO's tail (``1 - percentile / 100``) themselves: whatever the
    batcher does, a request that arrives in the last ``stall - (room - batch)`` of a stall
    misses (the room: the SLO's latency less preprocessing; the batch: a batch of one's
    fitted time, which runs after the stall), a share ``rate x mean`` of that part. While the loop
    stalls at ``loop_stall_rate_hz`` (0 unless two or more stalls began in the last 30 s),
    the window is at most ``tail_share * (tail - that share) / loop_stall_rate_hz``: the
    requests it exposes spend at most ``tail_share`` of the tail the stalls leave (window 0
    once they leave none). The ceiling lifts as the rate decays. A window held for a fixed set
    of closed-loop clients (reason ``window_unused``) is left alone: a stall catches every
    request they have in flight, whatever the window. Source: docs/policies.md,
    "StallGuard".

    Args:
        tail_share: the share of the SLO's tail (``1 - percentile / 100``) the window may spend
            on stalls, in (0, 1].
    """

    def __init__(self, inner: Policy, tail_share: float = 0.5) -> None:
        super().__init__(inner)
        self.tail_share = tail_share

    def correct(self, observation: Observation, decision: Decision) -> Decision:
        rate = observation.loop_stall_rate_hz
        slo = observation.slo
        if rate <= 0.0 or slo is None or decision.reason == WINDOW_UNUSED:
            # (a window held for a fixed set of closed-loop clients: a stall catches all their
            # requests in flight, whatever the window)
            return decision
        tail = 1.0 - slo.percentile / 100.0
        left = max(0.0, tail - _stalls_miss_share(observation, slo))
        ceiling_ms = 1e3 * self.tail_share * left / rate
        if decision.window_ms <= ceiling_ms:
            return decision
        return decision.with_(window_ms=ceiling_ms, reason="stall.recurring")


def _stalls_miss_share(observation: Observation, slo: SLO) -> float:
    """The share of arrivals that the recent loop stalls send past ``slo`` by themselves:
    those arriving in the last ``stall - (room - batch)`` of each (the room: the SLO's latency
    less preprocessing; the batch: the fitted time of a batch of one, which runs after the
    stall), ``rate x mean`` of that part."""
    durations = observation.loop_stall_durations_s
    if not durations:
        return 0.0
    batch_ms = observation.service_median_ms(1)
    batch_ms = 0.0 if math.isnan(batch_ms) else batch_ms
    latency_s = (slo.room_ms - batch_ms) / 1e3
    late_s = sum(max(0.0, d - latency_s) for d in durations) / len(durations)
    return observation.loop_stall_rate_hz * late_s

"""Caps from the service-time model: the largest that meets the budget, the smallest that keeps up.

With natural batching a request may wait for the batch in service and then run in its own, so its
end-to-end time inside the batcher is at most about ``window + 2 * service(cap)`` while the queue
stays short (the two-batch bound used by Clockwork, Gujarati et al., OSDI 2020, for its
admission check). The queue stays short only if a full batch finishes faster than it fills:
``cap / service(cap) >= arrival rate`` (in units per second), with some headroom.
"""

from __future__ import annotations

import math

from adaptive_batcher.control.types import Observation

__all__ = [
    "STABILITY_HEADROOM",
    "choose_cap",
    "latency_cap",
    "stability_cap",
    "throughput_cap",
]

STABILITY_HEADROOM = 1.15  # serve 15 % more than arrives, so queues drain after bursts


def latency_cap(observation: Observation, budget_ms: float, window_ms: float) -> int | None:
    """Largest allowed cap with ``window_ms + 2 * service(cap) <= budget_ms``; None if none fits
    or the service model is not ready."""
    best: int | None = None
    for cap in observation.bounds.cap_candidates():
        service = observation.service_ms(cap)
        if math.isnan(service):
            return None
        if window_ms + 2.0 * service <= budget_ms:
            best = cap
    return best


def stability_cap(observation: Observation, headroom: float = STABILITY_HEADROOM) -> int | None:
    """Smallest allowed cap that keeps up with demand, with ``headroom``; None if none does
    (overload: even the largest cap is too slow) or the model is not ready.

    Demand is the arrival rate plus the backlog drained within one latency budget (so a queue
    left by a burst is cleared quickly rather than at the trickle of the new arrival rate).
    """
    budget_s = observation.budget_ms / 1e3
    backlog_rps = observation.queue_depth / budget_s if budget_s > 0 else 0.0
    demand_rps = observation.arrival_rate_rps + backlog_rps
    demand_units_per_s = demand_rps * observation.mean_request_units * headroom
    for cap in observation.bounds.cap_candidates():
        service = observation.service_ms(cap)
        if math.isnan(service):
            return None
        if service <= 0 or cap / (service / 1e3) >= demand_units_per_s:
            return cap
    return None


def throughput_cap(observation: Observation, budget_ms: float = math.inf) -> int | None:
    """The allowed cap with the highest predicted throughput among those whose latency fits
    ``budget_ms`` (all of them if none fits); None if the model is not ready."""
    candidates = observation.bounds.cap_candidates()
    services = [observation.service_ms(cap) for cap in candidates]
    if any(math.isnan(s) for s in services):
        return None
    fitting = [(c, s) for c, s in zip(candidates, services, strict=True) if 2.0 * s <= budget_ms]
    pool = fitting or list(zip(candidates, services, strict=True))
    return max(pool, key=lambda cs: cs[0] / cs[1] if cs[1] > 0 else math.inf)[0]


def choose_cap(observation: Observation, budget_ms: float, window_ms: float) -> int | None:
    """The cap for a latency budget: the largest that fits it, but never one that falls behind.

    * keeps up and fits: the largest cap that fits the budget (the most headroom for bursts);
    * nothing fits: the smallest cap that keeps up (latency is lost anyway, do not lose more);
    * overload (no cap keeps up): the highest-throughput cap, to drain the queue soonest. (With
      SLO-aware shedding, :class:`~adaptive_batcher.control.guards.ShedGuard` narrows this to
      the highest-throughput cap that still fits the budget.)

    None while the service model is not ready.
    """
    fitting = latency_cap(observation, budget_ms, window_ms)
    needed = stability_cap(observation)
    if needed is None:
        return throughput_cap(observation)
    return needed if fitting is None else max(fitting, needed)

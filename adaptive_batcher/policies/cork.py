"""A BentoML-like "cork" policy, kept as a baseline for replays.

BentoML's CorkDispatcher (``bentoml/_internal/marshal/dispatcher.py``) fits the batch duration as
``a * n + b`` by least squares over its last 50 batches, dispatches when waiting is not predicted
to pay, and cancels a request whose predicted latency (time waited + ``a * n + b``) reaches its
``max_latency``. This policy reproduces those rules on our tick: the cap stays as configured,
the window is BentoML's 1 ms polling tick, and requests still queued after
``max_latency - (a * cap + b)`` are shed (BentoML cancels them; we fail them with
``DeadlineExceededError``). The linear fit uses our service-time model at two points, 1 and the
cap.
"""

from __future__ import annotations

import math
from typing import ClassVar

from adaptive_batcher.control.types import Decision, Observation

__all__ = ["BentoCork"]


class BentoCork:
    """BentoML-like cork dispatch: linear duration model, 1 ms tick, shed at max latency.

    Args:
        max_latency_ms: BentoML's ``max_latency``, ms (> 0).
        tick_ms: its polling interval, used as the window, ms.

    Raises:
        ValueError: a non-positive ``max_latency_ms`` or negative ``tick_ms``.
    """

    name = "bentoml_cork"
    sheds: ClassVar[bool] = True  # its decisions set shed_after_ms (see Policy)

    def __init__(self, max_latency_ms: float, tick_ms: float = 1.0) -> None:
        if not max_latency_ms > 0:
            raise ValueError(f"max_latency_ms must be > 0, got {max_latency_ms!r}")
        if not tick_ms >= 0:
            raise ValueError(f"tick_ms must be >= 0, got {tick_ms!r}")
        self.max_latency_ms = max_latency_ms
        self.tick_ms = tick_ms
        self._cap: int | None = None

    def reset(self, current: Decision) -> None:
        self._cap = current.max_batch_size

    def decide(self, observation: Observation) -> Decision:
        if self._cap is None:
            self.reset(observation.current)
        assert self._cap is not None
        cap = self._cap
        one, full = observation.service_median_ms(1), observation.service_median_ms(cap)
        if math.isnan(one) or math.isnan(full):
            return Decision(self.tick_ms, cap, "cork.learning")
        slope = (full - one) / (cap - 1) if cap > 1 else 0.0
        predicted_ms = slope * cap + (one - slope)  # a * cap + b, with b = s(1) - a
        shed_after = max(0.0, self.max_latency_ms - predicted_ms)
        return Decision(self.tick_ms, cap, "cork", shed_after_ms=shed_after)

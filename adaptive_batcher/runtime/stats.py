"""The frozen snapshot ``AdaptiveBatcher.stats()`` returns (and how it is taken), and the record
of one batch that batch listeners receive."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from adaptive_batcher.core.batcher_core import BatcherCore
from adaptive_batcher.metrics.histogram import Quantiles
from adaptive_batcher.metrics.recorder import Counts
from adaptive_batcher.slo import SLO
from adaptive_batcher.telemetry.sampler import TelemetryUsage

__all__ = ["BatchRecord", "BatcherStats"]


@dataclass(frozen=True, slots=True)
class BatcherStats:
    """A frozen snapshot of a batcher.

    Attributes:
        name: the batcher's name (log field ``batcher``).
        queue_depth: requests queued now; ``queued_units`` their total size in units.
        in_flight_batches: batches running now.
        counts: cumulative request and batch counters (:class:`~adaptive_batcher.metrics.Counts`).
        batch_sizes: {items per batch: number of batches}, cumulative.
        latency: end-to-end latency quantiles (ms) over the sliding window, with their sample
            count: 1 % resolution, the maximum exact and a ceiling on the others.
        window_ms, max_batch_size, max_concurrent_batches: the settings in force now.
        slo: the latency objective, if one was set.
        policy: the controller's policy chain (None: static settings, no controller).
        slo_unreachable: True while the SLO is out of reach for a request that arrives while a
            batch runs, even with batches of one (two of them take longer than the aim); a
            client that waits for each answer before its next request never queues and may
            still meet it.
        decisions: controller decisions taken so far.
        slo_attainment: of the answers in the latency window, the share whose latency met the
            SLO with a result, counted exactly as ``counts.within_slo`` is (answers recorded
            under an earlier SLO are read from the window's buckets: 1 % resolution, errors
            by their latency); NaN without an SLO or without answers.
        decision_reasons: {reason tag: decisions} of the controller in force (``pid.slack``,
            ``budget``, ...); they add up to ``decisions``.
        gpu: what the GPU did while the batcher sampled it (energy, busy and SM-active
            seconds; see :class:`~adaptive_batcher.telemetry.TelemetryUsage`); None without
            ``telemetry``.
        executor: where the model runs now: ``"thread"``, ``"inline"`` (on the event loop),
            ``"async"``, ``"stream"`` or ``"cuda"`` (``executor="adaptive"`` reads
            ``"thread"`` or ``"inline"`` by where warm-up put it); empty when not known.
        loop_lag_ms: the event loop's lag the controller sets aside from the SLO now, ms (its
            heartbeat's recent p99 lateness, at most half the batcher budget; 0 without a
            controller or an SLO, or before enough heartbeats; docs/policies.md, "The event
            loop's lag").

    The device cost is in ``counts``: ``counts.device_busy_s`` (every model call's time, as
    measured where it ran) and ``counts.device_ms_per_request``.
    """

    name: str
    queue_depth: int
    queued_units: int
    in_flight_batches: int
    counts: Counts
    batch_sizes: MappingProxyType[int, int]
    latency: Quantiles
    window_ms: float
    max_batch_size: int
    max_concurrent_batches: int
    slo: SLO | None
    policy: str | None
    slo_unreachable: bool
    decisions: int
    slo_attainment: float = math.nan
    decision_reasons: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    gpu: TelemetryUsage | None = None
    executor: str = ""
    loop_lag_ms: float = 0.0


@dataclass(frozen=True, slots=True)
class BatchRecord:
    """One batch the runtime ran, as batch listeners receive it (see
    ``AdaptiveBatcher.add_batch_listener``). Times are seconds on the event loop's clock.

    Attributes:
        batch_id: the engine's number for the batch.
        first_arrival_s: arrival of the oldest request of the batch that ran.
        start_s: when the batch started (its task began running it).
        end_s: when the model was done with it (splits after an error and padding included).
        items: requests that ran in it.
        units: size units the model ran, padding included.
    """

    batch_id: int
    first_arrival_s: float
    start_s: float
    end_s: float
    items: int
    units: int

    @property
    def queue_wait_s(self) -> float:
        """How long the oldest request waited for the batch to start, seconds: the window,
        plus any wait for a free execution slot."""
        return self.start_s - self.first_arrival_s

    @property
    def execution_s(self) -> float:
        """How long the model took over the batch, seconds (the recorder's service time)."""
        return self.end_s - self.start_s


def take_stats(
    core: BatcherCore[Any],
    name: str,
    now: float,
    gpu: TelemetryUsage | None,
    executor: str = "",
) -> BatcherStats:
    """The snapshot of the batcher named ``name`` whose core is ``core``, at ``now`` (seconds
    on its clock), with ``gpu``, what its telemetry sampler integrated (None: no telemetry),
    and ``executor``, where its model runs now."""
    controller = core.controller
    limits = core.limits
    recorder = core.recorder
    slo_s = recorder.slo_latency_s
    return BatcherStats(
        name=name,
        queue_depth=core.queue_depth,
        queued_units=core.queued_units,
        in_flight_batches=core.in_flight,
        counts=recorder.counts(),
        batch_sizes=recorder.batch_size_histogram(),
        latency=recorder.quantiles(now),
        window_ms=limits.window_s * 1e3,
        max_batch_size=limits.max_batch_size,
        max_concurrent_batches=limits.max_concurrent_batches,
        slo=core.slo,
        policy=controller.chain.name if controller else None,
        slo_unreachable=controller.slo_unreachable if controller else False,
        decisions=controller.decisions if controller else 0,
        slo_attainment=recorder.latency.fraction_at_most(slo_s, now)
        if slo_s != math.inf
        else math.nan,
        decision_reasons=MappingProxyType(dict(controller.reasons) if controller else {}),
        gpu=gpu,
        executor=executor,
        loop_lag_ms=controller.loop_lag_ms(now) if controller else 0.0,
    )

"""Scale-out on Ray Serve: size a deployment from its replicas' batchers, not from a guess.

Ray Serve's default autoscaler holds ``target_ongoing_requests`` per replica. A batching replica
wants many requests in flight (a batch of 32 is 32 ongoing requests), and how many it can hold
within an SLO changes with the batch its controller picks, so no fixed target fits it. Here each
replica reports its load through :class:`~adaptive_batcher.ray.replica_report.ReplicaReport`
and :class:`SLOAutoscaler`, a Ray Serve custom autoscaling policy, sizes the deployment from
the reports (:func:`plan_replicas`):

* **out** (one replica more, or as many as the busy time needs, at most twice as many) when the
  SLO is missed (the share of answers in time, measured over enough answers for the
  percentile, is below the SLO's), when the replicas are saturated (the model runs more than
  ``scale_out_busy_fraction`` of the time: no (window, cap) keeps the queue from growing), or
  when a replica's queue holds more than a full batch on average;
* **in** (to the fewest replicas whose busy time stays under ``target_busy_fraction``) when
  the SLO is met and the load fits on fewer replicas. The same requests on fewer replicas make
  larger batches, and a batch costs less per request the larger it is, so the summed busy
  time of today's replicas over-estimates what fewer will need: cost per request can only fall;
* **held** otherwise, and when a replica reports the SLO out of reach for a batch of one
  (``slo_unreachable``) while nothing is saturated: the model itself is too slow for the SLO
  on this device, which no replica count changes (a faster device or a looser SLO does).

Ray applies ``min_replicas`` / ``max_replicas``, ``upscale_delay_s`` / ``downscale_delay_s``
and the scaling factors to the count returned. :func:`autoscaling_config` builds the
deployment's ``autoscaling_config`` with this policy. Needs Ray Serve 2.60 (custom policies
and ``record_autoscaling_stats``) at run time; importing this module does not import Ray.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from adaptive_batcher._log import get_logger
from adaptive_batcher._validate import check_int, check_number
from adaptive_batcher.ray import replica_report as r

__all__ = [
    "DEFAULT_SCALE_OUT_BUSY_FRACTION",
    "DEFAULT_TARGET_BUSY_FRACTION",
    "SLOAutoscaler",
    "ScalingDecision",
    "autoscaling_config",
    "plan_replicas",
]

_log = get_logger()

DEFAULT_TARGET_BUSY_FRACTION = 0.6
"""The busy share a replica is sized for: 40 % headroom for bursts, as the 0.6-0.7 target
utilisation commonly used for latency-bound services (queueing delay grows as 1 / (1 - rho),
M/M/1; at 0.6 it is 2.5 service times)."""

DEFAULT_SCALE_OUT_BUSY_FRACTION = 0.85
"""Above this busy share a replica counts as saturated: its queue grows with any burst. Kept
apart from the sizing target so that a count just chosen is not undone at once (hysteresis)."""

MAX_GROWTH = 2.0
"""At most this many times the current replicas per decision: the demand of refused requests
is extrapolated from the served ones, so a single reading is not trusted with more."""


@dataclass(frozen=True, slots=True)
class ScalingDecision:
    """What :func:`plan_replicas` decided, and from what.

    Attributes:
        replicas: the replica count wanted (before Ray's bounds and delays).
        reason: ``no_reports``, ``slo_missed``, ``saturated``, ``backlog``,
            ``slo_unreachable`` (held), ``fits_fewer`` or ``steady``.
        busy_replicas: the summed busy share of the replicas that reported: how many fully
            busy replicas their model time makes.
        needed: replicas that keep each under the target busy share with the offered load
            (busy time scaled by arrivals over answers when requests are refused).
        attainment: share of the ended requests answered within the SLO, over the reports;
            NaN without an SLO or without enough ended requests to measure it.
        quantile: the share the SLO asks for (0.99 for p99); NaN without an SLO.
    """

    replicas: int
    reason: str
    busy_replicas: float
    needed: int
    attainment: float
    quantile: float


def plan_replicas(
    current: int,
    reports: Sequence[Mapping[str, float]],
    *,
    window_s: float,
    target_busy_fraction: float = DEFAULT_TARGET_BUSY_FRACTION,
    scale_out_busy_fraction: float = DEFAULT_SCALE_OUT_BUSY_FRACTION,
) -> ScalingDecision:
    """The replica count for a deployment whose replicas reported ``reports``.

    Args:
        current: replicas running now (>= 0).
        reports: one mapping per reporting replica, ``{metric: mean over the window}`` with the
            names of :mod:`adaptive_batcher.ray.replica_report`; a replica that has not
            reported rates yet (no ``ab_busy_fraction``) is left out.
        window_s: the span the means were taken over (Ray's ``look_back_period_s``), seconds;
            attainment is judged only when at least ``1 / (1 - quantile)`` requests ended in it
            (100 for a p99), the fewest that can show a miss of the percentile.
        target_busy_fraction: the busy share per replica the count is sized for, in (0, 1].
        scale_out_busy_fraction: the busy share above which replicas are saturated, in
            [target_busy_fraction, 1].

    Returns:
        A :class:`ScalingDecision`; ``replicas`` is ``current`` when nothing reported yet.

    Raises:
        TypeError, ValueError: an argument out of range (the message names it).
    """
    current = check_int("current", current, 0)
    window_s = check_number("window_s", window_s, 0.0, strict=True)
    target = check_number("target_busy_fraction", target_busy_fraction, 0.0, strict=True)
    if target > 1.0:
        raise ValueError(f"target_busy_fraction must be at most 1, got {target_busy_fraction!r}")
    saturated_at = check_number("scale_out_busy_fraction", scale_out_busy_fraction, target)
    if saturated_at > 1.0:
        raise ValueError(
            f"scale_out_busy_fraction must be at most 1, got {scale_out_busy_fraction!r}"
        )
    loads = [report for report in reports if r.BUSY_FRACTION in report]
    if not loads:
        return ScalingDecision(current, "no_reports", math.nan, current, math.nan, math.nan)
    busy = sum(report[r.BUSY_FRACTION] for report in loads)
    needed = _needed(loads, busy, target)
    attainment, quantile = _attainment(loads, window_s)
    base = max(current, len(loads))
    out = min(max(base + 1, needed), max(base + 1, math.ceil(MAX_GROWTH * base)))

    def decide(replicas: int, reason: str) -> ScalingDecision:
        return ScalingDecision(replicas, reason, busy, needed, attainment, quantile)

    if busy / len(loads) > saturated_at:
        return decide(out, "saturated")
    if any(
        report.get(r.QUEUE_DEPTH, 0.0) > report.get(r.MAX_BATCH_SIZE, math.inf) for report in loads
    ):
        return decide(out, "backlog")
    if attainment < quantile:
        if any(report.get(r.SLO_UNREACHABLE, 0.0) >= 0.5 for report in loads):
            return decide(current, "slo_unreachable")
        return decide(out, "slo_missed")
    if needed < current:
        return decide(needed, "fits_fewer")
    return decide(current, "steady")


def _needed(loads: Sequence[Mapping[str, float]], busy: float, target: float) -> int:
    """Replicas that keep each under ``target`` busy with the offered load: the busy time,
    scaled by arrivals over answers when some requests were refused or expired."""
    arrivals = sum(report.get(r.ARRIVAL_RPS, 0.0) for report in loads)
    answered = sum(report.get(r.ANSWERED_RPS, 0.0) for report in loads)
    scale = arrivals / answered if answered > 0 and arrivals > answered else 1.0
    return max(1, math.ceil(busy * scale / target - 1e-9))


def _attainment(loads: Sequence[Mapping[str, float]], window_s: float) -> tuple[float, float]:
    """``(share of ended requests answered within the SLO, the share asked)``; NaN where there
    is no SLO or too few ended requests to measure the percentile."""
    quantiles = [report[r.SLO_QUANTILE] for report in loads if r.SLO_QUANTILE in report]
    if not quantiles:
        return math.nan, math.nan
    quantile = max(quantiles)
    ended = sum(report.get(r.ENDED_RPS, 0.0) for report in loads)
    within = sum(report.get(r.WITHIN_SLO_RPS, 0.0) for report in loads)
    if ended * window_s < 1.0 / (1.0 - quantile) - 1e-9:
        return math.nan, quantile
    return within / ended, quantile


class SLOAutoscaler:
    """A Ray Serve custom autoscaling policy (a class-callable, Ray 2.60) that sizes a
    deployment by :func:`plan_replicas` from its replicas'
    :class:`~adaptive_batcher.ray.replica_report.ReplicaReport` readings.

    Ray makes one instance per deployment, with the ``policy_kwargs`` of the
    ``autoscaling_config`` as arguments, and calls it with an ``AutoscalingContext`` on each
    control-loop tick; Ray then applies the replica bounds, delays and scaling factors. Each
    decision that changes the count is logged as ``ray.autoscale.decision`` (info), and the
    last decision is kept in the policy state under ``adaptive_batcher``.

    Args:
        target_busy_fraction: the busy share per replica the count is sized for, in (0, 1].
        scale_out_busy_fraction: the busy share above which replicas are saturated.

    Raises:
        TypeError, ValueError: an argument out of range (the message names it).
    """

    def __init__(
        self,
        target_busy_fraction: float = DEFAULT_TARGET_BUSY_FRACTION,
        scale_out_busy_fraction: float = DEFAULT_SCALE_OUT_BUSY_FRACTION,
    ) -> None:
        plan_replicas(
            0,
            [],
            window_s=1.0,
            target_busy_fraction=target_busy_fraction,
            scale_out_busy_fraction=scale_out_busy_fraction,
        )  # checks the arguments now, at deployment, rather than on the first tick
        self.target_busy_fraction = float(target_busy_fraction)
        self.scale_out_busy_fraction = float(scale_out_busy_fraction)

    def __call__(self, ctx: Any) -> tuple[int, dict[str, Any]]:
        """``(replicas wanted, policy state)`` for a Ray ``AutoscalingContext``."""
        metrics: Mapping[str, Mapping[Any, float]] = ctx.aggregated_metrics or {}
        per_replica: dict[Any, dict[str, float]] = {}
        for name, values in metrics.items():
            for replica, value in values.items():
                per_replica.setdefault(replica, {})[name] = float(value)
        decision = plan_replicas(
            ctx.current_num_replicas,
            list(per_replica.values()),
            window_s=float(ctx.config.look_back_period_s),
            target_busy_fraction=self.target_busy_fraction,
            scale_out_busy_fraction=self.scale_out_busy_fraction,
        )
        if decision.replicas != ctx.current_num_replicas:
            _log.info(
                "ray.autoscale.decision",
                deployment=str(ctx.deployment_name),
                current=ctx.current_num_replicas,
                replicas=decision.replicas,
                reason=decision.reason,
                busy_replicas=round(decision.busy_replicas, 3),
                needed=decision.needed,
                attainment=decision.attainment,
            )
        state = dict(ctx.policy_state or {})
        state["adaptive_batcher"] = {
            "replicas": decision.replicas,
            "reason": decision.reason,
            "busy_replicas": decision.busy_replicas,
            "attainment": decision.attainment,
        }
        return decision.replicas, state


def autoscaling_config(
    min_replicas: int = 1,
    max_replicas: int = 4,
    *,
    target_busy_fraction: float = DEFAULT_TARGET_BUSY_FRACTION,
    scale_out_busy_fraction: float = DEFAULT_SCALE_OUT_BUSY_FRACTION,
    look_back_period_s: float = 20.0,
    upscale_delay_s: float = 10.0,
    downscale_delay_s: float = 120.0,
    metrics_interval_s: float | None = None,
) -> dict[str, Any]:
    """A Ray Serve ``autoscaling_config`` (a dict, for ``@serve.deployment``) with
    :class:`SLOAutoscaler` as its policy.

    Args:
        min_replicas: the fewest replicas (>= 0).
        max_replicas: the most replicas (>= max(min_replicas, 1)).
        target_busy_fraction: see :class:`SLOAutoscaler`.
        scale_out_busy_fraction: see :class:`SLOAutoscaler`.
        look_back_period_s: the window Ray averages the readings over, seconds; above
            ``metrics_interval_s`` (Ray warns otherwise).
        upscale_delay_s: how long a scale-out must be wanted before Ray acts, seconds (>= 0).
        downscale_delay_s: the same for a scale-in, seconds (>= 0); longer than the scale-out
            delay, as in Ray's defaults (30 s and 600 s), so that a lull does not undo it.
        metrics_interval_s: how often each replica sends its readings to the Serve
            controller, seconds; None keeps Ray's default (10 s). Ray 2.60 marks the field
            deprecated (a ``DeprecationWarning`` when set) but still reads it for the
            replicas' push interval; the readings the policy sees are that much old.

    Returns:
        The dict, with ``policy: {policy_function: SLOAutoscaler, policy_kwargs: {...}}``.

    Raises:
        TypeError, ValueError: an argument out of range (the message names it).
    """
    low = check_int("min_replicas", min_replicas, 0)
    high = check_int("max_replicas", max_replicas, max(low, 1))
    SLOAutoscaler(target_busy_fraction, scale_out_busy_fraction)  # checks them
    config: dict[str, Any] = {
        "min_replicas": low,
        "max_replicas": high,
        "look_back_period_s": check_number(
            "look_back_period_s", look_back_period_s, 0.0, strict=True
        ),
        "upscale_delay_s": check_number("upscale_delay_s", upscale_delay_s, 0.0),
        "downscale_delay_s": check_number("downscale_delay_s", downscale_delay_s, 0.0),
        "policy": {
            "policy_function": SLOAutoscaler,
            "policy_kwargs": {
                "target_busy_fraction": float(target_busy_fraction),
                "scale_out_busy_fraction": float(scale_out_busy_fraction),
            },
        },
    }
    if metrics_interval_s is not None:
        interval = check_number("metrics_interval_s", metrics_interval_s, 0.0, strict=True)
        config["metrics_interval_s"] = interval
    return config

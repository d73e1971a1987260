"""Scale-out on Ray Serve: replicas that each batch toward an SLO, sized from their reports.

Each replica of the ``ScaleOut`` deployment batches its requests with
``adaptive_batcher.ray.batch`` under an SLO (window and cap tuned by its own controller), and
reports its batcher's load to Ray Serve (``record_autoscaling_stats``, with
:class:`~adaptive_batcher.ray.replica_report.ReplicaReport`); the deployment's autoscaling
policy, :class:`~adaptive_batcher.ray.autoscaling.SLOAutoscaler`, adds replicas when the SLO
is missed or the replicas are saturated, and removes them when the load fits on fewer.

The model stands for a device: a batch of ``n`` takes ``base_ms + per_item_ms * n`` (an
``asyncio.sleep``), so larger batches cost less per request, as on a GPU. Replace ``_infer``
with your model. Run it with Ray Serve (the ``ray`` extra)::

    serve run adaptive_batcher.examples.ray_scaleout:app max_replicas=4

then ``curl -X POST localhost:8000/ -d '{"x": 1.5}'`` (``{"y": 3.0, "replica": ...,
"batch_size": ...}``, or a 503 when the batcher sheds a request it cannot answer in time) and
``curl localhost:8000/stats`` (the answering replica's batch sizes, window, cap, queue and
SLO attainment). Python: ``serve.run(build_app(max_replicas=4))``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
from typing import Any

from ray import serve
from ray.serve import Application
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from adaptive_batcher.errors import BatcherClosedError, DeadlineExceededError, QueueFullError
from adaptive_batcher.ray import batch
from adaptive_batcher.ray.autoscaling import autoscaling_config
from adaptive_batcher.ray.replica_report import ReplicaReport
from adaptive_batcher.slo import SLO

__all__ = ["ScaleOut", "app", "build_app"]

MAX_BATCH_SIZE = 32
"""The hard cap of each replica's batcher; its controller picks the cap in force below it."""

MAX_QUEUE_SIZE = 256
"""Requests a replica's batcher queues before refusing more (a 503)."""

OVERLOAD = (DeadlineExceededError, QueueFullError, BatcherClosedError)
"""Refusals that tell the client to retry later (503): shed for the SLO, queue full, closing."""

BODY_TIMEOUT_S = 5.0
"""How long a replica waits for a request's body, seconds; then it answers 408.

Ray Serve (2.60) re-sends a request to another replica when the one it chose dies before its
"accepted" reply reaches the router, but that replica may already have read the body from the
proxy (it starts reading as it accepts). The replica the request is re-sent to then waits for a
body that will not come, until the client disconnects: a request hung for the client's whole
timeout (60 s) on the surviving replica after a replica was killed. The body of a live request
arrives in milliseconds."""


class ScaleOut:
    """One replica: an adaptive batcher with an SLO around the model, and its load report.

    Routes: ``POST /`` with ``{"x": number}`` answers ``{"y", "replica", "batch_size"}`` (503
    when refused, 408 when its body does not arrive); ``GET /stats`` answers this replica's
    :meth:`stats`.

    Args:
        base_ms: the model's fixed time per batch, ms.
        per_item_ms: the model's time per item of a batch, ms.
        slo_p99_ms: the replica's latency SLO (p99), ms.
        body_timeout_s: the longest wait for a request's body, seconds (see
            :data:`BODY_TIMEOUT_S`); a 408 after it.
    """

    def __init__(
        self,
        base_ms: float = 10.0,
        per_item_ms: float = 0.5,
        slo_p99_ms: float = 100.0,
        body_timeout_s: float = BODY_TIMEOUT_S,
    ):
        self.body_timeout_s = body_timeout_s
        self.base_s = base_ms / 1e3
        self.per_item_s = per_item_ms / 1e3
        self.replica = serve.get_replica_context().replica_id
        self.report = ReplicaReport()
        # Ray Serve runs the constructor on the replica's event loop, where the batcher lives
        self.predict.get_batcher(self).set_slo(SLO(latency_ms=slo_p99_ms))

    @batch(
        max_batch_size=MAX_BATCH_SIZE,
        batch_wait_timeout_s=0.002,
        slo=SLO(latency_ms=100.0),  # each instance sets its own in __init__
        shed_late=True,
        max_queue_size=MAX_QUEUE_SIZE,
    )
    async def predict(self, xs: list[float]) -> list[dict[str, Any]]:
        ys = await self._infer(xs)
        size, tag = len(xs), self.replica.unique_id
        return [{"y": y, "replica": tag, "batch_size": size} for y in ys]

    async def _infer(self, xs: list[float]) -> list[float]:
        """The model: ``2 * x`` for each item, after the device time of the batch."""
        await asyncio.sleep(self.base_s + self.per_item_s * len(xs))
        return [2.0 * x for x in xs]

    async def __call__(self, request: Request) -> Response:
        if request.method == "GET" and request.url.path.rstrip("/").endswith("/stats"):
            return JSONResponse(self.stats())
        try:
            body = await asyncio.wait_for(request.body(), self.body_timeout_s)
        except TimeoutError:  # a re-sent request whose body another replica read: see above
            message = f"the request body did not arrive within {self.body_timeout_s:g} s"
            return JSONResponse({"error": message}, 408)
        try:
            x = float(json.loads(body)["x"])
        except (ValueError, KeyError, TypeError) as exc:
            return JSONResponse({"error": f"expected a JSON body {{'x': number}}: {exc}"}, 422)
        try:
            return JSONResponse(await self.predict(x))
        except OVERLOAD as exc:
            return JSONResponse({"error": str(exc)}, 503, headers={"Retry-After": "1"})

    def stats(self) -> dict[str, Any]:
        """This replica's batcher: batch sizes, window, cap, queue, counts and SLO attainment,
        with the replica's id and Ray actor name (JSON-ready)."""
        stats = self.predict.get_batcher(self).stats()
        counts, attainment = stats.counts, stats.slo_attainment
        return {
            "replica": self.replica.unique_id,
            "actor_name": self.replica.to_full_id_str(),
            "batch_sizes": {str(size): n for size, n in sorted(stats.batch_sizes.items())},
            "window_ms": stats.window_ms,
            "max_batch_size": stats.max_batch_size,
            "queue_depth": stats.queue_depth,
            "slo_attainment": None if math.isnan(attainment) else attainment,
            "slo_unreachable": stats.slo_unreachable,
            "counts": dataclasses.asdict(counts),
            "device_ms_per_request": counts.device_ms_per_request if counts.completed else None,
        }

    async def record_autoscaling_stats(self) -> dict[str, float]:
        """Ray Serve calls this on each replica for the autoscaling policy."""
        return self.report(self.predict.get_batcher(self).stats())


def build_app(
    *,
    min_replicas: int = 1,
    max_replicas: int = 4,
    base_ms: float = 10.0,
    per_item_ms: float = 0.5,
    slo_p99_ms: float = 100.0,
    max_ongoing_requests: int = 2 * MAX_BATCH_SIZE,
    max_queued_requests: int = 1024,
    look_back_period_s: float = 20.0,
    upscale_delay_s: float = 10.0,
    downscale_delay_s: float = 120.0,
    metrics_interval_s: float | None = None,
) -> Application:
    """The Ray Serve application: the ``ScaleOut`` deployment with its autoscaling policy.

    Args:
        min_replicas, max_replicas: the replica range the policy moves in.
        base_ms, per_item_ms: the model's batch time ``base_ms + per_item_ms * n``, ms.
        slo_p99_ms: each replica's SLO (p99), ms.
        max_ongoing_requests: requests a replica accepts at once (Ray refuses to send it
            more); at least a full batch, or batches never fill.
        max_queued_requests: requests Ray's router holds for the deployment when every
            replica is full; beyond it the proxy answers 503.
        look_back_period_s, upscale_delay_s, downscale_delay_s, metrics_interval_s: Ray's
            autoscaling timing, seconds (see
            :func:`~adaptive_batcher.ray.autoscaling.autoscaling_config`).
    """
    deployment = serve.deployment(
        name="ScaleOut",
        max_ongoing_requests=max_ongoing_requests,
        max_queued_requests=max_queued_requests,
        autoscaling_config=autoscaling_config(
            min_replicas,
            max_replicas,
            look_back_period_s=look_back_period_s,
            upscale_delay_s=upscale_delay_s,
            downscale_delay_s=downscale_delay_s,
            metrics_interval_s=metrics_interval_s,
        ),
        ray_actor_options={"num_cpus": 0},  # the model is asleep, not computing
    )(ScaleOut)
    return deployment.bind(base_ms=base_ms, per_item_ms=per_item_ms, slo_p99_ms=slo_p99_ms)


def app(args: dict[str, str]) -> Application:
    """The application builder ``serve run adaptive_batcher.examples.ray_scaleout:app`` calls,
    with the ``key=value`` arguments of the command line (the keyword arguments of
    :func:`build_app`)."""
    kinds = {
        "min_replicas": int,
        "max_replicas": int,
        "max_ongoing_requests": int,
        "max_queued_requests": int,
    }
    options: dict[str, Any] = {key: kinds.get(key, float)(value) for key, value in args.items()}
    return build_app(**options)

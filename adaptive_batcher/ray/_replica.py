"""What the Ray Serve replica around a batch handler allows, when there is one."""

from __future__ import annotations

import sys

from adaptive_batcher._log import get_logger

__all__ = ["max_ongoing_requests", "warn_if_cap_unreachable"]

_log = get_logger()


def max_ongoing_requests() -> int | None:
    """The ``max_ongoing_requests`` of the Ray Serve replica this code runs in; None outside a
    replica, or when Ray Serve is not imported (it never is imported from here)."""
    serve = sys.modules.get("ray.serve")
    if serve is None:
        return None
    try:
        context = serve.get_replica_context()
        return int(context._deployment_config.max_ongoing_requests)
    except Exception:  # not in a replica (RayServeException), or another Ray version's layout
        return None


def warn_if_cap_unreachable(name: str, max_batch_size: int, max_concurrent_batches: int) -> None:
    """Log ``ray.batch.cap_unreachable`` (a warning) when the replica admits fewer requests at
    once than ``max_batch_size * max_concurrent_batches``: batches never fill then (Ray Serve
    warns alike)."""
    limit = max_ongoing_requests()
    wanted = max_batch_size * max_concurrent_batches
    if limit is not None and limit < wanted:
        _log.warning(
            "ray.batch.cap_unreachable",
            handler=name,
            max_batch_size=max_batch_size,
            max_concurrent_batches=max_concurrent_batches,
            max_ongoing_requests=limit,
            advice="set max_ongoing_requests >= max_batch_size * max_concurrent_batches",
        )

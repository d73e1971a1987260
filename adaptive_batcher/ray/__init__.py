"""Ray Serve's ``@serve.batch``, drop-in, on the adaptive batcher.

Replace ``from ray import serve`` ... ``@serve.batch`` with::

    from adaptive_batcher.ray import batch

    @serve.deployment
    class Model:
        @batch(max_batch_size=16, batch_wait_timeout_s=0.005, slo=SLO(latency_ms=50))
        async def handle(self, inputs: list[str]) -> list[str]: ...

Ray is not needed to import or use this package (it is plain asyncio); with Ray installed its
errors are also Ray Serve's (``RayServeException``), and inside a replica it warns when
``max_ongoing_requests`` keeps batches from filling. Install with the ``ray`` extra.
"""

from adaptive_batcher.ray.batching import BatchHandler, batch
from adaptive_batcher.ray.errors import BatchSizeMismatchError, ItemTooLargeForBatchError

__all__ = ["BatchHandler", "BatchSizeMismatchError", "ItemTooLargeForBatchError", "batch"]

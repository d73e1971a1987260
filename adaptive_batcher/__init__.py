"""adaptive_batcher: a drop-in dynamic batcher whose window and batch cap are tuned online.

Quick start:

    from adaptive_batcher import AdaptiveBatcher

    async with AdaptiveBatcher(model, max_batch_size=32, window_ms=5.0) as batcher:
        y = await batcher.submit(x)

See README.md and docs/ for the architecture, the tuning guide and the policy reference.
"""

from adaptive_batcher.control.types import Bounds
from adaptive_batcher.errors import (
    BatcherClosedError,
    BatcherError,
    BatchFailedError,
    ConcurrentReadError,
    DeadlineExceededError,
    EventLoopError,
    ItemSizeError,
    ItemTooLargeError,
    PaddingError,
    QueueFullError,
    ResultCountError,
    StreamBufferFullError,
)
from adaptive_batcher.presets import (
    Preset,
    PresetError,
    list_presets,
    load_preset,
    load_preset_group,
)
from adaptive_batcher.runtime.batcher import AdaptiveBatcher, BatcherStats
from adaptive_batcher.runtime.collate import concat_rows, pad_rows, repeat_last, row_count, stacked
from adaptive_batcher.runtime.collector import GCPauseProbe, freeze_after_warmup
from adaptive_batcher.runtime.decorator import BatchedFunction, BatchedStream, batched
from adaptive_batcher.runtime.streaming import Stream
from adaptive_batcher.slo import SLO

__version__ = "0.1.0"

__all__ = [
    "SLO",
    "AdaptiveBatcher",
    "BatchFailedError",
    "BatchedFunction",
    "BatchedStream",
    "BatcherClosedError",
    "BatcherError",
    "BatcherStats",
    "Bounds",
    "ConcurrentReadError",
    "DeadlineExceededError",
    "EventLoopError",
    "GCPauseProbe",
    "ItemSizeError",
    "ItemTooLargeError",
    "PaddingError",
    "Preset",
    "PresetError",
    "QueueFullError",
    "ResultCountError",
    "Stream",
    "StreamBufferFullError",
    "__version__",
    "batched",
    "concat_rows",
    "freeze_after_warmup",
    "list_presets",
    "load_preset",
    "load_preset_group",
    "pad_rows",
    "repeat_last",
    "row_count",
    "stacked",
]

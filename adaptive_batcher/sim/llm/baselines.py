"""Engine-side baselines: rules that change the engine's caps between steps, with no gate.

:class:`TrtllmDynamicBatchTuner` is TensorRT-LLM's open-loop ``DynamicBatchTuner`` as its code
defines it (NVIDIA/TensorRT-LLM, ``cpp/tensorrt_llm/executor/dynamicBatchTuner.cpp`` and
``executor.h``, Apache-2.0), applied to the simulated engine; it has no latency input at all.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from adaptive_batcher._validate import check_int

__all__ = ["DEFAULT_BATCH_SIZE_TABLE", "TrtllmDynamicBatchTuner"]

DEFAULT_BATCH_SIZE_TABLE: tuple[tuple[int, int], ...] = (
    (144, 128),
    (336, 256),
    (672, 512),
    (832, 768),
    (1280, 1024),
    (1664, 1536),
)
"""``DynamicBatchConfig::kDefaultBatchSizeTable``: (capacity below which, batch size)."""

_FALLBACK_GRANULARITY = 512
_FALLBACK_THRESHOLD = 128
_RATIO_CONTEXT_HEAVY = 2.0
_RATIO_BALANCED = 0.5
_TOKENS_CONTEXT_HEAVY = 8192
_TOKENS_BALANCED = 4096
_TOKENS_GEN_HEAVY = 2048


@dataclass
class TrtllmDynamicBatchTuner:
    """TensorRT-LLM's dynamic batch size and token budget, from moving averages of lengths.

    Every iteration, each active request's prompt length and requested output length enter
    two moving-average windows of ``window`` samples (128 by default). Then:

    * capacity = KV blocks // blocks one request of the average lengths needs
      (``KVCacheManager::getMaxCapacityBatchSize``);
    * batch size = the first table entry whose bound exceeds the capacity, else the capacity
      rounded down to a multiple of 512 when within 128 above it, else the capacity
      (``getRuntimeBatchSize``); at most the engine's static cap;
    * token budget = ``batch * input / output + batch`` rounded up to a power of two, at least
      8192 / 4096 / 2048 for an input/output ratio above 2 / above 0.5 / below
      (``getRuntimeMaxNumTokens``); at most the engine's static budget.

    Args:
        kv_blocks: the engine's KV-cache blocks.
        block_size: tokens per block.
        max_num_seqs: the engine's static cap on running sequences.
        max_num_batched_tokens: the engine's static token budget.
        window: the moving-average window (>= 1).
        table: the batch size table.
    """

    kv_blocks: int
    block_size: int
    max_num_seqs: int
    max_num_batched_tokens: int
    window: int = 128
    table: Sequence[tuple[int, int]] = DEFAULT_BATCH_SIZE_TABLE
    _inputs: npt.NDArray[np.int64] = field(init=False, repr=False)
    _outputs: npt.NDArray[np.int64] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        check_int("window", self.window, 1)
        self._inputs = np.zeros(0, dtype=np.int64)
        self._outputs = np.zeros(0, dtype=np.int64)

    def update(self, inputs: npt.NDArray[np.int64], outputs: npt.NDArray[np.int64]) -> None:
        """One iteration's active requests: their prompt and requested output lengths."""
        if not inputs.size:
            return
        self._inputs = np.concatenate((self._inputs, inputs))[-self.window :]
        self._outputs = np.concatenate((self._outputs, outputs))[-self.window :]

    def caps(self) -> tuple[int, int] | None:
        """``(max_num_seqs, max_num_batched_tokens)`` for the next step, None before any
        statistics."""
        if not self._inputs.size:
            return None
        mean_in = float(self._inputs.mean())
        mean_out = max(float(self._outputs.mean()), 1.0)
        per_request = math.ceil((int(mean_in) + int(mean_out)) / self.block_size)
        capacity = self.kv_blocks // max(per_request, 1)
        batch = self.runtime_batch_size(capacity)
        batch = max(1, min(batch, self.max_num_seqs))
        tokens = min(
            self.runtime_max_num_tokens(batch, mean_in, mean_out), self.max_num_batched_tokens
        )
        return batch, max(tokens, 1)

    def runtime_batch_size(self, capacity: int) -> int:
        """``getRuntimeBatchSize(capacity)``."""
        for bound, batch in self.table:
            if capacity < bound:
                return batch
        threshold = capacity // _FALLBACK_GRANULARITY * _FALLBACK_GRANULARITY
        if capacity < threshold + _FALLBACK_THRESHOLD:
            return threshold
        return capacity

    @staticmethod
    def runtime_max_num_tokens(batch: int, mean_in: float, mean_out: float) -> int:
        """``getRuntimeMaxNumTokens(batch)``."""
        adjusted = int(batch * mean_in / mean_out + batch)
        ratio = mean_in / mean_out
        if ratio > _RATIO_CONTEXT_HEAVY:
            floor = _TOKENS_CONTEXT_HEAVY
        elif ratio > _RATIO_BALANCED:
            floor = _TOKENS_BALANCED
        else:
            floor = _TOKENS_GEN_HEAVY
        return max(1 << math.ceil(math.log2(max(adjusted, 1))), floor)

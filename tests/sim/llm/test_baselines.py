"""TensorRT-LLM's dynamic batch tuner, as its code and its unit tests define it."""

from __future__ import annotations

import numpy as np

from adaptive_batcher.sim.llm.baselines import TrtllmDynamicBatchTuner


def tuner(**changes: int) -> TrtllmDynamicBatchTuner:
    settings = {
        "kv_blocks": 10_000,
        "block_size": 16,
        "max_num_seqs": 4096,
        "max_num_batched_tokens": 1 << 20,
    }
    settings.update(changes)
    return TrtllmDynamicBatchTuner(**settings)


def test_runtime_batch_size_follows_the_table_then_falls_back() -> None:
    t = tuner()
    # the cases of TensorRT-LLM's own test (DynamicBatchConfig.RuntimeBatchSize)
    cases = {143: 128, 335: 256, 671: 512, 831: 768, 1279: 1024, 1663: 1536, 2049: 2048, 1665: 1665}
    assert {capacity: t.runtime_batch_size(capacity) for capacity in cases} == cases


def test_runtime_max_num_tokens_by_the_input_output_ratio() -> None:
    t = TrtllmDynamicBatchTuner
    assert t.runtime_max_num_tokens(1, 100, 2) == 8192  # context heavy, floor
    assert t.runtime_max_num_tokens(256, 100, 2) == 16384  # 256 * 50 + 256 -> 2**14
    assert t.runtime_max_num_tokens(1, 100, 100) == 4096  # balanced
    assert t.runtime_max_num_tokens(1, 10, 100) == 2048  # generation heavy


def test_caps_from_the_moving_averages_of_the_active_requests() -> None:
    t = tuner(kv_blocks=51_000, max_num_seqs=1024, max_num_batched_tokens=8192, window=4)
    assert t.caps() is None
    t.update(np.array([1000, 1200]), np.array([200, 250]))
    t.update(np.array([1100, 1100, 1100]), np.array([210, 210, 210]))  # window 4: the last 4
    mean_in, mean_out = (1200 + 1100 * 3) / 4, (250 + 210 * 3) / 4
    per_request = -(-(int(mean_in) + int(mean_out)) // 16)
    capacity = 51_000 // per_request
    batch, tokens = t.caps()  # type: ignore[misc]
    assert batch == min(t.runtime_batch_size(capacity), 1024) and tokens == 8192

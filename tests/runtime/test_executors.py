"""Executors: where the model runs, and the CUDA "split" mode with a fake event (no GPU)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from adaptive_batcher import AdaptiveBatcher
from adaptive_batcher.testing import FakeCudaEvent


def recording_model(threads: list[str]) -> Any:
    def model(batch: list[int]) -> list[int]:
        threads.append(threading.current_thread().name)
        return [i * 2 for i in batch]

    return model


@pytest.mark.parametrize(
    ("executor", "on_loop_thread"), [("inline", True), ("thread", False), ("auto", False)]
)
async def test_sync_executors_run_where_they_say(executor: str, on_loop_thread: bool) -> None:
    threads: list[str] = []
    async with AdaptiveBatcher(
        recording_model(threads), max_batch_size=4, window_ms=1, executor=executor
    ) as batcher:
        assert await batcher.submit_many([1, 2, 3]) == [2, 4, 6]
    loop_thread = threading.current_thread().name
    assert all((name == loop_thread) is on_loop_thread for name in threads)
    if not on_loop_thread:
        assert all(name.startswith("adaptive-batcher-model") for name in threads)


async def test_cuda_executor_launches_on_loop_and_waits_in_a_thread() -> None:
    FakeCudaEvent.reset()
    gate = threading.Event()
    threads: list[str] = []
    batcher = AdaptiveBatcher(
        recording_model(threads),
        max_batch_size=4,
        window_ms=0,
        executor="cuda",
        cuda_event_factory=lambda: FakeCudaEvent(gate),
    )
    pending = asyncio.create_task(batcher.submit_many([1, 2]))
    await asyncio.sleep(0.020)
    # the "GPU" is still busy, yet the loop runs other work and the request is not done
    assert not pending.done()
    assert threads == [threading.current_thread().name]
    gate.set()
    assert await pending == [2, 4]
    await batcher.aclose()
    assert FakeCudaEvent.created == 1
    assert FakeCudaEvent.synchronized_threads[0].startswith("adaptive-batcher-cuda-wait")


def test_cuda_executor_without_gpu_is_refused_at_construction() -> None:
    import torch

    if torch.cuda.is_available():  # pragma: no cover - GPU machines run tests/gpu instead
        pytest.skip("a CUDA device is present")
    with pytest.raises(
        RuntimeError, match=r"needs a CUDA device \(torch.cuda.is_available\(\) is False\)"
    ):
        AdaptiveBatcher(lambda batch: batch, executor="cuda")


async def test_two_slots_run_batches_concurrently() -> None:
    running = 0
    peak = 0

    async def model(batch: list[int]) -> list[int]:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.020)
        running -= 1
        return batch

    async with AdaptiveBatcher(
        model, max_batch_size=2, window_ms=0, max_concurrent_batches=2
    ) as batcher:
        assert await batcher.submit_many(range(8)) == list(range(8))
    assert peak == 2


@pytest.mark.parametrize(
    ("model", "executor", "error", "message"),
    [
        (lambda b: b, "async", TypeError, "executor='async' needs an async def model"),
        (None, "inline", TypeError, "executor='inline' needs a sync model"),
        (lambda b: b, "gpu", ValueError, "executor must be one of auto, async, inline"),
        (
            lambda b: b,
            None,
            TypeError,
            "^executor must be a str, one of auto, async, inline, thread, cuda; got NoneType$",
        ),
    ],
)
def test_executor_mismatch_is_a_clear_error(
    model: Any, executor: str, error: type[Exception], message: str
) -> None:
    async def async_model(batch: list[int]) -> list[int]:
        return batch

    with pytest.raises(error, match=message):
        AdaptiveBatcher(model or async_model, executor=executor)

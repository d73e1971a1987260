"""A model in a worker thread should leave the event loop a core: the helper and the warning."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch
from structlog.testing import capture_logs

from adaptive_batcher import AdaptiveBatcher, _threads
from adaptive_batcher.runtime.threads import serving_threads


def test_serving_threads_leave_the_loop_a_core(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_threads.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    assert serving_threads() == 3
    monkeypatch.setattr(_threads.os, "sched_getaffinity", lambda pid: {5}, raising=False)
    assert serving_threads() == 1


def _bind_and_log(model: Any) -> list[dict[str, Any]]:
    async def main() -> None:
        async with AdaptiveBatcher(model, max_batch_size=4) as batcher:
            await batcher.submit(1)

    with capture_logs() as logs:
        asyncio.run(main())
    return [e for e in logs if e["event"] == "batcher.threads_oversubscribed"]


def sync_model(batch: list[int]) -> list[int]:
    return batch


async def async_model(batch: list[int]) -> list[int]:
    return batch


def test_torch_on_every_core_beside_a_worker_thread_is_warned_of(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_threads.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    previous = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        (warning,) = _bind_and_log(sync_model)
        assert warning["torch_threads"] == 2 and warning["cores"] == 2
        assert warning["advice"] == "torch.set_num_threads(1): leave the event loop a core"
        assert _bind_and_log(async_model) == []  # on the loop itself: no worker thread
        torch.set_num_threads(1)
        assert _bind_and_log(sync_model) == []
    finally:
        torch.set_num_threads(previous)

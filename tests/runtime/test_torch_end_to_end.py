"""A real torch model behind the batcher: each caller's result is the model applied to its item."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest
import torch

from adaptive_batcher import AdaptiveBatcher, concat_rows, row_count, stacked
from adaptive_batcher.examples.mlp import make_input, make_mlp, mlp_batch_fn

NET = make_mlp(in_features=256, hidden=256, out_features=32, seed=1)
FORWARD = mlp_batch_fn(NET)


def alone(x: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        out: torch.Tensor = NET(x.unsqueeze(0))[0]
    return out


def make_model(executor: str) -> Any:
    if executor == "async":

        async def forward_async(x: torch.Tensor) -> torch.Tensor:
            await asyncio.sleep(0)
            return FORWARD(x)  # type: ignore[no-any-return]

        return stacked(forward_async)
    return stacked(FORWARD)


@pytest.mark.parametrize("executor", ["inline", "thread", "async"])
async def test_concurrent_submitters_each_get_their_own_result(executor: str) -> None:
    inputs = [make_input(256, seed=i) for i in range(300)]
    async with AdaptiveBatcher(
        make_model(executor), max_batch_size=32, window_ms=2, executor=executor
    ) as batcher:

        async def client(i: int) -> torch.Tensor:
            await asyncio.sleep(random.random() * 0.02)
            result: torch.Tensor = await batcher.submit(inputs[i])
            return result

        outputs = await asyncio.gather(*(client(i) for i in range(len(inputs))))
    for x, y in zip(inputs, outputs, strict=True):
        assert y.shape == (32,)
        torch.testing.assert_close(y, alone(x), rtol=1e-4, atol=1e-5)
    stats = batcher.stats()
    assert stats.counts.completed == 300
    assert stats.counts.mean_batch_size > 1.5  # batching really happened


async def test_row_blocks_through_a_torch_model() -> None:
    blocks = [torch.randn(r, 256) for r in [1, 2, 5, 3, 1, 8]]
    async with AdaptiveBatcher(
        concat_rows(FORWARD), max_batch_size=8, window_ms=2, size_fn=row_count
    ) as batcher:
        outputs = await batcher.submit_many(blocks)
    for x, y in zip(blocks, outputs, strict=True):
        assert y.shape == (x.shape[0], 32)
        with torch.inference_mode():
            torch.testing.assert_close(y, NET(x), rtol=1e-4, atol=1e-5)

"""The public API's types as a user's ``mypy --strict`` sees them (a model of each kind)."""

from __future__ import annotations

from pathlib import Path

import pytest

mypy_api = pytest.importorskip("mypy.api", reason="mypy is a dev dependency")

USER_CODE = """
from collections.abc import AsyncIterator
from typing import assert_type

from adaptive_batcher import AdaptiveBatcher, BatchedStream, Stream, batched


async def tokens(batch: list[str]) -> AsyncIterator[list[str]]:
    for step in range(3):
        yield [f"{text}{step}" for text in batch]


def doubled(batch: list[int]) -> list[int]:
    return [x * 2 for x in batch]


async def halved(batch: list[int]) -> list[float]:
    return [x / 2 for x in batch]


@batched(max_batch_size=4)
async def generate(prompts: list[str]) -> AsyncIterator[list[str]]:
    yield prompts


@batched()
def scaled(xs: list[int]) -> list[float]:
    return [x / 2 for x in xs]


class Rows:  # one row per item, not a Sequence (as a tensor or an array)

    def __len__(self) -> int:
        return 1

    def __getitem__(self, index: int) -> float:
        return 0.0


@batched()
def as_rows(xs: list[int]) -> Rows:
    return Rows()


class Service:
    @batched(max_batch_size=4)
    async def generate(self, prompts: list[str]) -> AsyncIterator[list[str]]:
        yield prompts

    @batched()
    async def embed(self, texts: list[str]) -> list[list[float]]:
        return [[1.0] for _ in texts]


async def main() -> None:
    streaming = AdaptiveBatcher(tokens)
    stream = streaming.submit_stream("a")
    assert_type(stream, Stream[str])
    async for token in stream:
        assert_type(token, str)
    assert_type(await AdaptiveBatcher(doubled).submit(1), int)
    assert_type(await AdaptiveBatcher(halved).submit(1), float)
    assert_type(generate, BatchedStream[str, str])
    async for token in generate("a"):
        assert_type(token, str)
    assert_type(await scaled(1), float)
    service = Service()
    assert_type(service.generate("a"), Stream[str])
    assert_type(await service.embed("a"), list[float])
    await generate.aclose(timeout_s=1.0)
    await as_rows(1)  # results not a Sequence: untyped, but no error
"""


def test_models_of_every_kind_type_check(tmp_path: Path) -> None:
    """A sync, an ``async def`` and an async generator (streaming) model each give the
    batcher, and ``@batched`` on a function or a method, their item and result types, with no
    error under ``--strict``."""
    module = tmp_path / "user_service.py"
    module.write_text(USER_CODE, encoding="utf-8")
    cache = str(tmp_path / "mypy_cache")
    out, err, status = mypy_api.run(["--strict", "--cache-dir", cache, str(module)])
    assert status == 0, out + err
    assert "Success" in out

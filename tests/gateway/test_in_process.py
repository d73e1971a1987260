"""InProcessEngine: an async generator function as an engine; closing early aborts once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from adaptive_batcher.gateway import (
    Chunk,
    Engine,
    InProcessEngine,
    LLMRequest,
    UpstreamUnavailableError,
    Usage,
)
from tests.gateway.fakes import until

REQUEST = LLMRequest({"prompt": "hi"}, prompt_tokens=1)


class Recorder:
    """``generate`` yielding ``items`` (raising any exception among them, waiting on
    ``hold`` after them when set), and ``abort`` recording its calls."""

    def __init__(self, *items: Any, hold: bool = False) -> None:
        self.items = items
        self.hold = hold
        self.calls = 0
        self.closed = False
        self.aborted: list[LLMRequest] = []
        self.engine = InProcessEngine(self.generate, abort=self.abort)

    async def generate(self, request: LLMRequest) -> AsyncIterator[Any]:
        self.calls += 1
        try:
            for item in self.items:
                if isinstance(item, BaseException):
                    raise item
                yield item
            if self.hold:
                await asyncio.Event().wait()
        finally:
            self.closed = True

    async def abort(self, request: LLMRequest) -> None:
        self.aborted.append(request)


async def test_strings_are_one_token_chunks_and_chunks_pass_as_they_are() -> None:
    last = Chunk({"delta": "!"}, tokens=3, usage=Usage(1, 5))
    recorder = Recorder("a", "b", last)
    assert isinstance(recorder.engine, Engine)
    chunks = [chunk async for chunk in recorder.engine.stream(REQUEST)]
    assert chunks == [Chunk("a"), Chunk("b"), last]
    assert recorder.aborted == []


async def test_closing_after_the_end_aborts_nothing() -> None:
    recorder = Recorder("a")
    stream = recorder.engine.stream(REQUEST)
    assert [c.data async for c in stream] == ["a"]
    await stream.aclose()  # type: ignore[attr-defined]
    assert recorder.aborted == []


async def test_closing_early_closes_the_generator_and_aborts_once() -> None:
    recorder = Recorder("a", "b")
    stream = recorder.engine.stream(REQUEST)
    assert (await stream.__anext__()).data == "a"
    await stream.aclose()  # type: ignore[attr-defined]
    await stream.aclose()  # type: ignore[attr-defined]
    assert recorder.closed
    assert recorder.aborted == [REQUEST]
    with pytest.raises(StopAsyncIteration):
        await stream.__anext__()


async def test_closing_before_the_first_read_starts_nothing() -> None:
    recorder = Recorder("a")
    stream = recorder.engine.stream(REQUEST)
    await stream.aclose()  # type: ignore[attr-defined]
    assert recorder.calls == 0 and recorder.aborted == []


async def test_a_cancelled_read_leaves_an_abort_for_the_close() -> None:
    recorder = Recorder(hold=True)
    stream = recorder.engine.stream(REQUEST)
    reader = asyncio.ensure_future(stream.__anext__())
    await until(lambda: recorder.calls == 1)
    reader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reader
    await stream.aclose()  # type: ignore[attr-defined]
    assert recorder.aborted == [REQUEST]


async def test_an_error_of_generate_propagates_and_leaves_nothing_to_abort() -> None:
    failure = RuntimeError("model crashed")
    recorder = Recorder("a", failure)
    stream = recorder.engine.stream(REQUEST)
    await stream.__anext__()
    with pytest.raises(RuntimeError) as caught:
        await stream.__anext__()
    assert caught.value is failure
    await stream.aclose()  # type: ignore[attr-defined]
    assert recorder.aborted == []


async def test_an_item_of_another_type_is_a_type_error() -> None:
    recorder = Recorder(b"bytes")
    with pytest.raises(TypeError, match="generate must yield Chunk or str items, got bytes"):
        await recorder.engine.stream(REQUEST).__anext__()


async def test_generate_must_return_an_async_iterator() -> None:
    def generate(request: LLMRequest) -> Any:
        return ["not", "async"]

    engine = InProcessEngine(generate)
    with pytest.raises(TypeError, match="generate must return an async iterator, got list"):
        await engine.stream(REQUEST).__anext__()


async def test_a_closed_engine_refuses_new_streams() -> None:
    recorder = Recorder("a")
    engine = recorder.engine
    await engine.aclose()
    await engine.aclose()
    assert engine.closed
    with pytest.raises(UpstreamUnavailableError):
        await engine.stream(REQUEST).__anext__()
    assert recorder.calls == 0


async def test_an_abort_runs_even_when_closing_the_generator_fails() -> None:
    aborted: list[LLMRequest] = []

    async def generate(request: LLMRequest) -> AsyncIterator[str]:
        try:
            yield "a"
            yield "b"
        finally:
            raise OSError("cleanup failed")

    async def abort(request: LLMRequest) -> None:
        aborted.append(request)

    stream = InProcessEngine(generate, abort=abort).stream(REQUEST)
    await stream.__anext__()
    with pytest.raises(OSError, match="cleanup failed"):
        await stream.aclose()  # type: ignore[attr-defined]
    assert aborted == [REQUEST]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"generate": 3}, "generate must be callable"), ({"abort": "no"}, "abort must be callable")],
)
def test_arguments_must_be_callable(kwargs: dict[str, Any], match: str) -> None:
    arguments: dict[str, Any] = {"generate": Recorder().generate, **kwargs}
    generate = arguments.pop("generate")
    with pytest.raises(TypeError, match=match):
        InProcessEngine(generate, **arguments)

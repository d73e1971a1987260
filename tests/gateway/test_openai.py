"""OpenAIEngine against the fake engine (in process, httpx's ASGI transport), and against
transports that fail or stall on cue (httpx's mock transport with a controlled body)."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from adaptive_batcher.gateway import openai as openai_module
from adaptive_batcher.gateway.errors import (
    UpstreamEventError,
    UpstreamHTTPError,
    UpstreamProtocolError,
    UpstreamTimeoutError,
    UpstreamUnavailableError,
)
from adaptive_batcher.gateway.openai import (
    OpenAIEngine,
    estimate_prompt_tokens,
    event_tokens,
    requested_max_tokens,
    upstream_payload,
)
from adaptive_batcher.gateway.sse import SSESplitter, event_data
from adaptive_batcher.gateway.types import Chunk, Engine, LLMRequest, Usage
from tests.gateway.fake_openai import FakeOpenAI
from tests.gateway.servers import serving


def fake_engine(fake: FakeOpenAI, **kwargs: Any) -> OpenAIEngine:
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=fake))
    return OpenAIEngine("http://fake", client=client, **kwargs)


async def collect(engine: OpenAIEngine, request: LLMRequest) -> list[Chunk]:
    return [chunk async for chunk in engine.stream(request)]


async def test_events_are_forwarded_byte_for_byte_with_usage() -> None:
    fake = FakeOpenAI()
    engine = fake_engine(fake)
    payload = {"model": "fake", "prompt": "hello", "max_tokens": 3, "temperature": 0.5}
    chunks = await collect(engine, LLMRequest(payload))
    # the body sent: the client's fields unchanged, streaming and usage forced on
    assert fake.bodies == [{**payload, "stream": True, "stream_options": {"include_usage": True}}]
    assert payload == {"model": "fake", "prompt": "hello", "max_tokens": 3, "temperature": 0.5}
    datas = [event_data(c.data) for c in chunks]
    assert [json.loads(d)["choices"][0]["text"] for d in datas[:3]] == ["t0", "t1", "t2"]
    assert datas[-1] == "[DONE]"
    assert [c.tokens for c in chunks] == [1, 1, 1, 0, 0]
    assert chunks[3].usage == Usage(prompt_tokens=7, completion_tokens=3)
    assert [c.usage for c in chunks[:3]] == [None, None, None]
    assert all(c.data.startswith(b"data: ") and c.data.endswith(b"\n\n") for c in chunks)
    await engine.aclose()


async def test_a_chat_stream_counts_content_not_the_role_event() -> None:
    fake = FakeOpenAI()
    engine = fake_engine(fake)
    payload = {"messages": [{"role": "user", "content": "hi"}], "stream_options": {"x": 1}}
    chunks = await collect(engine, LLMRequest(payload, path="/v1/chat/completions"))
    assert [c.tokens for c in chunks] == [0, 1, 1, 1, 0, 0]
    assert fake.bodies[0]["stream_options"] == {"x": 1, "include_usage": True}
    assert isinstance(engine, Engine)


async def test_an_error_status_is_an_upstream_http_error() -> None:
    engine = fake_engine(FakeOpenAI())
    with pytest.raises(UpstreamHTTPError) as caught:
        await collect(engine, LLMRequest({"prompt": "x", "fake_status": 500}))
    assert caught.value.status == 500 and caught.value.http_status == 500
    assert not isinstance(caught.value, UpstreamEventError)
    assert str(caught.value).startswith("the engine answered HTTP 500: ")
    assert json.loads(caught.value.body)["error"]["message"] == "fake failure"


async def test_an_error_event_mid_stream_is_an_upstream_event_error() -> None:
    engine = fake_engine(FakeOpenAI())
    with pytest.raises(UpstreamEventError) as caught:
        await collect(engine, LLMRequest({"prompt": "x", "fake_error_event": True}))
    assert caught.value.status == 400  # the event's code, kept
    assert caught.value.http_status == 502  # the engine failed after accepting the request
    assert "fake engine error" in caught.value.body
    # no HTTP error was answered: the message says what happened, in the engine's words
    assert str(caught.value) == "the engine sent an error event mid-stream: fake engine error"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ('{"error": {"message": "boom", "code": 400}}', "boom"),
        ('{"error": "boom"}', "boom"),
        ('{"object": "error", "message": "boom"}', "boom"),
        ('{"error": {"code": 3}}', '{"error": {"code": 3}}'),
    ],
)
def test_an_error_events_message_is_the_engines_words(data: str, message: str) -> None:
    error = UpstreamEventError(500, data)
    assert str(error) == f"the engine sent an error event mid-stream: {message}"


async def test_a_stream_broken_off_before_done_is_a_protocol_error() -> None:
    engine = fake_engine(FakeOpenAI())
    stream = engine.stream(LLMRequest({"prompt": "x", "fake_break_after": 2}))
    assert [(await anext(stream)).tokens for _ in range(2)] == [1, 1]
    with pytest.raises(UpstreamProtocolError, match=r"ended before data: \[DONE\]"):
        await anext(stream)


async def test_an_event_that_is_not_json_is_a_protocol_error() -> None:
    engine = fake_engine(FakeOpenAI())
    with pytest.raises(UpstreamProtocolError, match="not JSON"):
        await collect(engine, LLMRequest({"prompt": "x", "fake_invalid_json": True}))


async def test_a_refused_connection_is_upstream_unavailable() -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    engine = OpenAIEngine(f"http://127.0.0.1:{port}")
    with pytest.raises(UpstreamUnavailableError) as caught:
        await collect(engine, LLMRequest({"prompt": "x"}))
    assert caught.value.http_status == 502
    await engine.aclose()


@pytest.mark.parametrize(
    ("raised", "expected"),
    [
        (httpx.ConnectError("refused"), UpstreamUnavailableError),
        (httpx.ReadError("reset"), UpstreamUnavailableError),
        (httpx.RemoteProtocolError("closed without a response"), UpstreamUnavailableError),
        (httpx.ConnectTimeout("slow"), UpstreamTimeoutError),
        (httpx.ReadTimeout("slow"), UpstreamTimeoutError),
        (httpx.PoolTimeout("busy"), UpstreamTimeoutError),
    ],
)
async def test_transport_errors_before_an_answer_map_to_typed_errors(
    raised: Exception, expected: type[Exception]
) -> None:
    def fail(request: httpx.Request) -> httpx.Response:
        raise raised

    engine = OpenAIEngine("http://x", client=httpx.AsyncClient(transport=httpx.MockTransport(fail)))
    with pytest.raises(expected):
        await collect(engine, LLMRequest({"prompt": "x"}))


class ControlledBody(httpx.AsyncByteStream):
    """A response body that yields the pieces put in :attr:`pieces` (None: the end; an
    exception: raised) and records its closing."""

    def __init__(self) -> None:
        self.pieces: asyncio.Queue[bytes | Exception | None] = asyncio.Queue()
        self.closed = asyncio.Event()

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while (piece := await self.pieces.get()) is not None:
            if isinstance(piece, Exception):
                raise piece
            yield piece

    async def aclose(self) -> None:
        self.closed.set()


def controlled_engine(body: ControlledBody, **kwargs: Any) -> OpenAIEngine:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=body)

    client = httpx.AsyncClient(transport=httpx.MockTransport(answer))
    return OpenAIEngine("http://x", client=client, **kwargs)


TOKEN = b'data: {"choices": [{"index": 0, "text": "a"}]}\n\n'


async def test_closing_the_iterator_early_closes_the_response() -> None:
    body = ControlledBody()
    stream = controlled_engine(body).stream(LLMRequest({"prompt": "x"}))
    body.pieces.put_nowait(TOKEN)
    first = await anext(stream)
    assert first.data == TOKEN and first.tokens == 1
    assert not body.closed.is_set()
    await stream.aclose()  # type: ignore[attr-defined]
    assert body.closed.is_set()


async def test_events_split_across_reads_are_joined() -> None:
    body = ControlledBody()
    stream = controlled_engine(body).stream(LLMRequest({"prompt": "x"}))
    for piece in (TOKEN[:10], TOKEN[10:] + b"data: [DO", b"NE]\r\n\r\n"):
        body.pieces.put_nowait(piece)
    chunks = [c async for c in stream]
    assert [c.data for c in chunks] == [TOKEN, b"data: [DONE]\r\n\r\n"]
    assert body.closed.is_set()


async def test_a_stall_after_the_first_event_is_a_timeout() -> None:
    body = ControlledBody()
    stream = controlled_engine(body, chunk_timeout_s=0.05).stream(LLMRequest({"prompt": "x"}))
    body.pieces.put_nowait(TOKEN)
    await anext(stream)
    with pytest.raises(UpstreamTimeoutError, match="no next event"):
        await anext(stream)  # nothing more is ever put
    assert body.closed.is_set()


async def test_no_first_event_in_time_is_a_timeout() -> None:
    body = ControlledBody()
    stream = controlled_engine(body, first_chunk_timeout_s=0.05).stream(LLMRequest({"prompt": "x"}))
    with pytest.raises(UpstreamTimeoutError, match="no first event"):
        await anext(stream)


async def test_a_read_error_mid_stream_is_a_protocol_error() -> None:
    body = ControlledBody()
    stream = controlled_engine(body).stream(LLMRequest({"prompt": "x"}))
    body.pieces.put_nowait(TOKEN)
    body.pieces.put_nowait(httpx.ReadError("connection reset"))
    await anext(stream)
    with pytest.raises(UpstreamProtocolError, match="broke off"):
        await anext(stream)


async def test_the_api_key_replaces_the_clients_authorization() -> None:
    seen: list[httpx.Headers] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers)
        return httpx.Response(200, stream=httpx.ByteStream(b"data: [DONE]\n\n"))

    client = httpx.AsyncClient(transport=httpx.MockTransport(answer))
    headers = {"authorization": "Bearer client"}
    await collect(OpenAIEngine("http://x", client=client), LLMRequest({}, headers=headers))
    await collect(
        OpenAIEngine("http://x", client=client, api_key="k"), LLMRequest({}, headers=headers)
    )
    assert [h["authorization"] for h in seen] == ["Bearer client", "Bearer k"]


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="base_url"):
        OpenAIEngine("127.0.0.1:8000")
    with pytest.raises(ValueError, match="chunk_timeout_s"):
        OpenAIEngine("http://x", chunk_timeout_s=0)
    with pytest.raises(TypeError, match="client"):
        OpenAIEngine("http://x", client=object())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="payload"):
        upstream_payload([1, 2])


def test_prompt_estimates_and_budgets() -> None:
    assert estimate_prompt_tokens({"prompt": "x" * 9}) == 3
    assert estimate_prompt_tokens({"prompt": [1, 2, 3, 4, 5]}) == 5
    assert estimate_prompt_tokens({"prompt": ["abcd", "abcdefgh"]}) == 3
    messages = [
        {"role": "system", "content": "abcd"},
        {"role": "user", "content": [{"type": "text", "text": "abcd"}, {"type": "image_url"}]},
    ]
    assert estimate_prompt_tokens({"messages": messages}) == 2
    assert estimate_prompt_tokens({"neither": 1}) == 0
    assert estimate_prompt_tokens("text") == 0
    assert requested_max_tokens({"max_tokens": 12}) == 12
    assert requested_max_tokens({"max_completion_tokens": 5}) == 5
    assert requested_max_tokens({"max_tokens": "12"}) is None
    assert requested_max_tokens({"max_tokens": True}) is None


def test_event_tokens_counts_choices_with_new_output() -> None:
    assert event_tokens({"choices": [{"text": "a"}, {"text": ""}, {"text": "b"}]}) == 2
    assert event_tokens({"choices": [{"delta": {"role": "assistant", "content": ""}}]}) == 0
    assert event_tokens({"choices": [{"delta": {"tool_calls": [{"index": 0}]}}]}) == 1
    assert event_tokens({"choices": [], "usage": {"prompt_tokens": 1}}) == 0


def test_the_splitter_keeps_events_whole_and_reads_data() -> None:
    splitter = SSESplitter()
    assert splitter.feed(b"data: a\n") == []
    assert splitter.feed(b"\n: keep-alive\n\ndata: b\r\n") == [b"data: a\n\n", b": keep-alive\n\n"]
    assert splitter.pending == b"data: b\r\n"
    assert splitter.feed(b"data: c\r\n\r\n") == [b"data: b\r\ndata: c\r\n\r\n"]
    assert event_data(b"data: b\r\ndata:c\r\n\r\n") == "b\nc"
    assert event_data(b": keep-alive\n\n") is None


class EndedBody(ControlledBody):
    """A :class:`ControlledBody` that records whether its end was read."""

    def __init__(self) -> None:
        super().__init__()
        self.ended = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for piece in super().__aiter__():
            yield piece
        self.ended = True


async def test_the_body_after_done_is_read_to_its_end() -> None:
    body = EndedBody()
    stream = controlled_engine(body).stream(LLMRequest({"prompt": "x"}))
    for piece in (TOKEN, b"data: [DONE]\n\n", b"", None):
        body.pieces.put_nowait(piece)
    chunks = [c async for c in stream]
    assert [c.data for c in chunks] == [TOKEN, b"data: [DONE]\n\n"]
    assert body.ended and body.closed.is_set()


async def test_a_body_that_never_ends_after_done_is_given_up_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(openai_module, "DRAIN_TIMEOUT_S", 0.05)
    body = EndedBody()
    stream = controlled_engine(body).stream(LLMRequest({"prompt": "x"}))
    body.pieces.put_nowait(b"data: [DONE]\n\n")  # and nothing more, ever
    async with asyncio.timeout(5):
        chunks = [c async for c in stream]
    assert len(chunks) == 1 and not body.ended and body.closed.is_set()


async def test_a_body_that_goes_on_after_done_is_cut_off() -> None:
    body = EndedBody()
    stream = controlled_engine(body).stream(LLMRequest({"prompt": "x"}))
    body.pieces.put_nowait(b"data: [DONE]\n\n")
    for _ in range(openai_module.MAX_DRAIN_BYTES // len(TOKEN) + 2):
        body.pieces.put_nowait(TOKEN)  # never read as chunks: the stream ended at [DONE]
    async with asyncio.timeout(5):
        chunks = [c async for c in stream]
    assert len(chunks) == 1 and not body.ended and body.closed.is_set()


async def test_streams_one_after_another_share_one_connection() -> None:
    fake = FakeOpenAI()
    async with serving(fake) as url:
        engine = OpenAIEngine(url)
        for _ in range(5):
            chunks = await collect(engine, LLMRequest({"prompt": "x", "fake_tokens": 2}))
            assert event_data(chunks[-1].data) == "[DONE]"
        await engine.aclose()
    assert len(fake.clients) == 5 and len(set(fake.clients)) == 1, fake.clients

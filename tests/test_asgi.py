"""BodyLimit: bodies over the bound get 413 before the app reads them."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from adaptive_batcher.asgi import BodyLimit

READS: list[int] = []


async def echo_length(scope: Any, receive: Any, send: Any) -> None:
    """An ASGI app that reads the whole body and answers its length."""
    if scope["type"] != "http":
        return
    size, more = 0, True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            return  # the client (or BodyLimit) gave up
        size += len(message.get("body", b""))
        more = message.get("more_body", False)
    READS.append(size)
    body = str(size).encode()
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": body})


def post(body: Any, max_bytes: int = 100, **headers: str) -> httpx.Response:
    async def main() -> httpx.Response:
        transport = httpx.ASGITransport(app=BodyLimit(echo_length, max_bytes=max_bytes))
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await client.post("/", content=body, headers=headers)

    return asyncio.run(main())


async def chunks(total: int, size: int = 10) -> AsyncIterator[bytes]:
    for _ in range(total // size):
        yield b"x" * size


def test_a_body_within_the_bound_reaches_the_app() -> None:
    READS.clear()
    assert post(b"x" * 100).text == "100"
    assert post(chunks(100)).text == "100"
    assert READS == [100, 100]


def post_limited(body: Any, limit: BodyLimit, **headers: str) -> httpx.Response:
    async def main() -> httpx.Response:
        transport = httpx.ASGITransport(app=limit)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await client.post("/", content=body, headers=headers)

    return asyncio.run(main())


def test_a_sized_body_over_the_bound_is_refused_unread() -> None:
    READS.clear()
    answer = post(b"x" * 101)
    assert answer.status_code == 413
    assert answer.json() == {"error": "RequestBodyTooLarge", "max_bytes": 100}
    assert "connection" not in answer.headers  # drained to its end: the connection is clean
    assert READS == []


def test_a_refused_body_past_the_drain_bound_closes_the_connection() -> None:
    READS.clear()
    limit = BodyLimit(echo_length, max_bytes=100, drain_bytes=1000)
    sized = post_limited(b"x" * 1001, limit)
    chunked = post_limited(chunks(2000), limit)
    assert (sized.status_code, chunked.status_code) == (413, 413)
    assert sized.headers["connection"] == chunked.headers["connection"] == "close"
    assert "connection" not in post_limited(chunks(1000), limit).headers  # within: drained
    assert READS == []


def test_a_client_that_expects_100_continue_is_drained_within_the_read_deadline() -> None:
    """Answered before its body, the server would drop that body with no time limit (a fresh
    user's trickle held a uvicorn connection for good): it is drained as any other."""
    READS.clear()
    limit = BodyLimit(echo_length, max_bytes=5, read_timeout_s=0.2)
    expecting = {"expect": "100-continue", "content-length": "20"}
    sent = post_limited(b"x" * 20, limit, **expecting)
    trickled = post_limited(stalled(b"x" * 10, wait_s=30.0), limit, **expecting)
    assert (sent.status_code, trickled.status_code) == (413, 413)
    assert "connection" not in sent.headers  # drained to its end: the connection stays
    assert trickled.headers["connection"] == "close"  # the deadline ended the drain
    assert READS == []


def test_a_refused_body_that_stops_arriving_is_answered_at_the_read_deadline() -> None:
    async def main() -> tuple[httpx.Response, float]:
        limit = BodyLimit(echo_length, max_bytes=5, read_timeout_s=0.2)
        transport = httpx.ASGITransport(app=limit)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            started = asyncio.get_running_loop().time()
            answer = await client.post("/", content=stalled(b"x" * 10, wait_s=30.0))
            return answer, asyncio.get_running_loop().time() - started

    answer, took_s = asyncio.run(main())
    assert answer.status_code == 413
    assert answer.headers["connection"] == "close"
    assert took_s < 5.0  # the read deadline, not the stalled client, ends the drain


def test_a_real_client_reads_the_413_of_a_large_body_and_keeps_its_connection() -> None:
    """Before: the 413 closed the connection while the client was still sending, so uvicorn's
    close reset it and an httpx client got ``ReadError`` in place of the answer."""
    from tests.gateway.servers import serving

    body = b"x" * 8_000_000

    async def main() -> list[int]:
        limit = BodyLimit(echo_length, max_bytes=64 * 1024, read_timeout_s=10.0)
        async with serving(limit) as url, httpx.AsyncClient(base_url=url, timeout=30.0) as client:
            statuses = [(await client.post("/", content=body)).status_code for _ in range(3)]
            expecting = {"expect": "100-continue"}  # httpx sends the body without waiting
            answer = await client.post("/", content=body, headers=expecting)
            statuses.append(answer.status_code)
            statuses.append((await client.post("/", content=b"x" * 10)).status_code)
            return statuses

    assert asyncio.run(main()) == [413, 413, 413, 413, 200]


def test_a_chunked_body_is_refused_once_it_passes_the_bound() -> None:
    READS.clear()
    answer = post(chunks(1000))
    assert answer.status_code == 413
    assert READS == []  # the app never finished reading it


def test_an_unreadable_content_length_is_a_400() -> None:
    assert post(b"x", **{"content-length": "ten"}).status_code == 400


@pytest.mark.parametrize(("value", "error"), [(-1, ValueError), (1.5, TypeError)])
def test_the_bound_is_checked(value: Any, error: type[Exception]) -> None:
    with pytest.raises(error, match=r"BodyLimit\.max_bytes must be"):
        BodyLimit(echo_length, max_bytes=value)
    with pytest.raises(error, match=r"BodyLimit\.drain_bytes must be"):
        BodyLimit(echo_length, max_bytes=100, drain_bytes=value)


async def stalled(first: bytes, wait_s: float) -> AsyncIterator[bytes]:
    yield first
    await asyncio.sleep(wait_s)  # the client stops sending, as a stalled upload does
    yield b"x"


async def slow_app(scope: Any, receive: Any, send: Any) -> None:
    """Reads the whole body, then takes its time to answer."""
    await echo_length(scope, receive, _later(send))


def _later(send: Any) -> Any:
    async def later(message: Any) -> None:
        await asyncio.sleep(0.3)
        await send(message)

    return later


def post_timed(body: Any, app: Any = echo_length, read_timeout_s: float = 0.2) -> httpx.Response:
    async def main() -> httpx.Response:
        limited = BodyLimit(app, max_bytes=100, read_timeout_s=read_timeout_s)
        transport = httpx.ASGITransport(app=limited)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await client.post("/", content=body)

    return asyncio.run(main())


def test_a_body_that_stops_arriving_gets_a_408_and_the_app_stops_reading() -> None:
    """Before: half a body, then nothing, held the request unanswered for good (and uvicorn's
    shutdown with it)."""
    READS.clear()
    answer = post_timed(stalled(b"x" * 10, wait_s=30.0))
    assert answer.status_code == 408
    assert answer.json() == {"error": "RequestBodyTimeout", "read_timeout_s": 0.2}
    assert answer.headers["connection"] == "close"  # the rest of the body is no next request
    assert READS == []


def test_a_body_in_time_reaches_the_app_and_the_answer_is_not_timed() -> None:
    READS.clear()
    assert post_timed(stalled(b"x" * 10, wait_s=0.05)).text == "11"
    assert post_timed(b"x" * 50, app=slow_app).text == "50"  # answered 0.3 s after the body
    assert READS == [11, 50]


@pytest.mark.parametrize(
    ("value", "error"), [(0, ValueError), (math.inf, ValueError), ("1", TypeError)]
)
def test_the_read_timeout_is_checked(value: Any, error: type[Exception]) -> None:
    with pytest.raises(error, match=r"BodyLimit\.read_timeout_s must be"):
        BodyLimit(echo_length, max_bytes=100, read_timeout_s=value)


async def answers_unread(scope: Any, receive: Any, send: Any) -> None:
    """Answers at once, never reading the body (a health check, an early 401)."""
    del receive
    if scope["type"] == "http":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


def test_an_answer_to_a_body_the_app_never_reads_waits_for_it_within_the_deadline() -> None:
    """Before: the answer went at once and the server dropped a trickled rest of the body
    with no time limit (a fresh user's trickle held a uvicorn connection past 15 s)."""
    limit = BodyLimit(answers_unread, max_bytes=100, read_timeout_s=0.2)
    prompt = post_limited(b"x" * 50, limit)
    trickled = post_limited(stalled(b"x" * 10, wait_s=30.0), limit)
    assert (prompt.text, trickled.text) == ("ok", "ok")  # the app's answer, unchanged
    assert "connection" not in prompt.headers  # its body came: the connection stays
    assert trickled.headers["connection"] == "close"  # the deadline ended the wait


def test_a_request_without_a_body_is_answered_as_the_app_says() -> None:
    async def main() -> httpx.Response:
        limit = BodyLimit(answers_unread, max_bytes=100, read_timeout_s=0.2)
        transport = httpx.ASGITransport(app=limit)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await client.get("/")

    answer = asyncio.run(main())
    assert (answer.status_code, answer.text) == (200, "ok")
    assert "connection" not in answer.headers


async def starts_then_reads(scope: Any, receive: Any, send: Any) -> None:
    """Sends its answer's start before it reads the body."""
    if scope["type"] == "http":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await echo_length(scope, receive, _body_only(send))


def _body_only(send: Any) -> Any:
    async def body_only(message: Any) -> None:
        if message["type"] == "http.response.body":
            await send(message)

    return body_only


def test_an_app_that_starts_its_answer_before_reading_still_gets_its_413() -> None:
    """Before: the start had gone out, so the client read a truncated 200 in place of a 413."""
    READS.clear()
    limit = BodyLimit(starts_then_reads, max_bytes=100)
    assert post_limited(chunks(1000), limit).status_code == 413
    assert post_limited(chunks(100), limit).text == "100"
    assert READS == [100]


async def streams_unread(scope: Any, receive: Any, send: Any) -> None:
    """Streams its answer without reading the body."""
    del receive
    if scope["type"] == "http":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"a", "more_body": True})
        await send({"type": "http.response.body", "body": b"b"})


def test_a_streamed_answer_goes_at_once_and_closes_when_the_body_is_unread() -> None:
    limit = BodyLimit(streams_unread, max_bytes=100, read_timeout_s=5.0)
    answer = post_limited(b"x" * 50, limit)
    assert answer.text == "ab"
    assert answer.headers["connection"] == "close"  # the server would drop the rest untimed


async def reads_then_streams(scope: Any, receive: Any, send: Any) -> None:
    """Sends its start, reads the whole body, then streams its answer."""
    if scope["type"] == "http":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        more = True
        while more:
            more = (await receive()).get("more_body", False)
        await send({"type": "http.response.body", "body": b"a", "more_body": True})
        await send({"type": "http.response.body", "body": b"b"})


def test_a_streamed_answer_after_the_whole_body_keeps_the_connection() -> None:
    """A fresh user's finding: the start was closed for any stream, the body read or not."""
    answer = post_limited(b"x" * 50, BodyLimit(reads_then_streams, max_bytes=100))
    assert answer.text == "ab"
    assert "connection" not in answer.headers

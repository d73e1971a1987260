"""A fake OpenAI-compatible engine for the gateway's tests: an ASGI app that streams SSE the way
vLLM does, told what to do by fields of each request's JSON body (the gateway forwards them):

* ``fake_tokens`` (3): token events before the finish, texts ``t0``, ``t1``, ...;
* ``fake_status`` (int): answer with that HTTP status and an OpenAI error body instead;
* ``fake_break_after`` (int): end the body after that many token events, without ``[DONE]``;
* ``fake_stall_after`` (int): after that many token events, send nothing until the client
  disconnects;
* ``fake_invalid_json``: send an event that is not JSON;
* ``fake_error_event``: send an error event, as vLLM does for an error mid-stream;
* ``fake_hold``: wait for :attr:`FakeOpenAI.release` (an event, in process) before the first
  token;
* ``fake_interval_ms`` (0): sleep that long before each token event;
* ``fake_stamp``: each token's text is the ``time.monotonic_ns()`` at which it is sent (one
  clock for every process on the machine), for timing a chunk from the engine to a client.

``GET /health`` answers :attr:`FakeOpenAI.health_status` (200), or nothing while
:attr:`FakeOpenAI.health_hold` is set, and counts the checks (:attr:`health_checks`).

It records every body received (:attr:`FakeOpenAI.bodies`), its ``authorization`` and query
string, counts
the streams active and the clients that disconnected mid-stream (:attr:`disconnects`, with an
event per count reached: :meth:`wait_disconnects`), and serves
``/metrics`` (vLLM names) and ``/v1/models``. Out of
process, ``GET /fake/wait?disconnects=N&active=N`` waits (at most 10 s) until at least that
many disconnects happened and exactly that many streams are active, then returns the counts.

Run as a server: ``python -m tests.gateway.fake_openai --port 0`` prints
``fake engine on port N`` once it listens.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from adaptive_batcher.gateway.listener import tcp_listener

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class FakeOpenAI:
    """The fake engine (see the module)."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.authorizations: list[str | None] = []
        self.active = 0
        self.disconnects = 0
        self.completed = 0
        self.release = asyncio.Event()
        self.started = asyncio.Event()  # set when a stream sent its first token event
        self.health_status = 200  # what GET /health answers
        self.health_hold = False  # GET /health never answers while set
        self.health_checks = 0
        self.clients: list[object] = []  # the (host, port) each completion came from
        self.headers: list[dict[bytes, bytes]] = []  # each completion's request headers
        self.queries: list[bytes] = []  # each completion's and model list's query string
        self._changed = asyncio.Condition()

    async def wait_disconnects(self, count: int) -> None:
        """Until at least ``count`` clients disconnected mid-stream."""
        async with self._changed:
            await self._changed.wait_for(lambda: self.disconnects >= count)

    async def wait_active(self, count: int) -> None:
        """Until exactly ``count`` streams are active."""
        async with self._changed:
            await self._changed.wait_for(lambda: self.active == count)

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        path = scope["path"]
        if path == "/metrics":
            text = (
                "# TYPE vllm:num_requests_running gauge\n"
                f'vllm:num_requests_running{{model_name="fake"}} {self.active}.0\n'
                "# TYPE vllm:num_requests_waiting gauge\n"
                'vllm:num_requests_waiting{model_name="fake"} 0.0\n'
                "# TYPE vllm:kv_cache_usage_perc gauge\n"
                'vllm:kv_cache_usage_perc{model_name="fake"} 0.25\n'
                "# TYPE vllm:num_preemptions counter\n"
                'vllm:num_preemptions_total{model_name="fake"} 2.0\n'
            )
            await _answer(send, 200, text.encode(), b"text/plain; version=0.0.4")
        elif path == "/v1/models":
            self.queries.append(scope["query_string"])
            body = {"object": "list", "data": [{"id": "fake", "object": "model"}]}
            await _answer(send, 200, json.dumps(body).encode(), b"application/json")
        elif path == "/health":
            self.health_checks += 1
            if self.health_hold:
                await asyncio.Event().wait()  # until the client goes away (cancelled)
            await _answer(send, self.health_status, b"", b"text/plain")
        elif path == "/fake/wait":
            await self._wait(scope, send)
        elif path in ("/v1/completions", "/v1/chat/completions"):
            await self._complete(path, scope, receive, send)
        else:
            await _answer(send, 404, b'{"error": "no such route"}', b"application/json")

    async def _wait(self, scope: Scope, send: Send) -> None:
        query = dict(
            part.split("=", 1) for part in scope["query_string"].decode().split("&") if part
        )
        async with asyncio.timeout(10):
            await self.wait_disconnects(int(query.get("disconnects", 0)))
            if "active" in query:
                await self.wait_active(int(query["active"]))
        counts = {"disconnects": self.disconnects, "active": self.active}
        await _answer(send, 200, json.dumps(counts).encode(), b"application/json")

    async def _complete(self, path: str, scope: Scope, receive: Receive, send: Send) -> None:
        self.clients.append(scope.get("client"))
        self.queries.append(scope["query_string"])
        headers = dict(scope["headers"])
        self.headers.append(headers)
        authorization = headers.get(b"authorization")
        self.authorizations.append(None if authorization is None else authorization.decode())
        raw = b""
        while True:
            message = await receive()
            raw += message.get("body", b"")
            if not message.get("more_body", False):
                break
        body = json.loads(raw)
        self.bodies.append(body)
        status = body.get("fake_status")
        if status is not None:
            error = {"error": {"message": "fake failure", "type": "fake", "code": status}}
            await _answer(send, status, json.dumps(error).encode(), b"application/json")
            return
        self.active += 1
        await self._notify()
        streaming = asyncio.ensure_future(self._stream(path, body, send))
        watching = asyncio.ensure_future(_disconnected(receive))
        try:
            await asyncio.wait((streaming, watching), return_when=asyncio.FIRST_COMPLETED)
            if watching.done() and not streaming.done():
                self.disconnects += 1
            elif streaming.done() and streaming.exception() is None:
                self.completed += 1
        finally:
            for task in (streaming, watching):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, OSError):
                    await task
            self.active -= 1
            await self._notify()

    async def _stream(self, path: str, body: dict[str, Any], send: Send) -> None:
        chat = path.endswith("/chat/completions")
        tokens = int(body.get("fake_tokens", 3))
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        if chat:  # vLLM opens a chat stream with the role and no content
            await _event(send, _chat_event(body, {"role": "assistant", "content": ""}, None))
        if body.get("fake_hold"):
            await self.release.wait()
        interval_s = float(body.get("fake_interval_ms", 0)) / 1e3
        for i in range(tokens):
            if interval_s > 0:
                await asyncio.sleep(interval_s)
            if body.get("fake_break_after") == i:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                return
            if body.get("fake_stall_after") == i:
                await asyncio.Event().wait()  # until the client goes away (cancelled)
            if body.get("fake_invalid_json"):
                await send(
                    {"type": "http.response.body", "body": b"data: {oops\n\n", "more_body": True}
                )
            if body.get("fake_error_event"):
                error = {"error": {"message": "fake engine error", "type": "fake", "code": 400}}
                await _event(send, error)
                await send(
                    {"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False}
                )
                return
            finish = "length" if i == tokens - 1 else None
            text = str(time.monotonic_ns()) if body.get("fake_stamp") else f"t{i}"
            if chat:
                await _event(send, _chat_event(body, {"content": text}, finish))
            else:
                await _event(send, _completion_event(body, text, finish))
            self.started.set()
        options = body.get("stream_options") or {}
        if options.get("include_usage"):
            usage = {"prompt_tokens": 7, "completion_tokens": tokens, "total_tokens": 7 + tokens}
            event = {
                "id": "fake-1",
                "object": "chat.completion.chunk" if chat else "text_completion",
                "created": 1,
                "model": "fake",
                "choices": [],
                "usage": usage,
            }
            await _event(send, event)
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})


def _completion_event(body: dict[str, Any], text: str, finish: str | None) -> dict[str, Any]:
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
    return {
        "id": "fake-1",
        "object": "text_completion",
        "created": 1,
        "model": "fake",
        "choices": [choice],
        "usage": None,
    }


def _chat_event(body: dict[str, Any], delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    return {
        "id": "fake-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "fake",
        "choices": [choice],
    }


async def _event(send: Send, event: dict[str, Any]) -> None:
    data = b"data: " + json.dumps(event).encode() + b"\n\n"
    await send({"type": "http.response.body", "body": data, "more_body": True})


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _answer(send: Send, status: int, body: bytes, content_type: bytes) -> None:
    headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def main() -> None:
    """Serve the fake on 127.0.0.1 (``--port``, 0: any), printing the port once listening."""
    import uvicorn

    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    port = parser.parse_args().port
    listener = tcp_listener("127.0.0.1", port, backlog=128)
    print(f"fake engine on port {listener.getsockname()[1]}", flush=True)
    config = uvicorn.Config(FakeOpenAI(), lifespan="off", log_level="warning", access_log=False)
    asyncio.run(uvicorn.Server(config).serve(sockets=[listener]))
    sys.exit(0)


if __name__ == "__main__":
    main()

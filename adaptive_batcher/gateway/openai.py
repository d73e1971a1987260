"""An engine adapter for OpenAI-compatible HTTP servers: vLLM, SGLang, TGI's messages API,
llama.cpp's ``llama-server``, ``transformers serve``.

:class:`OpenAIEngine` posts each request's JSON body to its route (``/v1/completions`` or
``/v1/chat/completions``) with ``stream`` forced on and ``stream_options.include_usage`` added,
and yields one :class:`~adaptive_batcher.gateway.types.Chunk` per server-sent event, its bytes
unchanged. A request the client sent without streaming is streamed upstream all the same (the
gate needs the time of the first token); the gateway app puts the answer back together
(:mod:`adaptive_batcher.gateway.assemble`).

Errors (:mod:`adaptive_batcher.gateway.errors`): no connection -> ``UpstreamUnavailableError``;
no answer or no next event in time -> ``UpstreamTimeoutError``; an HTTP error status, or an
error event in the stream -> ``UpstreamEventError``; a stream that ends before ``data: [DONE]``,
or an event that is not JSON -> ``UpstreamProtocolError``. Closing the iterator early closes
the HTTP response, which is how the engine learns to abort (vLLM aborts a request whose client
disconnected).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from typing import Any, TypeGuard, cast

from adaptive_batcher._validate import check_number, check_str
from adaptive_batcher.gateway._extra import missing_extra
from adaptive_batcher.gateway.errors import (
    UpstreamError,
    UpstreamEventError,
    UpstreamHTTPError,
    UpstreamProtocolError,
    UpstreamTimeoutError,
    UpstreamUnavailableError,
)
from adaptive_batcher.gateway.outage import loggable_url
from adaptive_batcher.gateway.sse import DONE, SSESplitter, event_data
from adaptive_batcher.gateway.types import Chunk, LLMRequest, Usage

try:
    import httpx
except ImportError as exc:  # pragma: no cover - exercised in a subprocess by the tests
    raise missing_extra("adaptive_batcher.gateway.openai", exc) from exc

__all__ = [
    "OpenAIEngine",
    "estimate_prompt_tokens",
    "event_tokens",
    "event_usage",
    "requested_max_tokens",
    "upstream_payload",
]

CHARS_PER_TOKEN = 4.0
"""Characters per token of the prompt estimate (OpenAI's rule of thumb for English text)."""

MAX_ERROR_BODY = 2048
"""Bytes of an error answer kept for the error's message."""

DRAIN_TIMEOUT_S = 0.5
"""After ``data: [DONE]``, how long the rest of the body (the chunked encoding's end) may take
to arrive, seconds. A body read to its end returns its connection to the pool; one cut off
closes it, so every request would open a new connection (a handshake on both sides, and a port
left in TIME_WAIT for a minute: a few hundred requests a second use up the ephemeral ports)."""

MAX_DRAIN_BYTES = 4096
"""Bytes after ``data: [DONE]`` read to reach the body's end before giving up on it."""


class OpenAIEngine:
    """The :class:`~adaptive_batcher.gateway.types.Engine` of an OpenAI-compatible server.

    Args:
        base_url: the server's root, e.g. ``http://127.0.0.1:8000`` (the request's ``path`` is
            appended).
        client: the ``httpx.AsyncClient`` to use (its own transport and limits); by default the
            engine makes one, without a connection-pool cap, and closes it in :meth:`aclose`.
            A client given is not closed.
        connect_timeout_s: to connect and to send the request, seconds (> 0).
        first_chunk_timeout_s: from sending the request to its first event (the engine's own
            queue and prefill), seconds (> 0).
        chunk_timeout_s: between two events, seconds (> 0).
        api_key: sent as ``Authorization: Bearer <api_key>`` with every request, in place of
            the client's own ``authorization``; without it the client's header (in
            ``LLMRequest.headers``) is passed through.

    Raises:
        TypeError, ValueError: an argument of the wrong type or out of range (named).
    """

    def __init__(
        self,
        base_url: str,
        *,
        client: httpx.AsyncClient | None = None,
        connect_timeout_s: float = 5.0,
        first_chunk_timeout_s: float = 60.0,
        chunk_timeout_s: float = 30.0,
        api_key: str | None = None,
    ) -> None:
        self.base_url = check_str("base_url", base_url).rstrip("/")
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {base_url!r}")
        if client is not None and not isinstance(client, httpx.AsyncClient):
            raise TypeError(f"client must be an httpx.AsyncClient, got {type(client).__name__}")
        self.connect_timeout_s = check_number(
            "connect_timeout_s", connect_timeout_s, 0, strict=True
        )
        self.first_chunk_timeout_s = check_number(
            "first_chunk_timeout_s", first_chunk_timeout_s, 0, strict=True
        )
        self.chunk_timeout_s = check_number("chunk_timeout_s", chunk_timeout_s, 0, strict=True)
        self._api_key = None if api_key is None else check_str("api_key", api_key)
        self._owns_client = client is None
        self._client = client if client is not None else _default_client()
        self._timeout = httpx.Timeout(
            connect=self.connect_timeout_s,
            write=self.connect_timeout_s,
            pool=self.connect_timeout_s,
            read=None,  # the first-event and between-event deadlines are kept by stream()
        )

    def stream(self, request: LLMRequest) -> AsyncIterator[Chunk]:
        """The request's events as chunks, in order, ending with ``data: [DONE]``.

        ``Chunk.data`` is the event's bytes as the server sent them; ``Chunk.tokens`` the
        choices with new text in it (:func:`event_tokens`); ``Chunk.usage`` the usage it
        carries (:func:`event_usage`). Raises an ``UpstreamError`` (see the module) from the
        iterator; ``aclose()`` closes the HTTP response before it returns.

        Raises:
            TypeError: ``request.payload`` is not a JSON object (a dict), at the first
                ``__anext__``.
        """
        return self._events(request)

    async def get(
        self,
        path: str,
        headers: Mapping[str, str] | None = None,
        *,
        timeout_s: float | None = None,
    ) -> httpx.Response:
        """``GET path`` on the server (e.g. ``/v1/models``, passed through by the gateway), read
        whole within ``timeout_s`` seconds (None: the first-chunk timeout).

        Raises:
            UpstreamError: no connection, no answer in time (an error status is returned, not
                raised).
        """
        limit_s = self.first_chunk_timeout_s if timeout_s is None else timeout_s
        try:
            async with asyncio.timeout(limit_s):
                return await self._client.get(
                    self.base_url + path,
                    headers=self._headers(headers or {}),
                    timeout=self._timeout,
                )
        except TimeoutError as exc:
            raise UpstreamTimeoutError(f"no answer to GET {path} in time") from exc
        except httpx.HTTPError as exc:
            raise _mapped(exc, answered=False) from exc

    async def aclose(self) -> None:
        """Close the client the engine made (a client given stays open)."""
        if self._owns_client:
            await self._client.aclose()

    # -- internals -------------------------------------------------------------------------

    def _headers(self, given: Mapping[str, str]) -> dict[str, str]:
        headers = {k.lower(): v for k, v in given.items()}
        if self._api_key is not None:
            headers["authorization"] = f"Bearer {self._api_key}"
        return headers

    async def _events(self, request: LLMRequest) -> AsyncIterator[Chunk]:
        body = upstream_payload(request.payload)
        headers = self._headers(request.headers)
        headers["accept"] = "text/event-stream"
        http_request = self._client.build_request(
            "POST",
            self.base_url + _with_query(request.path, request.query),
            json=body,
            headers=headers,
            timeout=self._timeout,
        )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.first_chunk_timeout_s
        response = await self._send(http_request, deadline)
        try:
            if response.status_code >= 400:
                raise UpstreamHTTPError(response.status_code, await _error_body(response, deadline))
            splitter = SSESplitter()
            first = True
            async with contextlib.aclosing(_raw(response)) as raw:
                while True:
                    data = await self._next_read(raw, deadline, first, splitter)
                    for event in splitter.feed(data):
                        first = False
                        chunk, done = _chunk(event)
                        yield chunk
                        if done:
                            await _drain(raw)
                            return
                    if not first:
                        deadline = loop.time() + self.chunk_timeout_s
        finally:
            await response.aclose()

    async def _send(self, http_request: httpx.Request, deadline: float) -> httpx.Response:
        try:
            async with asyncio.timeout_at(deadline):
                return await self._client.send(http_request, stream=True)
        except TimeoutError as exc:
            raise UpstreamTimeoutError(
                f"no answer from {loggable_url(self.base_url)} within "
                f"{self.first_chunk_timeout_s} s"
            ) from exc
        except httpx.HTTPError as exc:
            raise _mapped(exc, answered=False) from exc

    async def _next_read(
        self, raw: AsyncIterator[bytes], deadline: float, first: bool, splitter: SSESplitter
    ) -> bytes:
        """The next bytes of the body, by ``deadline`` (on the loop's clock)."""
        try:
            async with asyncio.timeout_at(deadline):
                return await anext(raw)
        except StopAsyncIteration:
            unfinished = len(splitter.pending)
            detail = f" ({unfinished} bytes of an unfinished event)" if unfinished else ""
            raise UpstreamProtocolError(
                f"the engine's stream ended before data: [DONE]{detail}"
            ) from None
        except TimeoutError as exc:
            wait = self.first_chunk_timeout_s if first else self.chunk_timeout_s
            what = "first event" if first else "next event"
            raise UpstreamTimeoutError(f"no {what} from the engine within {wait} s") from exc
        except httpx.HTTPError as exc:
            raise _mapped(exc, answered=True) from exc


async def _drain(raw: AsyncIterator[bytes]) -> None:
    """Read what follows ``[DONE]`` to the body's end (at most :data:`MAX_DRAIN_BYTES` within
    :data:`DRAIN_TIMEOUT_S`), so that the connection can be kept; a failure only costs it."""
    received = 0
    try:
        async with asyncio.timeout(DRAIN_TIMEOUT_S):
            async for data in raw:
                received += len(data)
                if received > MAX_DRAIN_BYTES:
                    return
    except (TimeoutError, httpx.HTTPError):
        pass


def _raw(response: httpx.Response) -> AsyncGenerator[bytes, None]:
    """The response's raw body iterator (an async generator, so it can be closed)."""
    return cast("AsyncGenerator[bytes, None]", response.aiter_raw())


def _default_client() -> httpx.AsyncClient:
    # no pool cap: the gate, not the client, bounds what reaches the engine
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    return httpx.AsyncClient(limits=limits, trust_env=False)


def _chunk(event: bytes) -> tuple[Chunk, bool]:
    """One event as a chunk, and whether it ends the stream."""
    try:
        data = event_data(event)
    except UnicodeDecodeError as exc:
        raise UpstreamProtocolError("the engine sent an event that is not UTF-8") from exc
    if data is None:  # a comment or keep-alive: forwarded, no tokens
        return Chunk(event, tokens=0), False
    if data.strip() == DONE:
        return Chunk(event, tokens=0), True
    try:
        parsed = json.loads(data)
    except ValueError as exc:
        raise UpstreamProtocolError(
            f"the engine sent an event that is not JSON: {data[:200]!r}"
        ) from exc
    if not isinstance(parsed, dict):
        raise UpstreamProtocolError(
            f"the engine sent an event that is not an object: {data[:200]!r}"
        )
    if "error" in parsed or parsed.get("object") == "error":
        raise UpstreamEventError(_error_status(parsed), data)
    return Chunk(event, tokens=event_tokens(parsed), usage=event_usage(parsed)), False


def _error_status(event: dict[str, Any]) -> int:
    """The status an error event names (vLLM: ``code``), else 500."""
    error = event.get("error")
    source = error if isinstance(error, dict) else event
    code = source.get("code")
    return (
        code if isinstance(code, int) and not isinstance(code, bool) and 400 <= code < 600 else 500
    )


async def _error_body(response: httpx.Response, deadline: float) -> str:
    """The start of an error answer's body (what arrives before the deadline)."""
    received = b""
    try:
        async with asyncio.timeout_at(deadline), contextlib.aclosing(_raw(response)) as raw:
            async for data in raw:
                received += data
                if len(received) >= MAX_ERROR_BODY:
                    break
    except (TimeoutError, httpx.HTTPError):
        pass  # the status says what went wrong; the body is only its detail
    return received[:MAX_ERROR_BODY].decode("utf-8", errors="replace")


def _mapped(exc: httpx.HTTPError, *, answered: bool) -> UpstreamError:
    """An httpx error as the adapter's error; ``answered``: the response had started."""
    message = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, httpx.TimeoutException):
        return UpstreamTimeoutError(f"the engine timed out ({message})")
    if answered:
        return UpstreamProtocolError(f"the engine's stream broke off ({message})")
    if isinstance(exc, httpx.TransportError):
        return UpstreamUnavailableError(f"no connection to the engine ({message})")
    return UpstreamProtocolError(f"the engine's answer could not be read ({message})")


# -- payloads ------------------------------------------------------------------------------


def upstream_payload(payload: object) -> dict[str, Any]:
    """The body sent upstream: ``payload`` (a JSON object) with ``stream: true`` and
    ``stream_options.include_usage: true``; every other field as the client sent it (the
    client's own ``stream_options`` keep their other keys). ``payload`` is not changed.

    Raises:
        TypeError: ``payload`` is not a dict.
    """
    if not isinstance(payload, dict):
        raise TypeError(f"payload must be a dict (a JSON object), got {type(payload).__name__}")
    body = dict(payload)
    body["stream"] = True
    options = body.get("stream_options")
    body["stream_options"] = {
        **(options if isinstance(options, dict) else {}),
        "include_usage": True,
    }
    return body


def event_tokens(event: Mapping[str, Any]) -> int:
    """Output tokens one stream event carries, counted as its choices with new output: a
    non-empty ``text`` (completions) or a ``delta`` with non-empty ``content``,
    ``reasoning_content`` or ``tool_calls`` (chat). 0 for a usage-only event. An engine that
    packs several tokens in one event (vLLM's ``--stream-interval``) is undercounted here; the
    usage count at the end is exact."""
    choices = event.get("choices")
    if not isinstance(choices, list):
        return 0
    count = 0
    for choice in choices:
        if not isinstance(choice, dict):
            continue
        if choice.get("text"):
            count += 1
            continue
        delta = choice.get("delta")
        if isinstance(delta, dict) and any(
            delta.get(key) for key in ("content", "reasoning_content", "tool_calls")
        ):
            count += 1
    return count


def event_usage(event: Mapping[str, Any]) -> Usage | None:
    """The ``usage`` an event carries (the last event's with ``include_usage``), or None when
    it has none or its counts are not integers >= 0."""
    usage = event.get("usage")
    if not isinstance(usage, dict):
        return None
    prompt = usage.get("prompt_tokens")
    completion = usage.get("completion_tokens")
    if not (_count(prompt) and _count(completion)):
        return None
    return Usage(prompt_tokens=prompt, completion_tokens=completion)


def _count(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def estimate_prompt_tokens(payload: object) -> int:
    """An estimate of a request's prompt length in tokens: ``ceil(characters / 4)`` of the
    ``prompt`` (a string or a list of strings; a list of token ids counts exactly) or of the
    ``messages``' text content. An estimate for the gate's context count until the engine's
    usage count corrects it; a payload of another shape gives 0 (never an error: the engine
    judges the payload)."""
    if not isinstance(payload, dict):
        return 0
    prompt = payload.get("prompt")
    if prompt is not None:
        return _prompt_tokens(prompt)
    messages = payload.get("messages")
    if not isinstance(messages, list):
        return 0
    chars = 0
    for message in messages:
        if isinstance(message, dict):
            chars += _content_chars(message.get("content"))
    return math.ceil(chars / CHARS_PER_TOKEN)


def _prompt_tokens(prompt: object) -> int:
    """A completion prompt's tokens: a string, token ids, or a list of either (OpenAI's
    shapes); anything nested deeper counts 0 (the engine refuses it)."""
    if not isinstance(prompt, list):
        return _one_prompt_tokens(prompt)
    if all(isinstance(t, int) for t in prompt):
        return len(prompt)  # token ids
    return sum(_one_prompt_tokens(p) for p in prompt)


def _one_prompt_tokens(prompt: object) -> int:
    if isinstance(prompt, str):
        return math.ceil(len(prompt) / CHARS_PER_TOKEN)
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        return len(prompt)
    return 0


def _content_chars(content: object) -> int:
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):  # parts: {"type": "text", "text": ...}
        return sum(
            len(part["text"])
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return 0


def _with_query(path: str, query: str) -> str:
    return f"{path}?{query}" if query else path


def requested_max_tokens(payload: object) -> int | None:
    """The output budget a payload asks for (``max_tokens``, or chat's newer
    ``max_completion_tokens``), or None when it names none that is an int >= 1 (the engine
    judges other values)."""
    if not isinstance(payload, dict):
        return None
    for key in ("max_tokens", "max_completion_tokens"):
        value = payload.get(key)
        if _count(value) and value >= 1:
            return value
    return None

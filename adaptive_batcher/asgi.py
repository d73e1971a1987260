"""ASGI middleware for services that put a batcher behind HTTP: bounds on request bodies.

A body is read and parsed on the event loop, so one large body stalls every request the
batcher holds (a 20 MB JSON list parsed, validated and echoed back in a 422 stopped the
README's FastAPI example for 17-29 s on a busy 2-core machine). :class:`BodyLimit` answers 413
before the app sees the body when its ``Content-Length`` is over the bound, and stops the app's
read of a body sent without one as soon as it passes the bound (the rest is dropped unparsed).
With ``read_timeout_s`` it also answers 408 to a body that does not arrive in time: a client
that sends half a body and waits held its request unanswered for good, and held uvicorn's
shutdown with it (a fresh user's trial). It needs no web framework: any ASGI app (FastAPI,
Starlette, a bare callable) can be wrapped.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Final

from adaptive_batcher._validate import check_int, check_number

__all__ = ["DRAIN_BYTES", "LINGER_S", "BodyLimit"]

DRAIN_BYTES: Final = 64 * 1024 * 1024
"""The default for :class:`BodyLimit`'s ``drain_bytes``: a refused body up to this size is read
and dropped before the 413, so that its client reads the answer."""

LINGER_S: Final = 5.0
"""How long a refused body is drained without a ``read_timeout_s``, s (the default of nginx's
``lingering_timeout``)."""

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class BodyLimit:
    """Refuse HTTP request bodies over ``max_bytes`` with 413, without handing them to the
    app, and bodies slower than ``read_timeout_s`` with 408.

    A request whose ``Content-Length`` exceeds ``max_bytes`` gets 413 before the app runs; one
    without a length (chunked) gets 413 as soon as the bytes received pass ``max_bytes`` (the
    app's read of the body is interrupted). An unreadable ``Content-Length`` gets 400. The
    answer is JSON: ``{"error": "RequestBodyTooLarge", "max_bytes": ...}``. With
    ``read_timeout_s``, a body whose last byte has not arrived that long after the app first
    asked for it gets 408 ``{"error": "RequestBodyTimeout", "read_timeout_s": ...}`` and the
    app's read is interrupted the same way; the wait for a disconnect after the body is not
    timed.

    Before its 413, the rest of a refused body is read and dropped (a lingering close, as
    nginx's): a client still sending when a server closes gets a connection reset in place of
    the answer. The drain stops at ``drain_bytes`` in all, or at the body's read deadline
    (``LINGER_S`` after the refusal without ``read_timeout_s``); a body drained to its end keeps
    the connection. The 400, the 408 and a 413 whose body was not drained to its end close
    the connection (``Connection: close``): the rest of the body would otherwise be read as the
    next request (a client still sending then sees a reset; httpx's async client reports it as
    ``ReadError``). A client that sent ``Expect: 100-continue`` is drained as any other (its
    ``100 Continue`` goes out when the drain starts): answered before the body, uvicorn would
    drop a body sent anyway with no time limit. Other scopes (websockets, lifespan) pass
    through.

    Args:
        app: the ASGI application to wrap.
        max_bytes: the largest body accepted, bytes (>= 0).
        read_timeout_s: the longest a body may take to arrive, s (> 0; None: no limit).
        drain_bytes: the largest refused body read to its end before the 413, bytes (>= 0).

    Raises:
        TypeError: ``max_bytes`` or ``drain_bytes`` is not an int, or ``read_timeout_s`` not a
            number.
        ValueError: ``max_bytes`` or ``drain_bytes`` < 0, or ``read_timeout_s`` <= 0 or not
            finite.
    """

    def __init__(
        self,
        app: ASGIApp,
        max_bytes: int,
        read_timeout_s: float | None = None,
        drain_bytes: int = DRAIN_BYTES,
    ) -> None:
        self.app = app
        self.max_bytes = check_int("BodyLimit.max_bytes", max_bytes, 0)
        self.read_timeout_s = (
            None
            if read_timeout_s is None
            else check_number("BodyLimit.read_timeout_s", read_timeout_s, 0.0, strict=True)
        )
        self.drain_bytes = check_int("BodyLimit.drain_bytes", drain_bytes, 0)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = _content_length(scope)
        if length is None:
            await _answer(send, 400, {"error": "BadContentLength"}, close=True)
            return
        loop = asyncio.get_running_loop()
        if length > self.max_bytes:
            await self._refuse_sized(receive, send, length, loop.time())
            return
        started = refused = complete = False
        received = 0
        deadline: float | None = None

        async def refuse(answer: Callable[[Send], Awaitable[None]]) -> Message:
            nonlocal refused
            refused = True
            if not started:
                await answer(send)
            return {"type": "http.disconnect"}  # the app stops reading

        async def drain_and_refuse(send: Send) -> None:
            rest = self._drain(receive, received, self._drain_deadline(loop.time(), deadline))
            await self._refuse(send, close=not await rest)

        async def limited_receive() -> Message:
            nonlocal received, complete, deadline
            if refused or complete or self.read_timeout_s is None:
                message = await receive()
            else:
                if deadline is None:  # from the app's first read
                    deadline = loop.time() + self.read_timeout_s
                try:
                    async with asyncio.timeout_at(deadline):
                        message = await receive()
                except TimeoutError:
                    return await refuse(self._time_out)
            if message["type"] == "http.request" and not refused:
                received += len(message.get("body", b""))
                complete = not message.get("more_body", False)
                if received > self.max_bytes:
                    if complete:
                        return await refuse(lambda send: self._refuse(send, close=False))
                    return await refuse(drain_and_refuse)
            return message

        async def watched_send(message: Message) -> None:
            nonlocal started
            if refused:
                return  # answered already: what the app says after the disconnect is dropped
            started = started or message["type"] == "http.response.start"
            await send(message)

        await self.app(scope, limited_receive, watched_send)

    async def _refuse_sized(self, receive: Receive, send: Send, length: int, now: float) -> None:
        """413 for a body whose ``Content-Length`` is over the bound: drained first, unless it
        is past ``drain_bytes`` (then it closes at once). A client that waits for ``100
        Continue`` is drained too: answered before its body, it would leave uvicorn dropping
        that body with no time limit (a fresh user's trickle held one connection for good)."""
        if length > self.drain_bytes:
            await self._refuse(send, close=True)
        else:
            drained = await self._drain(receive, 0, self._drain_deadline(now))
            await self._refuse(send, close=not drained)

    def _drain_deadline(self, now: float, read_deadline: float | None = None) -> float:
        """When draining a refused body stops: the body's read deadline, else ``LINGER_S``."""
        if read_deadline is not None:
            return read_deadline
        return now + (self.read_timeout_s or LINGER_S)

    async def _drain(self, receive: Receive, received: int, deadline: float) -> bool:
        """Read and drop the rest of a refused body, at most ``drain_bytes`` in all, until
        ``deadline`` (loop time); True when it was read to its end."""
        try:
            async with asyncio.timeout_at(deadline):
                while received <= self.drain_bytes:
                    message = await receive()
                    if message["type"] != "http.request":
                        return False  # the client went away
                    received += len(message.get("body", b""))
                    if not message.get("more_body", False):
                        return received <= self.drain_bytes
        except TimeoutError:
            pass
        return False

    async def _refuse(self, send: Send, *, close: bool) -> None:
        body = {"error": "RequestBodyTooLarge", "max_bytes": self.max_bytes}
        await _answer(send, 413, body, close=close)

    async def _time_out(self, send: Send) -> None:
        body = {"error": "RequestBodyTimeout", "read_timeout_s": self.read_timeout_s}
        await _answer(send, 408, body, close=True)


def _content_length(scope: Scope) -> int | None:
    """The request's ``Content-Length`` (-1 when it has none); None when it cannot be read."""
    for name, value in scope.get("headers", ()):
        if name.lower() == b"content-length":
            text = value.decode("latin-1").strip()
            return int(text) if text.isdigit() else None
    return -1


async def _answer(send: Send, status: int, body: dict[str, Any], *, close: bool) -> None:
    """A JSON answer; with ``close``, one that closes the connection (the body was not read
    to its end, or its length could not be read: the bytes still coming would be taken for
    the next request)."""
    payload = json.dumps(body).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", b"%d" % len(payload)),
    ]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})

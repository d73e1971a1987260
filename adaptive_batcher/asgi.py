"""ASGI middleware for services that put a batcher behind HTTP: bounds on request bodies.

A body is read and parsed on the event loop, so one large body stalls every request the
batcher holds (a 20 MB JSON list parsed, validated and echoed back in a 422 stopped the
README's FastAPI example for 17-29 s on a busy 2-core machine). :class:`BodyLimit` answers 413
before the app sees the body when its ``Content-Length`` is over the bound, and stops the app's
read of a body sent without one as soon as it passes the bound (the rest is dropped unparsed).
With ``read_timeout_s`` it also answers 408 to a body that does not arrive in time: a client
that sends half a body and waits held its request unanswered for good, and held uvicorn's
shutdown with it (a fresh user's trial). It needs no web framework: any ASGI app (FastAPI,
Starlette, a bare callable) can be wrapped. :class:`CancelOnDisconnect` cancels a request's
handling once its client has gone, so that its batcher request leaves the queue: FastAPI runs a
handler to its end whatever its client does (a fresh user's trial: 192 of 200 requests whose
clients gave up still ran through the model).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Final

from adaptive_batcher._log import get_logger
from adaptive_batcher._validate import check_int, check_number

__all__ = ["DRAIN_BYTES", "LINGER_S", "BodyLimit", "CancelOnDisconnect"]

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

_log = get_logger()


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
    drop a body sent anyway with no time limit.

    The app's own answer waits the same way while the body is unread: its start is held until
    its first body part, so a refusal can still take its place (an app that starts its answer
    before reading gets the 413, not a truncated 200). A whole answer then goes once the rest
    of the body is drained, closing the connection if it was not drained to its end; a
    streamed one goes at once and closes it. Other scopes (websockets, lifespan) pass
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
        exchange = _Exchange(self, receive, send, complete=not _has_body(scope, length))
        await self.app(scope, exchange.receive, exchange.send)

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
        """Read and drop the rest of a body (refused, or one the app answered without reading),
        at most ``drain_bytes`` in all, until ``deadline`` (loop time); True when it was read
        to its end."""
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


class _Exchange:
    """One request under a :class:`BodyLimit`: the app's reads of the body, counted and timed,
    and its answer's start, held while the body is still unread (so that a refusal can take
    its place, and the rest of the body is drained before it goes out)."""

    def __init__(self, limit: BodyLimit, receive: Receive, send: Send, *, complete: bool) -> None:
        self.limit = limit
        self._receive, self._send = receive, send
        self.loop = asyncio.get_running_loop()
        self.received = 0
        self.complete = complete  # the whole body has been read
        self.refused = self.started = False  # answered by the limit; the app's start sent
        self.deadline: float | None = None  # the read deadline, from the app's first read
        self.held: Message | None = None  # the app's response start, not yet sent

    async def receive(self) -> Message:
        """The app's read: counted against ``max_bytes`` and timed by ``read_timeout_s``."""
        limit = self.limit
        if self.refused or self.complete or limit.read_timeout_s is None:
            message = await self._receive()
        else:
            if self.deadline is None:
                self.deadline = self.loop.time() + limit.read_timeout_s
            try:
                async with asyncio.timeout_at(self.deadline):
                    message = await self._receive()
            except TimeoutError:
                return await self._refuse(limit._time_out)
        if message["type"] == "http.request" and not self.refused:
            self.received += len(message.get("body", b""))
            self.complete = not message.get("more_body", False)
            if self.received > limit.max_bytes:
                return await self._refuse(self._too_large)
        return message

    async def send(self, message: Message) -> None:
        """The app's answer; a start while the body is unread waits for the first body part."""
        if self.refused:
            return  # answered already: what the app says after the disconnect is dropped
        if message["type"] == "http.response.start" and not self.complete:
            self.held = message
            return
        if self.held is not None:  # the start goes ahead of the answer's first part
            start, self.held = self.held, None
            # a streamed answer goes at once (the app may still read); a whole one waits for
            # the rest of the body to be drained; either closes if the body was not read
            final = not message.get("more_body", False)
            if not (self.complete or (final and await self._drain_rest())):
                start = _closing(start)
            self.started = True
            await self._send(start)
        self.started = self.started or message["type"] == "http.response.start"
        await self._send(message)

    async def _too_large(self, send: Send) -> None:
        await self.limit._refuse(send, close=not await self._drain_rest())

    async def _drain_rest(self) -> bool:
        """Drop the rest of the body (see :meth:`BodyLimit._drain`); True when it all came."""
        if self.complete:
            return True
        deadline = self.limit._drain_deadline(self.loop.time(), self.deadline)
        self.complete = await self.limit._drain(self._receive, self.received, deadline)
        return self.complete

    async def _refuse(self, answer: Callable[[Send], Awaitable[None]]) -> Message:
        self.refused = True
        if not self.started:
            self.held = None  # the refusal takes the place of an answer not yet sent
            await answer(self._send)
        return {"type": "http.disconnect"}  # the app stops reading


def _has_body(scope: Scope, length: int) -> bool:
    """Whether the request carries a body: a ``Content-Length`` above 0, or chunked."""
    if length >= 0:
        return length > 0
    return any(name.lower() == b"transfer-encoding" for name, _ in scope.get("headers", ()))


def _closing(start: Message) -> Message:
    """``start`` (an ``http.response.start``) with ``Connection: close`` added."""
    headers = [(k, v) for k, v in start.get("headers", ()) if k.lower() != b"connection"]
    return {**start, "headers": [*headers, (b"connection", b"close")]}


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


class CancelOnDisconnect:
    """Cancel the app's handling of an HTTP request once its client has disconnected.

    Once the app has read the request's body to its end (at once for a request without one),
    a task watches the connection: the server's ``http.disconnect`` before the answer is
    complete cancels the request's task (that cancellation, and no other, ends here), so an
    ``await batcher.submit(...)`` in the handler raises ``CancelledError`` and its request
    leaves the batcher's queue (or its batch's answer is dropped) instead of spending the model
    on an answer nobody reads. Logs ``asgi.client_gone`` (debug). The request's answer is then
    ended as the server expects (499 if none had started, else its last part), which the
    server drops: a middleware outside, as FastAPI's ``@app.middleware("http")``, would
    otherwise raise on a request that returned no answer. The app's own later reads get the
    same ``http.disconnect`` (Starlette's ``request.is_disconnected()`` and streamed answers
    still see it); an answer already complete is left alone (background tasks run on). Body
    reads are passed through as the app asks for them, so the server's flow control holds.
    Other scopes pass through.
    Source: uvicorn's ASGI receive, which returns ``http.disconnect`` once the connection is
    lost; Starlette's own ``listen_for_disconnect`` does the same for streamed answers only.

    Args:
        app: the ASGI application to wrap.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = _content_length(scope)
        watch = _Watch(receive, send, body=length is None or _has_body(scope, length))
        task = watch.app_task = asyncio.current_task()
        if not watch.body_left:
            watch.start()
        try:
            await self.app(scope, watch.receive, watch.send)
        except asyncio.CancelledError:
            # the watch's cancellation alone ends the request quietly; any other is raised
            if task is None or not watch.client_gone or task.uncancel() > 0:
                raise
            _log.debug("asgi.client_gone", path=scope.get("path", ""))
            await watch.answer_gone()
        else:
            if watch.client_gone and task is not None:
                task.uncancel()  # the app caught the watch's cancellation and ended itself
                await watch.answer_gone()
        finally:
            watch.stop()


class _Watch:
    """One request under :class:`CancelOnDisconnect`: the body passed through as read, then
    the connection read once more, for the app (in order) and for a ``http.disconnect``, which
    cancels the app's task while its answer is incomplete."""

    def __init__(self, receive: Receive, send: Send, *, body: bool) -> None:
        self._receive, self._send = receive, send
        self.body_left = body
        self.app_task: asyncio.Task[Any] | None = None
        self.client_gone = False
        self._started = False  # the answer's start went out
        self._answered = False  # the answer's last part went out
        self._read: asyncio.Queue[Message] = asyncio.Queue()  # what the watch read, for the app
        self._last: Message | None = None  # the message that ended the watch
        self._watcher: asyncio.Task[None] | None = None

    async def receive(self) -> Message:
        if self.body_left:
            message = await self._receive()
            if message["type"] != "http.request" or not message.get("more_body", False):
                self.body_left = False
                self.start()  # the body is read: what comes next is the client leaving
            return message
        self.start()
        if self._read.empty() and self._last is not None:
            return self._last  # every read after the end gets the end again, as uvicorn's
        return await self._read.get()

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self._started = True
        elif message["type"] == "http.response.body" and not message.get("more_body", False):
            self._answered = True
        await self._send(message)

    async def answer_gone(self) -> None:
        """End the answer of a request whose client has gone: 499 (nginx's "client closed
        request") if none had started, else its last, empty part. The server drops it; a
        middleware outside (Starlette's ``BaseHTTPMiddleware``) would otherwise find no
        answer and raise."""
        try:
            if not self._started:
                await _answer(self._send, 499, {"error": "ClientClosedRequest"}, close=True)
            elif not self._answered:
                await self._send({"type": "http.response.body", "body": b"", "more_body": False})
        except Exception as exc:  # a server may refuse to send to a client that has gone
            _log.debug("asgi.client_gone_answer_failed", error=type(exc).__name__)

    def start(self) -> None:
        """Read the connection (once) for the client leaving."""
        if self._watcher is None:
            self._watcher = asyncio.ensure_future(self._watch())

    def stop(self) -> None:
        """The app is done: stop reading."""
        if self._watcher is not None and not self._watcher.done():
            self._watcher.cancel()

    async def _watch(self) -> None:
        while True:
            message = await self._receive()
            self._read.put_nowait(message)  # a request without a body: the app reads it later
            if message["type"] != "http.request":
                break
        self._last = message
        if message["type"] == "http.disconnect" and not self._answered:
            task = self.app_task
            if task is not None and not task.done():
                self.client_gone = True
                task.cancel()

"""The OpenAI-compatible gateway: an ASGI app that puts the gate (an
:class:`~adaptive_batcher.gateway.shell.LLMGate`) in front of an engine.

Routes:

* ``POST /v1/completions``, ``POST /v1/chat/completions``: the JSON body goes to the gate as an
  :class:`~adaptive_batcher.gateway.types.LLMRequest` (prompt length estimated by
  :func:`~adaptive_batcher.gateway.openai.estimate_prompt_tokens`, ``max_tokens``, the route,
  the client's ``authorization``). A refused request is answered at once: 429 (the gate's queue
  is full) or 503 (its first token would come too late), with ``Retry-After`` (whole seconds,
  rounded up); 504 when its deadline passed while it waited; 503 when the gate is closed (both
  with ``Retry-After: 1``, as is any other 503 or 504 the gateway answers before the stream).
  Once admitted, the engine's events stream to the client byte for byte (``text/event-stream``).
  An engine error before the first event is answered with the error's ``http_status``
  (an engine's own JSON error body is passed on as it is); after it, the headers are gone and
  the stream ends with an error event, ``data: {"error": {...}}``. A request with ``stream``
  not true is streamed upstream all the same and answered as one JSON object
  (:class:`~adaptive_batcher.gateway.assemble.ResponseAssembler`).
  When the client disconnects, its request is closed at once: it leaves the gate's queue, or its
  slot is freed and its HTTP stream to the engine closed (which aborts it in vLLM).
* ``GET /health``: 200 and the gate's state as JSON (limit, in flight, waiting, counts, the
  engine's latest metrics); 503 once the gate is closing. With an ``engine``, the engine's own
  health route is asked too (:class:`~adaptive_batcher.gateway.health.UpstreamCheck`, at most
  once a second): 503 ``upstream_unavailable`` while it does not answer, so a load balancer
  stops sending to a gateway whose engine is gone.
* ``GET /metrics``: the gate's Prometheus metrics (and, with ``process_metrics``, the
  process's).
* ``GET /v1/models``: passed through to the engine when an ``engine`` is given.

Bad JSON, or a body that is not a JSON object: 400; a body over ``max_body_bytes``: 413
(:class:`~adaptive_batcher.asgi.BodyLimit`); another route: 404; another method: 405. Every
error body is in OpenAI's format, ``{"error": {"message", "type", "param", "code"}}``.

The app does not start or close the gate; :func:`gateway_lifespan` does (the command line uses
it; in a FastAPI service, enter it in the service's own lifespan and mount the app:
``app.mount("/llm", gateway_app(gate))``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import math
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Final

from adaptive_batcher._log import get_logger
from adaptive_batcher._validate import check_bool, check_int, check_str
from adaptive_batcher.asgi import BodyLimit, Message, Receive, Scope, Send
from adaptive_batcher.errors import (
    BatcherClosedError,
    DeadlineExceededError,
    StreamBufferFullError,
    describe,
)
from adaptive_batcher.gateway._extra import missing_extra
from adaptive_batcher.gateway.assemble import ResponseAssembler
from adaptive_batcher.gateway.errors import (
    UpstreamError,
    UpstreamEventError,
    UpstreamHTTPError,
)
from adaptive_batcher.gateway.health import UpstreamCheck
from adaptive_batcher.gateway.openai import (
    OpenAIEngine,
    estimate_prompt_tokens,
    requested_max_tokens,
)
from adaptive_batcher.gateway.prometheus import register_prometheus
from adaptive_batcher.gateway.shell import GateStream, LLMGate
from adaptive_batcher.gateway.sse import DONE, event_data
from adaptive_batcher.gateway.types import Chunk, LLMRequest
from adaptive_batcher.llm.errors import GateRejectedError, RequestFailedError

try:
    from prometheus_client import (
        CONTENT_TYPE_LATEST,
        CollectorRegistry,
        ProcessCollector,
        generate_latest,
    )
except ImportError as exc:  # pragma: no cover - exercised in a subprocess by the tests
    raise missing_extra("adaptive_batcher.gateway.app", exc) from exc

__all__ = ["COMPLETION_ROUTES", "DEFAULT_MAX_BODY_BYTES", "gateway_app", "gateway_lifespan"]

_log = get_logger("adaptive_batcher.gateway.app")

ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

DEFAULT_MAX_BODY_BYTES: Final = 1 << 20
"""The largest request body accepted by default, bytes (1 MiB)."""

COMPLETION_ROUTES: Final = ("/v1/completions", "/v1/chat/completions")
"""The routes forwarded through the gate."""

_SSE_HEADERS: Final = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),  # nginx in front: do not buffer the stream
]


def gateway_app(
    gate: LLMGate,
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    engine: OpenAIEngine | None = None,
    registry: CollectorRegistry | None = None,
    process_metrics: bool = False,
    manage_gate: bool = False,
    upstream_health_path: str | None = "/health",
) -> ASGIApp:
    """The gateway as an ASGI app (see the module for its routes and answers).

    Args:
        gate: the gate requests go through (started and closed by the caller, e.g. with
            :func:`gateway_lifespan`).
        max_body_bytes: the largest request body, bytes (>= 0); larger ones get 413.
        engine: the OpenAI engine ``GET /v1/models`` is passed through to; without one that
            route answers 404.
        registry: the Prometheus registry ``/metrics`` shows; by default a new one holding the
            gate's collector.
        process_metrics: add the process's own metrics (CPU, memory, file descriptors) to the
            default registry.
        manage_gate: start the gate on the ASGI lifespan's startup and close it (draining) on
            its shutdown, for ``uvicorn module:app``; by default lifespan events are only
            acknowledged (a mounted app never receives them).
        upstream_health_path: the engine's health route ``/health`` asks (with an
            ``engine``); None: ``/health`` reports the gate alone.

    Raises:
        TypeError, ValueError: an argument of the wrong type or out of range (named).
    """
    if not isinstance(gate, LLMGate):
        raise TypeError(f"gate must be an LLMGate, got {type(gate).__name__}")
    max_body_bytes = check_int("max_body_bytes", max_body_bytes, 0)
    if engine is not None and not isinstance(engine, OpenAIEngine):
        raise TypeError(f"engine must be an OpenAIEngine or None, got {type(engine).__name__}")
    process_metrics = check_bool("process_metrics", process_metrics)
    manage_gate = check_bool("manage_gate", manage_gate)
    if registry is None:
        registry = CollectorRegistry()
        register_prometheus(gate, registry)
        if process_metrics:
            ProcessCollector(registry=registry)
    elif not isinstance(registry, CollectorRegistry):
        raise TypeError(f"registry must be a CollectorRegistry, got {type(registry).__name__}")
    check = None
    if engine is not None and upstream_health_path is not None:
        check = UpstreamCheck(engine, path=check_str("upstream_health_path", upstream_health_path))
    return _OpenAIBodyLimit(_Gateway(gate, engine, registry, manage_gate, check), max_body_bytes)


@contextlib.asynccontextmanager
async def gateway_lifespan(
    gate: LLMGate, *, drain_timeout_s: float | None = 30.0
) -> AsyncIterator[None]:
    """Start ``gate`` on entry; on exit close it, letting admitted requests finish for at most
    ``drain_timeout_s`` seconds (None: no bound)."""
    await gate.start()
    try:
        yield
    finally:
        await gate.aclose(drain=True, timeout_s=drain_timeout_s)


class _OpenAIBodyLimit(BodyLimit):
    """:class:`BodyLimit` answering 413 in OpenAI's error format."""

    async def _refuse(self, send: Send, *, close: bool) -> None:
        message = f"the request body is larger than {self.max_bytes} bytes"
        body = _error(message, "invalid_request_error", "request_too_large")
        await _send_json(send, 413, body, [(b"connection", b"close")] if close else None)


class _Gateway:
    """The routes (the ASGI app inside the body limit)."""

    def __init__(
        self,
        gate: LLMGate,
        engine: OpenAIEngine | None,
        registry: CollectorRegistry,
        manage_gate: bool,
        check: UpstreamCheck | None,
    ) -> None:
        self.gate = gate
        self.check = check
        self.manage_gate = manage_gate
        self.engine = engine
        self.registry = registry

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return  # websockets: not served (closing the scope refuses them)
        path = _route(scope)
        method = scope.get("method", "GET")
        if path in COMPLETION_ROUTES:
            if method != "POST":
                await _send_json(send, 405, _error(f"{path} takes POST", "invalid_request_error"))
                return
            await self._complete(path, scope, receive, send)
        elif path in ("/health", "/metrics", "/v1/models") and method in ("GET", "HEAD"):
            if path == "/health":
                await _send_json(send, *await _health(self.gate, self.check))
            elif path == "/metrics":
                body = generate_latest(self.registry)
                await _send(send, 200, body, [(b"content-type", CONTENT_TYPE_LATEST.encode())])
            else:
                await self._models(scope, send)
        else:
            await _send_json(
                send, 404, _error(f"no route {method} {path}", "invalid_request_error")
            )

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        """Lifespan events: acknowledged, and with ``manage_gate`` the gate's start and close."""
        async with contextlib.AsyncExitStack() as stack:
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    try:
                        if self.manage_gate:
                            await stack.enter_async_context(gateway_lifespan(self.gate))
                    except Exception as exc:
                        await send({"type": "lifespan.startup.failed", "message": repr(exc)})
                        return
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await stack.aclose()
                    await send({"type": "lifespan.shutdown.complete"})
                    return

    async def _models(self, scope: Scope, send: Send) -> None:
        if self.engine is None:
            await _send_json(
                send, 404, _error("no engine to list models of", "invalid_request_error")
            )
            return
        forwarded = _forwarded(scope)
        if isinstance(forwarded, str):
            await _send_json(send, 400, _error(forwarded, "invalid_request_error"))
            return
        headers, query = forwarded
        try:
            response = await self.engine.get(
                f"/v1/models?{query}" if query else "/v1/models", headers
            )
        except UpstreamError as exc:
            await _send_json(send, exc.http_status, _upstream_error(exc))
            return
        content_type = response.headers.get("content-type", "application/json").encode()
        await _send(send, response.status_code, response.content, [(b"content-type", content_type)])

    async def _complete(self, path: str, scope: Scope, receive: Receive, send: Send) -> None:
        body = await _read_body(receive)
        if body is None:
            return  # the client went away, or the body limit answered 413
        payload = _request_payload(body)
        forwarded = _forwarded(scope)
        if isinstance(forwarded, str):
            await _refuse(send, _Refusal(forwarded))
            return
        if isinstance(payload, _Refusal):
            await _refuse(send, payload)
            return
        headers, query = forwarded
        request = LLMRequest(
            payload=payload,
            prompt_tokens=estimate_prompt_tokens(payload),
            max_tokens=requested_max_tokens(payload),
            path=path,
            headers=headers,
            query=query,
        )
        exchange = _Exchange(
            self.gate,
            request,
            send,
            streamed=payload.get("stream") is True,
            usage=_asks_for_usage(payload),
        )
        await _until_disconnect(exchange.run(), receive)


class _Exchange:
    """One request through the gate, answered on ``send``."""

    def __init__(
        self, gate: LLMGate, request: LLMRequest, send: Send, *, streamed: bool, usage: bool
    ) -> None:
        self.gate = gate
        self.request = request
        self.send = send
        self.streamed = streamed
        self.usage = usage  # the client asked for the usage event
        self.started = False  # response headers sent

    async def run(self) -> None:
        try:
            stream = self.gate.submit(self.request)
        except Exception as exc:  # the request's fields were checked: the gateway failed
            await self._fail(exc)
            return
        try:
            try:
                await stream.admitted()
            except GateRejectedError as exc:
                retry = [(b"retry-after", str(_retry_after_header(exc.retry_after_s)).encode())]
                kind = "rate_limit_error" if exc.http_status == 429 else "overloaded_error"
                body = _error(str(exc), kind, _code(exc))
                await _send_json(self.send, exc.http_status, body, retry)
                return
            except Exception as exc:
                await self._fail(exc)
                return
            if self.streamed:
                await self._stream(stream)
            else:
                await self._collect(stream)
        finally:
            await stream.aclose()

    async def _stream(self, stream: GateStream) -> None:
        try:
            async for chunk in stream:
                data = _chunk_bytes(chunk)
                if not self.usage and _usage_only(chunk, data):
                    continue  # asked for upstream for the gate's counts, not by the client
                if not self.started:
                    self.started = True
                    await self.send(
                        {"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS}
                    )
                await self.send({"type": "http.response.body", "body": data, "more_body": True})
        except Exception as exc:
            await self._fail(exc)
            return
        if not self.started:
            await self.send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
        await self.send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _collect(self, stream: GateStream) -> None:
        assembler = ResponseAssembler(chat=self.request.path.endswith("/chat/completions"))
        try:
            async for chunk in stream:
                data = event_data(_chunk_bytes(chunk))
                if data is None or data.strip() == DONE:
                    continue
                event = json.loads(data)
                if isinstance(event, dict):
                    assembler.add(event)
        except Exception as exc:
            await self._fail(exc)
            return
        await _send_json(self.send, 200, assembler.result())

    async def _fail(self, exc: Exception) -> None:
        """Answer with the error; after the headers, as the stream's last event."""
        status, body = _failure(exc)
        _log.info("gateway.request_failed", status=status, error=describe(exc))
        if self.started:
            event = b"data: " + json.dumps(body).encode() + b"\n\n"
            with contextlib.suppress(OSError):  # the client is gone: nobody to tell
                await self.send({"type": "http.response.body", "body": event, "more_body": False})
        elif (
            isinstance(exc, RequestFailedError)
            and isinstance(exc.cause, UpstreamHTTPError)
            and not isinstance(exc.cause, UpstreamEventError)  # an answer, not an event
            and _is_json(exc.cause.body)
        ):
            await _send(
                self.send, status, exc.cause.body.encode(), [(b"content-type", b"application/json")]
            )
        elif status in (503, 504):  # shed as too late, or shutting down: another try may do
            await _send_json(self.send, status, body, [(b"retry-after", b"1")])
        else:
            await _send_json(self.send, status, body)


async def _until_disconnect(work: Awaitable[None], receive: Receive) -> None:
    """Run ``work`` until it ends or the client disconnects (then it is cancelled, and its own
    cleanup closes the request)."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for pending in (task, watcher):
            pending.cancel()
        for pending in (task, watcher):
            with contextlib.suppress(asyncio.CancelledError):
                await pending
    error = None if task.cancelled() else task.exception()
    if error is not None:
        raise error


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _read_body(receive: Receive) -> bytes | None:
    """The whole request body, or None when the client disconnected first."""
    parts = []
    while True:
        message: Message = await receive()
        if message["type"] == "http.disconnect":
            return None
        parts.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(parts)


def _retry_after_header(retry_after_s: float) -> int:
    """``Retry-After`` in whole seconds: rounded up, never 0 (a 0 invites an immediate retry
    into the same full gate)."""
    return max(1, math.ceil(retry_after_s))


def _route(scope: Scope) -> str:
    """The request's path below the app's mount point: ASGI's ``path`` is the whole path and
    ``root_path`` the prefix it is mounted at (Starlette's ``Mount`` keeps ``path`` whole)."""
    path: str = scope.get("path", "")
    root: str = scope.get("root_path", "")
    if root and path.startswith(root):
        return path[len(root) :] or "/"
    return path


def _forwarded(scope: Scope) -> tuple[dict[str, str], str] | str:
    """What goes upstream with the request besides its body: the headers of
    :data:`PASSED_HEADERS` and the query string as it came (percent-encoded); or why they
    cannot go, a value that is not ASCII (an HTTP client could not send it on)."""
    headers = _passed_headers(scope)
    if isinstance(headers, str):
        return headers
    query: bytes = scope.get("query_string", b"")
    if not query.isascii():
        return "the query string is not ASCII"
    return headers, query.decode("ascii")


#: the client's headers the gateway sends upstream: credentials (OpenAI's bearer token,
#: Azure's api-key), OpenAI's organization and project, and a request id for tracing
PASSED_HEADERS = frozenset(
    {b"authorization", b"api-key", b"openai-organization", b"openai-project", b"x-request-id"}
)


def _passed_headers(scope: Scope) -> dict[str, str] | str:
    """The client's headers of :data:`PASSED_HEADERS`, or why they cannot be passed on."""
    passed = {}
    for name, value in scope.get("headers", ()):
        name = name.lower()
        if name in PASSED_HEADERS:
            if not value.isascii():
                return f"the {name.decode()} header must be ASCII"
            passed[name.decode()] = value.decode("ascii")
    return passed


def _asks_for_usage(payload: dict[str, Any]) -> bool:
    options = payload.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


def _usage_only(chunk: Chunk, data: bytes) -> bool:
    """Whether ``chunk`` is the usage event alone (``"choices": []``), which the gateway asks
    the engine for whatever the client asked."""
    if chunk.usage is None or chunk.tokens:
        return False
    text = event_data(data)
    if text is None:
        return False
    try:
        event = json.loads(text)
    except ValueError:
        return False
    return isinstance(event, dict) and event.get("choices") == []


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not a JSON number")


#: the longest integer the body may hold, in digits (Python's own bound on int(str))
MAX_INT_DIGITS = 4300

#: the largest output budget a request may ask for (an int32, as the engines' APIs take)
MAX_TOKENS_BOUND = 2**31 - 1


class _TooManyDigitsError(ValueError):
    pass


def _parse_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise _TooManyDigitsError
    return int(text)


@dataclasses.dataclass(frozen=True, slots=True)
class _Refusal:
    """Why a request is refused with a 400, and the field at fault (OpenAI's ``param``)."""

    message: str
    param: str | None = None


async def _refuse(send: Send, refusal: _Refusal) -> None:
    """A 400 in OpenAI's error format: what is wrong, in words that do not echo the request."""
    answer = _error(refusal.message, "invalid_request_error")
    answer["error"]["param"] = refusal.param
    await _send_json(send, 400, answer)


def _request_payload(body: bytes) -> dict[str, Any] | _Refusal:
    """The request's JSON object, or why it is refused (400), without echoing the body: not
    JSON (NaN and infinities included), nested beyond the parser's depth, not an object,
    holding what cannot be sent on as JSON (a number out of range, a lone surrogate), or a
    field of the OpenAI API of the wrong type (:func:`_field_problem`)."""
    try:
        payload = json.loads(body, parse_constant=_no_constant, parse_int=_parse_int)
    except RecursionError:
        return _Refusal("the body is nested too deeply")
    except _TooManyDigitsError:
        return _Refusal(f"the body holds an integer of more than {MAX_INT_DIGITS} digits")
    except ValueError as exc:
        return _Refusal(f"the body is not JSON: {exc}")  # the parser's words: short, no body
    if not isinstance(payload, dict):
        return _Refusal(f"the body must be a JSON object, got {type(payload).__name__}")
    try:
        json.dumps(payload, allow_nan=False, ensure_ascii=False).encode("utf-8")
    except RecursionError:
        return _Refusal("the body is nested too deeply")
    except ValueError:  # UnicodeEncodeError is one
        return _Refusal(
            "the body holds a number out of range or a string that is not valid Unicode"
        )
    return _field_problem(payload) or payload


def _field_problem(payload: dict[str, Any]) -> _Refusal | None:
    """What is wrong with the fields the gateway reads itself, in OpenAI's terms, or None:
    ``max_tokens`` and ``max_completion_tokens`` an integer in [1, 2**31 - 1] or null,
    ``stream`` and ``stream_options.include_usage`` a boolean or null, ``stream_options`` an
    object or null (the engine judges every other field)."""
    for key in ("max_tokens", "max_completion_tokens"):
        value = payload.get(key)
        if value is None:
            continue
        if type(value) is not int:
            return _wrong_type(key, "an integer", value)
        if not 1 <= value <= MAX_TOKENS_BOUND:
            return _Refusal(f"{key} must be in [1, {MAX_TOKENS_BOUND}]", key)
    if payload.get("stream") is not None and not isinstance(payload["stream"], bool):
        return _wrong_type("stream", "a boolean", payload["stream"])
    options = payload.get("stream_options")
    if options is None:
        return None
    if not isinstance(options, dict):
        return _wrong_type("stream_options", "an object", options)
    usage = options.get("include_usage")
    if usage is not None and not isinstance(usage, bool):
        return _wrong_type("stream_options.include_usage", "a boolean", usage)
    return None


def _wrong_type(field: str, wanted: str, value: object) -> _Refusal:
    return _Refusal(f"{field} must be {wanted} or null, got {_json_type(value)}", field)


def _json_type(value: object) -> str:
    """The JSON name of ``value``'s type (what an OpenAI error says it got)."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _chunk_bytes(chunk: Chunk) -> bytes:
    data = chunk.data
    if isinstance(data, bytes | bytearray | memoryview):
        return bytes(data)
    if isinstance(data, str):
        return data.encode("utf-8")
    raise TypeError(f"the gateway forwards bytes or str chunks, got {type(data).__name__}")


def _failure(exc: Exception) -> tuple[int, dict[str, Any]]:
    """The status and OpenAI error body for a request that ended with ``exc``."""
    if isinstance(exc, RequestFailedError):
        cause = exc.cause
        if isinstance(cause, UpstreamError):
            return cause.http_status, _upstream_error(cause)
        if isinstance(cause, DeadlineExceededError):
            exc = cause
        else:  # the exception's own text stays in the log: it may hold the request
            message = f"the engine failed the request ({type(cause).__name__})"
            return 502, _error(message, "upstream_error", "engine_failed")
    if isinstance(exc, DeadlineExceededError):
        return 504, _error(
            str(exc) or "the request's deadline passed", "timeout_error", "deadline_exceeded"
        )
    if isinstance(exc, BatcherClosedError):
        return 503, _error(
            str(exc) or "the gateway is shutting down", "unavailable_error", "gateway_closed"
        )
    if isinstance(exc, UpstreamError):
        return exc.http_status, _upstream_error(exc)
    if isinstance(exc, StreamBufferFullError):  # the client stopped reading its stream
        return 408, _error(str(exc), "timeout_error", "reader_behind")
    # the exception's own text stays in the log: it may hold the request
    return 500, _error(
        f"the gateway failed ({type(exc).__name__})", "internal_error", "internal_error"
    )


def _upstream_error(exc: UpstreamError) -> dict[str, Any]:
    return _error(str(exc), "upstream_error", _code(exc))


def _code(exc: Exception) -> str:
    """``UpstreamTimeoutError`` -> ``upstream_timeout``: the class name in snake case, less
    ``_error``."""
    name = type(exc).__name__.removesuffix("Error")
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name).lower()


def _error(message: str, kind: str, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


async def _health(gate: LLMGate, check: UpstreamCheck | None) -> tuple[int, dict[str, Any]]:
    """200 and the gate's state while it takes requests and its engine answers (or is not
    asked); 503 once it is closing, or while the engine does not answer."""
    upstream = None if check is None else await check.state()
    stats = gate.stats()
    engine = stats.engine
    status = "ok"
    if stats.closed:
        status = "closed"
    elif upstream is not None and not upstream.up:
        status = "upstream_unavailable"
    body: dict[str, Any] = {
        "status": status,
        "gate": {
            "name": stats.name,
            "closed": stats.closed,
            "limit": stats.limit,
            "in_flight": stats.in_flight,
            "waiting": stats.waiting,
            "counts": dataclasses.asdict(stats.counts),
            "engine": None if engine is None else dataclasses.asdict(engine),
        },
    }
    if check is not None and upstream is not None:
        body["upstream"] = upstream.as_json(check.clock())
    return (200 if status == "ok" else 503), body


async def _send_json(
    send: Send, status: int, body: Any, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    await _send(
        send,
        status,
        json.dumps(body).encode(),
        [(b"content-type", b"application/json"), *(headers or [])],
    )


async def _send(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    headers = [*headers, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})

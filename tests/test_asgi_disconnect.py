"""CancelOnDisconnect: a request whose client has gone stops being handled (its batcher request
leaves the queue); every other request is handled as before."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import httpx
import pytest
from fastapi import BackgroundTasks, FastAPI, Request

from adaptive_batcher import AdaptiveBatcher
from adaptive_batcher.asgi import BodyLimit, CancelOnDisconnect
from tests.gateway.servers import serving


def handler_app(events: list[str], hold_s: float) -> FastAPI:
    """A FastAPI app whose ``/slow`` route holds ``hold_s`` and notes how it ended."""
    app = FastAPI()

    @app.post("/slow")
    async def slow(payload: dict[str, Any]) -> dict[str, Any]:
        try:
            await asyncio.sleep(hold_s)
        except asyncio.CancelledError:
            events.append("cancelled")
            raise
        events.append("finished")
        return payload

    @app.get("/fast")
    async def fast(tasks: BackgroundTasks) -> dict[str, str]:
        tasks.add_task(_after, events)
        return {"ok": "yes"}

    return app


async def _after(events: list[str]) -> None:
    await asyncio.sleep(0.05)  # after the answer went out, the client's connection may close
    events.append("background done")


async def _give_up(url: str, path: str, after_s: float) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=after_s) as client:
        with pytest.raises(httpx.ReadTimeout):
            await client.post(path, json={"x": 1})


@pytest.mark.parametrize("wrapped", [True, False])
def test_a_handler_whose_client_left_is_cancelled(wrapped: bool) -> None:
    """Before (``wrapped`` False, FastAPI alone): the handler ran on to its end after its
    client gave up."""
    events: list[str] = []

    async def main() -> None:
        app: Any = handler_app(events, hold_s=1.5)
        async with serving(CancelOnDisconnect(app) if wrapped else app) as url:
            await _give_up(url, "/slow", after_s=0.2)
            await asyncio.sleep(0.5)
            assert events == (["cancelled"] if wrapped else [])
            await asyncio.sleep(1.2)

    asyncio.run(main())
    assert events == (["cancelled"] if wrapped else ["finished"])


def test_answers_keep_alive_and_background_tasks_run_on() -> None:
    """A client that stays gets its answer, on a connection it keeps; the server's disconnect
    after a complete answer cancels nothing (the background task runs to its end)."""
    events: list[str] = []

    async def main() -> list[Any]:
        app = BodyLimit(CancelOnDisconnect(handler_app(events, 0.05)), max_bytes=1024)
        async with serving(app) as url, httpx.AsyncClient(base_url=url) as client:
            answers = [(await client.post("/slow", json={"n": n})).json() for n in range(3)]
            answers.append((await client.get("/fast")).json())
            await asyncio.sleep(0.3)
            return answers

    assert asyncio.run(main()) == [{"n": 0}, {"n": 1}, {"n": 2}, {"ok": "yes"}]
    assert events == ["finished"] * 3 + ["background done"]


def test_a_queued_request_whose_client_left_never_reaches_the_model() -> None:
    """One batch of 1 runs for 0.6 s; the request queued behind it loses its client after
    0.2 s: it leaves the batcher's queue, counted as cancelled, and the model never sees it."""
    seen: list[list[int]] = []

    async def model(batch: list[int]) -> list[int]:
        seen.append(list(batch))
        await asyncio.sleep(0.6)
        return batch

    async def main() -> Any:
        batcher = AdaptiveBatcher(model, max_batch_size=1, window_ms=0)
        app = FastAPI()

        @app.post("/predict")
        async def predict(request: Request) -> int:
            return int(await batcher.submit((await request.json())["x"]))

        async with batcher, serving(CancelOnDisconnect(app)) as url:
            async with httpx.AsyncClient(base_url=url, timeout=5.0) as client:
                first = asyncio.ensure_future(client.post("/predict", json={"x": 1}))
                await asyncio.sleep(0.1)
                async with httpx.AsyncClient(base_url=url, timeout=0.2) as leaving:
                    with pytest.raises(httpx.ReadTimeout):
                        await leaving.post("/predict", json={"x": 2})
                assert (await first).json() == 1
            await asyncio.sleep(0.1)
            return batcher.stats().counts

    counts = asyncio.run(main())
    assert seen == [[1]]
    assert counts.cancelled == 1


def _once_then_disconnect() -> Any:
    """A server's receive: the request (no body), then, 50 ms later, ``http.disconnect``."""
    messages = [{"type": "http.request", "body": b"", "more_body": False}]

    async def receive() -> Any:
        if messages:
            return messages.pop(0)
        await asyncio.sleep(0.05)
        return {"type": "http.disconnect"}

    return receive


@pytest.mark.parametrize("answer_first", [True, False])
def test_the_apps_own_read_after_its_body_shares_the_watch(answer_first: bool) -> None:
    """The app's read after its body (Starlette's ``request.is_disconnected()``, a streamed
    answer's listener) gets the watch's ``http.disconnect``; before a complete answer, the
    disconnect cancels the app instead."""
    sent: list[Any] = []
    read: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        if answer_first:
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"done"})
        read.append((await receive())["type"])

    async def send(message: Any) -> None:
        sent.append(message["type"])

    scope = {"type": "http", "method": "GET", "path": "/", "headers": []}
    run = CancelOnDisconnect(app)(scope, _once_then_disconnect(), send)
    asyncio.run(asyncio.wait_for(run, 2))
    answer = ["http.response.start", "http.response.body"]
    # answered first: the app's read gets the disconnect; else the app is cancelled, and its
    # request's answer ended for the server (a 499 it drops)
    assert (sent, read) == ((answer, ["http.disconnect"]) if answer_first else (answer, []))


def test_the_requests_own_cancellation_cancels_the_app() -> None:
    ended: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            ended.append("cancelled")
            raise

    async def receive() -> Any:
        await asyncio.sleep(10)
        return {"type": "http.disconnect"}

    async def main() -> None:
        scope = {"type": "http", "method": "GET", "path": "/", "headers": []}
        task = asyncio.ensure_future(CancelOnDisconnect(app)(scope, receive, _no_send))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0)

    asyncio.run(main())
    assert ended == ["cancelled"]


async def _no_send(message: Any) -> None:
    raise AssertionError(f"nothing is sent: {message}")


def test_other_scopes_pass_through() -> None:
    seen: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope["type"])

    asyncio.run(CancelOnDisconnect(app)({"type": "lifespan"}, _no_receive, _no_send))
    assert seen == ["lifespan"]


async def _no_receive() -> Any:
    raise AssertionError("nothing is read")


def test_an_app_that_catches_the_cancellation_leaves_its_task_uncancelled() -> None:
    """The app ends itself on the watch's cancellation: the server's task is left as if
    nothing had been cancelled (an ``asyncio.timeout`` after it still works)."""
    states: list[int] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(10)

    statuses: list[int] = []

    async def send(message: Any) -> None:
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    async def main() -> None:
        scope = {"type": "http", "method": "GET", "path": "/", "headers": []}
        await CancelOnDisconnect(app)(scope, _once_then_disconnect(), send)
        task = asyncio.current_task()
        assert task is not None
        states.append(task.cancelling())
        async with asyncio.timeout(1):
            await asyncio.sleep(0.01)

    asyncio.run(main())
    assert (states, statuses) == ([0], [499])


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_a_middleware_outside_sees_an_answer_for_a_request_whose_client_left() -> None:
    """FastAPI's ``@app.middleware("http")`` declared after it (so outside it): before, every
    request whose client left was logged by uvicorn as "Exception in ASGI application"
    (Starlette's ``call_next``: "No response returned"); now its answer is a 499 the server
    drops, and nothing is logged."""
    events: list[str] = []
    app = handler_app(events, hold_s=1.5)
    app.add_middleware(CancelOnDisconnect)

    @app.middleware("http")
    async def timing(request: Request, call_next: Any) -> Any:
        return await call_next(request)

    records = _Records()
    server_log = logging.getLogger("uvicorn.error")

    async def main() -> None:
        async with serving(app) as url:
            server_log.addHandler(records)  # after uvicorn's logging set-up, which resets it
            try:
                await _give_up(url, "/slow", after_s=0.2)
                await asyncio.sleep(0.5)
            finally:
                server_log.removeHandler(records)

    asyncio.run(main())
    assert events == ["cancelled"]
    assert not [m for m in records.messages if "Exception in ASGI application" in m]


def test_a_server_that_refuses_the_gone_clients_answer_ends_the_request_quietly() -> None:
    """A server that raises on a send to a client that has gone: the request still ends
    without an error (the answer was only for a middleware outside)."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await asyncio.sleep(10)

    async def refusing(message: Any) -> None:
        raise OSError("the client has gone")

    scope = {"type": "http", "method": "GET", "path": "/", "headers": []}
    run = CancelOnDisconnect(app)(scope, _once_then_disconnect(), refusing)
    asyncio.run(asyncio.wait_for(run, 2))

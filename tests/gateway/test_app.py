"""The gateway app: requests through the real LLMGate to the fake engine, in process (httpx's
ASGI transport both ways) for the answers and errors, and under real uvicorn servers for a
client's disconnect and an engine killed mid-run."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from adaptive_batcher.errors import DeadlineExceededError
from adaptive_batcher.gateway.app import gateway_app, gateway_lifespan
from adaptive_batcher.gateway.openai import OpenAIEngine
from adaptive_batcher.gateway.shell import LLMGate
from adaptive_batcher.gateway.sse import SSESplitter, event_data
from adaptive_batcher.gateway.telemetry import PrometheusEngineTelemetry
from adaptive_batcher.gateway.types import LLMRequest
from adaptive_batcher.llm.errors import TTFTUnreachableError
from adaptive_batcher.llm.slo import TokenSLO
from tests.gateway.fake_openai import FakeOpenAI
from tests.gateway.fakes import eventually
from tests.gateway.servers import FakeProcess, serving

SLO = TokenSLO(ttft_ms=5_000.0, tpot_ms=1_000.0)  # loose: nothing is refused for lateness
BOUND_S = 20.0  # no test waits longer on any one event


def asgi_client(app: Any, base_url: str = "http://gateway") -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=base_url)


@contextlib.asynccontextmanager
async def gateway(
    fake: FakeOpenAI | None = None,
    *,
    upstream: str = "http://fake",
    max_body_bytes: int = 1 << 20,
    **gate_options: Any,
) -> AsyncIterator[tuple[httpx.AsyncClient, LLMGate]]:
    """A started gate in front of ``fake`` (in process) or ``upstream`` (over TCP), and a
    client of its app."""
    upstream_client = (
        httpx.AsyncClient(transport=httpx.ASGITransport(app=fake)) if fake is not None else None
    )
    engine = OpenAIEngine(upstream, client=upstream_client)
    gate = LLMGate(engine, SLO, **gate_options)
    app = gateway_app(gate, max_body_bytes=max_body_bytes, engine=engine)
    async with gateway_lifespan(gate), asgi_client(app) as client:
        yield client, gate
    await engine.aclose()
    if upstream_client is not None:
        await upstream_client.aclose()


def events(body: bytes) -> list[bytes]:
    return SSESplitter().feed(body)


async def test_a_stream_is_forwarded_byte_for_byte() -> None:
    fake = FakeOpenAI()
    async with gateway(fake) as (client, _):
        payload = {
            "model": "fake",
            "prompt": "hello",
            "max_tokens": 3,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        response = await client.post("/v1/completions", json=payload)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    # what the engine sends for the body the gateway sent it, asked directly
    async with asgi_client(FakeOpenAI(), "http://fake") as direct:
        expected = await direct.post("/v1/completions", json=fake.bodies[0])
    assert response.content == expected.content
    assert fake.bodies[0]["stream_options"] == {"include_usage": True}
    assert [event_data(e) for e in events(response.content)][-1] == "[DONE]"


@pytest.mark.parametrize("options", [None, {}, {"include_usage": False}])
async def test_the_usage_event_reaches_only_a_client_that_asked_for_it(
    options: dict[str, bool] | None,
) -> None:
    fake = FakeOpenAI()
    payload: dict[str, Any] = {"model": "fake", "prompt": "hello", "stream": True}
    if options is not None:
        payload["stream_options"] = options
    async with gateway(fake) as (client, gate):
        response = await client.post("/v1/chat/completions", json=payload)
        usage = gate.stats()  # the gate still read it
    datas = [event_data(e) for e in events(response.content)]
    decoded = [json.loads(d) for d in datas[:-1]]
    assert datas[-1] == "[DONE]" and len(decoded) == 4  # the role, three tokens
    assert all(event["choices"] and "usage" not in event for event in decoded)
    assert fake.bodies[0]["stream_options"]["include_usage"] is True  # asked upstream
    assert usage.counts.completed == 1


async def test_a_request_without_stream_gets_one_json_answer() -> None:
    fake = FakeOpenAI()
    async with gateway(fake) as (client, _):
        completion = await client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 3})
        chat = await client.post(
            "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "hi"}], "stream": False},
        )
    assert (
        completion.status_code == 200 and completion.headers["content-type"] == "application/json"
    )
    answer = completion.json()
    assert answer["object"] == "text_completion"
    assert answer["choices"] == [
        {"index": 0, "text": "t0t1t2", "logprobs": None, "finish_reason": "length"}
    ]
    assert answer["usage"] == {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
    message = chat.json()["choices"][0]["message"]
    assert chat.json()["object"] == "chat.completion"
    assert message == {"role": "assistant", "content": "t0t1t2"}
    assert all(body["stream"] is True for body in fake.bodies)  # streamed upstream all the same


async def test_the_clients_authorization_is_passed_upstream() -> None:
    fake = FakeOpenAI()
    async with gateway(fake) as (client, _):
        await client.post(
            "/v1/completions", json={"prompt": "x"}, headers={"authorization": "Bearer c"}
        )
        await client.post("/v1/completions", json={"prompt": "x"})
    assert fake.authorizations == ["Bearer c", None]


def assert_openai_error(
    response: httpx.Response, status: int, code: str | None = None
) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if code is not None:
        assert error["code"] == code
    return error


async def test_bad_bodies_get_400_and_other_routes_404_or_405() -> None:
    fake = FakeOpenAI()
    async with gateway(fake) as (client, _):
        not_json = await client.post("/v1/completions", content=b"{nope")
        not_object = await client.post("/v1/chat/completions", json=[1, 2])
        wrong_method = await client.get("/v1/completions")
        no_route = await client.post("/v1/embeddings", json={})
    assert "not JSON" in assert_openai_error(not_json, 400)["message"]
    assert "JSON object" in assert_openai_error(not_object, 400)["message"]
    assert_openai_error(wrong_method, 405)
    assert_openai_error(no_route, 404)
    assert fake.bodies == []


async def test_a_body_over_the_limit_gets_413_before_it_is_read() -> None:
    fake = FakeOpenAI()
    async with gateway(fake, max_body_bytes=100) as (client, _):
        response = await client.post("/v1/completions", json={"prompt": "x" * 200})
        fits = await client.post("/v1/completions", json={"prompt": "x"})
        held_back = await client.post(
            "/v1/completions", json={"prompt": "x" * 200}, headers={"expect": "100-continue"}
        )
    assert_openai_error(response, 413, "request_too_large")
    assert "connection" not in response.headers  # drained: the connection stays
    assert_openai_error(held_back, 413, "request_too_large")  # drained as any other body
    assert fits.status_code == 200
    assert len(fake.bodies) == 1


async def test_an_engine_error_before_the_first_byte_keeps_its_status_and_body() -> None:
    async with gateway(FakeOpenAI()) as (client, _):
        response = await client.post(
            "/v1/completions", json={"prompt": "x", "fake_status": 500, "stream": True}
        )
    assert response.status_code == 500
    assert response.json()["error"]["message"] == "fake failure"  # the engine's own body


async def test_an_engine_failure_mid_stream_ends_it_with_an_error_event() -> None:
    async with gateway(FakeOpenAI()) as (client, _):
        response = await client.post(
            "/v1/completions", json={"prompt": "x", "fake_break_after": 2, "stream": True}
        )
    assert response.status_code == 200
    received = events(response.content)
    assert [json.loads(event_data(e) or "")["choices"][0]["text"] for e in received[:2]] == [
        "t0",
        "t1",
    ]
    error = json.loads(event_data(received[-1]) or "")["error"]
    assert error["code"] == "upstream_protocol" and "[DONE]" in error["message"]
    assert len(received) == 3


async def test_an_engines_error_event_is_a_502_in_openais_format() -> None:
    async with gateway(FakeOpenAI()) as (client, _):
        for stream in (True, False):
            response = await client.post(
                "/v1/completions", json={"prompt": "x", "fake_error_event": True, "stream": stream}
            )
            # the engine accepted the request and failed it (its event says 400): not the
            # client's fault, and not the engine's body passed on as the gateway's answer
            assert_openai_error(response, 502, "upstream_event")
            message = response.json()["error"]["message"]
            assert message == "the engine sent an error event mid-stream: fake engine error"


async def test_an_unreachable_engine_gets_502() -> None:
    async with gateway(upstream="http://127.0.0.1:9") as (client, _):  # discard port: refused
        response = await client.post("/v1/completions", json={"prompt": "x", "stream": True})
    assert_openai_error(response, 502, "upstream_unavailable")


async def test_a_full_queue_gets_429_at_once_with_retry_after() -> None:
    fake = FakeOpenAI()
    async with gateway(fake, max_in_flight=1, max_queue=0) as (client, _):
        held = asyncio.ensure_future(
            client.post("/v1/completions", json={"prompt": "x", "fake_hold": True, "stream": True})
        )
        async with asyncio.timeout(BOUND_S):
            await fake.wait_active(1)
        refused = await client.post("/v1/completions", json={"prompt": "y", "stream": True})
        fake.release.set()
        async with asyncio.timeout(BOUND_S):
            answered = await held
    assert_openai_error(refused, 429, "gate_queue_full")
    assert refused.json()["error"]["type"] == "rate_limit_error"
    assert int(refused.headers["retry-after"]) >= 1  # never 0: that invites a retry storm
    assert answered.status_code == 200
    assert len(fake.bodies) == 1  # the refused request never reached the engine


class RefusingStream:
    """A GateStream whose admission fails with ``error``."""

    def __init__(self, error: Exception) -> None:
        self.error = error
        self.closed = False

    async def admitted(self) -> None:
        raise self.error

    def __aiter__(self) -> RefusingStream:
        return self

    async def __anext__(self) -> Any:
        raise StopAsyncIteration

    async def aclose(self) -> None:
        self.closed = True


class RefusingGate(LLMGate):
    """The real gate, but every request is refused with ``error``."""

    error: Exception
    streams: list[RefusingStream]

    def submit(self, request: LLMRequest) -> Any:
        stream = RefusingStream(self.error)
        self.streams.append(stream)
        return stream


async def answer_to_refusal(error: Exception) -> httpx.Response:
    gate = RefusingGate(OpenAIEngine("http://127.0.0.1:9"), SLO)
    gate.error, gate.streams = error, []
    async with asgi_client(gateway_app(gate)) as client:
        response = await client.post("/v1/completions", json={"prompt": "x", "stream": True})
    assert [s.closed for s in gate.streams] == [True]
    return response


async def test_a_late_first_token_gets_503_with_retry_after_rounded_up() -> None:
    response = await answer_to_refusal(TTFTUnreachableError(0.9, 0.3, retry_after_s=1.2))
    error = assert_openai_error(response, 503, "ttft_unreachable")
    assert error["type"] == "overloaded_error"
    assert response.headers["retry-after"] == "2"


async def test_a_passed_deadline_gets_504() -> None:
    response = await answer_to_refusal(DeadlineExceededError("waited too long"))
    assert_openai_error(response, 504, "deadline_exceeded")
    assert response.headers["retry-after"] == "1"  # shed as too late: another try may do


async def test_a_closed_gate_gets_503() -> None:
    fake = FakeOpenAI()
    engine = OpenAIEngine(
        "http://fake", client=httpx.AsyncClient(transport=httpx.ASGITransport(app=fake))
    )
    gate = LLMGate(engine, SLO)
    async with gateway_lifespan(gate):
        pass
    async with asgi_client(gateway_app(gate)) as client:
        response = await client.post("/v1/completions", json={"prompt": "x", "stream": True})
    assert_openai_error(response, 503, "gateway_closed")
    assert response.headers["retry-after"] == "1"  # another replica, or this one restarted
    assert fake.bodies == []


async def test_health_metrics_and_models() -> None:
    async with gateway(FakeOpenAI()) as (client, _):
        await client.post("/v1/completions", json={"prompt": "x"})
        health = await client.get("/health")
        metrics = await client.get("/metrics")
        models = await client.get("/v1/models")
    assert health.status_code == 200 and health.json()["status"] == "ok"
    assert isinstance(health.json()["gate"], dict)
    assert metrics.status_code == 200
    assert metrics.headers["content-type"].startswith("text/plain")
    assert "llm" in metrics.text  # the gate's collector, named after the gate
    assert models.json()["data"][0]["id"] == "fake"


def test_bad_arguments_are_named() -> None:
    gate = LLMGate(OpenAIEngine("http://127.0.0.1:9"), SLO)
    with pytest.raises(TypeError, match="gate"):
        gateway_app(object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_body_bytes"):
        gateway_app(gate, max_body_bytes=-1)
    with pytest.raises(TypeError, match="engine"):
        gateway_app(gate, engine="http://x")  # type: ignore[arg-type]


# -- real servers ----------------------------------------------------------------------------


_BODIES: dict[int, Any] = {}


async def read_until(response: httpx.Response, marker: bytes) -> bytes:
    """Read ``response`` on until ``marker`` arrives (one body iterator per response)."""
    body = _BODIES.setdefault(id(response), response.aiter_raw())
    received = b""
    async with asyncio.timeout(BOUND_S):
        async for data in body:
            received += data
            if marker in received:
                return received
    raise AssertionError(f"the stream ended without {marker!r}: {received!r}")


@contextlib.asynccontextmanager
async def tcp_gateway(
    upstream: str, **gate_options: Any
) -> AsyncIterator[tuple[httpx.AsyncClient, LLMGate]]:
    engine = OpenAIEngine(upstream)
    gate = LLMGate(engine, SLO, **gate_options)
    async with (
        gateway_lifespan(gate),
        serving(gateway_app(gate, engine=engine)) as url,
        httpx.AsyncClient(base_url=url, timeout=BOUND_S) as client,
    ):
        yield client, gate
    await engine.aclose()


async def test_a_client_disconnect_reaches_the_engine_and_frees_the_slot() -> None:
    fake = FakeOpenAI()
    async with serving(fake) as upstream, tcp_gateway(upstream, max_in_flight=1) as (client, _gate):
        stalled = {"prompt": "x", "fake_tokens": 5, "fake_stall_after": 1, "stream": True}
        async with client.stream("POST", "/v1/completions", json=stalled) as response:
            assert response.status_code == 200
            await read_until(response, b'"t0"')
        # the client closed its connection mid-stream: the engine sees its request go
        async with asyncio.timeout(BOUND_S):
            await fake.wait_disconnects(1)
            await fake.wait_active(0)
        # and the one slot is free again: the next request is answered
        answered = await client.post("/v1/completions", json={"prompt": "y", "stream": True})
    assert answered.status_code == 200 and b"data: [DONE]" in answered.content
    assert fake.disconnects == 1 and fake.completed == 1


async def test_a_client_that_leaves_the_queue_never_reaches_the_engine() -> None:
    fake = FakeOpenAI()
    async with serving(fake) as upstream, tcp_gateway(upstream, max_in_flight=1) as (client, gate):
        held = asyncio.ensure_future(
            client.post("/v1/completions", json={"prompt": "a", "fake_hold": True, "stream": True})
        )
        async with asyncio.timeout(BOUND_S):
            await fake.wait_active(1)
        queued = asyncio.ensure_future(
            client.post("/v1/completions", json={"prompt": "b", "stream": True})
        )
        await eventually(lambda: gate.stats().waiting == 1, BOUND_S)  # in the gate's queue
        queued.cancel()  # the client gives up while it waits there
        with contextlib.suppress(asyncio.CancelledError):
            await queued
        await eventually(lambda: gate.stats().waiting == 0, BOUND_S)  # the gate saw it go
        fake.release.set()
        async with asyncio.timeout(BOUND_S):
            first = await held
            after = await client.post("/v1/completions", json={"prompt": "c", "stream": True})
    assert first.status_code == 200 and after.status_code == 200
    assert [body["prompt"] for body in fake.bodies] == ["a", "c"]
    assert gate.stats().counts.cancelled == 1


async def test_an_engine_killed_mid_run_fails_its_streams_and_the_gateway_recovers() -> None:
    fake = FakeProcess()
    upstream = await fake.start()
    try:
        async with tcp_gateway(upstream) as (client, _gate):
            stalled = {"prompt": "x", "fake_tokens": 5, "fake_stall_after": 1, "stream": True}
            async with client.stream("POST", "/v1/completions", json=stalled) as response:
                await read_until(response, b'"t0"')
                await fake.kill()
                rest = await read_until(response, b'"error"')
            error = json.loads(event_data(events(rest)[-1]) or "")["error"]
            assert error["code"] == "upstream_protocol", error
            # while it is down: 502 at once
            down = await client.post("/v1/completions", json={"prompt": "y", "stream": True})
            assert_openai_error(down, 502, "upstream_unavailable")
            # back on the same port: served again
            await fake.start(fake.port)
            back = await client.post("/v1/completions", json={"prompt": "z", "stream": True})
            assert back.status_code == 200 and back.content.endswith(b"data: [DONE]\n\n")
    finally:
        await fake.stop()


async def test_slow_first_tokens_do_not_leave_an_idle_gate_refusing() -> None:
    # a fresh user's find: after a few slow first tokens, every later request was refused
    # with 503 ttft_unreachable on an idle engine, for good (nothing admitted, nothing learned)
    fake = FakeProcess()
    url = await fake.start()
    engine = OpenAIEngine(url)
    telemetry = PrometheusEngineTelemetry(f"{url}/metrics", interval_s=0.2)
    gate = LLMGate(engine, TokenSLO(ttft_ms=300.0, tpot_ms=50.0), telemetry=telemetry)
    slow = {"prompt": "x", "fake_tokens": 1, "fake_interval_ms": 1000}
    fast = {"prompt": "x", "fake_tokens": 2}
    try:
        async with gateway_lifespan(gate), asgi_client(gateway_app(gate, engine=engine)) as client:
            for _ in range(3):
                assert (await client.post("/v1/completions", json=slow)).status_code == 200
                for _ in range(3):
                    await client.post("/v1/completions", json=fast)
            await asyncio.sleep(3.0)  # the engine idle: the controller's forecast goes stale
            statuses = [
                (await client.post("/v1/completions", json=fast)).status_code for _ in range(5)
            ]
            stats = gate.stats()
    finally:
        await engine.aclose()
        await fake.kill()
    assert statuses == [200] * 5, statuses
    assert stats.in_flight == 0 and stats.waiting == 0


@pytest.mark.parametrize(
    ("body", "said"),
    [
        (b'{"prompt": "x", "temperature": NaN}', "not JSON"),
        (b'{"prompt": "x", "temperature": Infinity}', "not JSON"),
        (b'{"prompt": "x", "max_tokens": 1e400}', "out of range"),
        (b'{"prompt": "SECRET-\\ud800"}', "not valid Unicode"),
        (b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested too deeply"),
        (b'{"prompt": "SECRET", "n": ' + b"9" * 5000 + b"}", "more than 4300 digits"),
        (b'{"prompt": "SECRET", "max_tokens": 0}', "max_tokens must be in [1, 2147483647]"),
        (b'{"prompt": "SECRET", "max_tokens": 2147483648}', "max_tokens must be in [1, "),
        (b'{"prompt": "SECRET", "max_tokens": "5"}', "max_tokens must be an integer or null"),
        (b'{"prompt": "SECRET", "max_tokens": true}', "got a boolean"),
        (b'{"prompt": "SECRET", "max_completion_tokens": 2.5}', "got a number"),
        (b'{"prompt": "SECRET", "stream": "true"}', "stream must be a boolean or null"),
        (b'{"prompt": "SECRET", "stream_options": [1]}', "stream_options must be an object"),
        (
            b'{"prompt": "SECRET", "stream": true, "stream_options": {"include_usage": 1}}',
            "include_usage must be a boolean or null, got an integer",
        ),
    ],
    ids=[
        "nan",
        "infinity",
        "huge-number",
        "lone-surrogate",
        "deep-body",
        "4301-digits",
        "max-tokens-0",
        "max-tokens-over-int32",
        "max-tokens-string",
        "max-tokens-bool",
        "max-completion-tokens-float",
        "stream-string",
        "stream-options-array",
        "include-usage-int",
    ],
)
async def test_bodies_the_engine_cannot_take_get_400_without_an_echo(
    body: bytes, said: str
) -> None:
    fake = FakeOpenAI()
    async with gateway(fake, max_body_bytes=1 << 20) as (client, gate):
        response = await client.post(
            "/v1/completions", content=body, headers={"content-type": "application/json"}
        )
        counts = gate.stats().counts
    error = assert_openai_error(response, 400)
    assert said in error["message"] and "SECRET" not in response.text
    assert fake.bodies == [] and counts.failed == 0
    field = error["message"].partition(" must ")[0] if " must " in error["message"] else None
    assert error["param"] == field  # OpenAI's param: the field at fault, where there is one


async def test_the_query_string_goes_upstream_as_it_came() -> None:
    fake = FakeOpenAI()
    async with gateway(fake) as (client, _):
        completion = await client.post(
            "/v1/completions?api-version=2024-10-21&x=a%20b", json={"prompt": "x"}
        )
        chat = await client.post(
            "/v1/chat/completions?k=v", json={"messages": [{"role": "user", "content": "x"}]}
        )
        plain = await client.post("/v1/completions", json={"prompt": "x"})
        models = await client.get("/v1/models?limit=5")
    assert [r.status_code for r in (completion, chat, plain, models)] == [200] * 4
    assert fake.queries == [b"api-version=2024-10-21&x=a%20b", b"k=v", b"", b"limit=5"]


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/models"])
async def test_a_query_string_that_is_not_ascii_gets_400(path: str) -> None:
    fake = FakeOpenAI()
    async with gateway(fake) as (_, gate):
        app = gateway_app(gate, engine=OpenAIEngine("http://127.0.0.1:9"))
        scope = {
            "type": "http",
            "method": "POST" if path == "/v1/completions" else "GET",
            "path": path,
            "root_path": "",
            "query_string": b"k=\xff",
            "headers": [(b"content-type", b"application/json")],
        }
        request = {"type": "http.request", "body": b'{"prompt": "x"}', "more_body": False}
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            return request

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await app(scope, receive, send)
    assert sent[0]["status"] == 400
    assert json.loads(sent[1]["body"])["error"]["message"] == "the query string is not ASCII"
    assert fake.bodies == []


async def test_credentials_and_ids_go_upstream_other_headers_do_not() -> None:
    fake = FakeOpenAI()
    headers = {
        "api-key": "azure-key",
        "openai-organization": "org-1",
        "openai-project": "proj-1",
        "x-request-id": "req-7",
        "x-internal": "secret-routing",
    }
    async with gateway(fake) as (client, _):
        ok = await client.post("/v1/completions", json={"prompt": "x"}, headers=headers)
        bad = await client.post(
            "/v1/completions", json={"prompt": "x"}, headers={"api-key": "clé".encode()}
        )
    assert ok.status_code == 200
    sent = fake.headers[0]
    assert sent[b"api-key"] == b"azure-key" and sent[b"openai-organization"] == b"org-1"
    assert sent[b"openai-project"] == b"proj-1" and sent[b"x-request-id"] == b"req-7"
    assert b"x-internal" not in sent
    assert assert_openai_error(bad, 400)["message"] == "the api-key header must be ASCII"
    assert "clé" not in bad.text and len(fake.headers) == 1


async def test_a_failing_law_is_the_gateways_500_not_the_clients_400() -> None:
    from adaptive_batcher.llm import TokenController

    class BrokenLaw:
        name = "broken"

        def decide(self, observation: object) -> int:
            raise TypeError("internal detail of the law")

    controller = TokenController(SLO, BrokenLaw(), interval_s=0.001)
    fake = FakeOpenAI()
    async with gateway(fake, controller=controller) as (client, _):
        await client.post("/v1/completions", json={"prompt": "x"})  # starts the tick clock
        await asyncio.sleep(0.01)
        response = await client.post("/v1/completions", json={"prompt": "x"})  # ticks: raises
    error = assert_openai_error(response, 500)
    assert error["code"] == "internal_error" and "internal detail" not in response.text


async def test_null_and_in_range_fields_pass() -> None:
    fake = FakeOpenAI()
    bodies = [
        {"prompt": "x", "max_tokens": None, "stream": None, "stream_options": None},
        {"prompt": "x", "max_tokens": 1, "max_completion_tokens": 2147483647, "stream": False},
        {"prompt": "x", "stream": True, "stream_options": {"include_usage": None}},
    ]
    async with gateway(fake) as (client, _):
        statuses = [(await client.post("/v1/completions", json=b)).status_code for b in bodies]
    assert statuses == [200, 200, 200]
    assert len(fake.bodies) == 3


async def test_a_deeply_nested_prompt_is_estimated_not_recursed_into() -> None:
    fake = FakeOpenAI()
    prompt: Any = "a"
    for _ in range(500):
        prompt = [prompt]
    async with gateway(fake) as (client, _):
        response = await client.post("/v1/completions", json={"prompt": prompt})
    assert response.status_code == 200  # the engine judges the prompt; the gate estimated 0
    assert len(fake.bodies) == 1


async def test_a_non_ascii_authorization_gets_400_and_is_not_echoed() -> None:
    fake = FakeOpenAI()
    headers = {"authorization": "Bearer café-secret".encode()}
    async with gateway(fake) as (client, _):
        completion = await client.post("/v1/completions", json={"prompt": "x"}, headers=headers)
        models = await client.get("/v1/models", headers=headers)
    for response in (completion, models):
        assert "ASCII" in assert_openai_error(response, 400)["message"]
        assert "secret" not in response.text
    assert fake.bodies == []

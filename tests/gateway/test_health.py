"""The gateway's /health asks the engine's own health route: 503 ``upstream_unavailable`` while
the engine is down, unreachable or silent, at most one check per ``max_age_s``, an outage logged
when it begins and ends rather than on every check."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
import structlog

from adaptive_batcher.gateway.app import gateway_app, gateway_lifespan
from adaptive_batcher.gateway.health import UpstreamCheck
from adaptive_batcher.gateway.openai import OpenAIEngine
from adaptive_batcher.gateway.shell import LLMGate
from tests.gateway.fake_openai import FakeOpenAI
from tests.gateway.test_app import SLO, asgi_client


class Clock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def fake_engine(fake: FakeOpenAI) -> OpenAIEngine:
    return OpenAIEngine(
        "http://fake", client=httpx.AsyncClient(transport=httpx.ASGITransport(app=fake))
    )


async def health_of(engine: OpenAIEngine, **options: Any) -> httpx.Response:
    gate = LLMGate(engine, SLO)
    app = gateway_app(gate, engine=engine, **options)
    async with gateway_lifespan(gate), asgi_client(app) as client:
        return await client.get("/health")


async def test_health_is_ok_while_the_engine_answers() -> None:
    fake = FakeOpenAI()
    response = await health_of(fake_engine(fake))
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "ok"
    assert body["upstream"]["up"] is True and body["upstream"]["status"] == 200
    assert fake.health_checks == 1


@pytest.mark.parametrize("status", [500, 503])
async def test_health_is_503_while_the_engine_answers_5xx(status: int) -> None:
    fake = FakeOpenAI()
    fake.health_status = status
    response = await health_of(fake_engine(fake))
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "upstream_unavailable"
    assert body["upstream"] == body["upstream"] | {"up": False, "status": status}
    assert str(status) in body["upstream"]["error"]


async def test_an_engine_without_the_route_still_counts_as_up() -> None:
    fake = FakeOpenAI()
    response = await health_of(fake_engine(fake), upstream_health_path="/no-such-route")
    assert response.status_code == 200 and response.json()["upstream"]["status"] == 404


async def test_health_is_503_when_the_engine_cannot_be_reached() -> None:
    engine = OpenAIEngine("http://127.0.0.1:9")  # the discard port: nothing listens
    try:
        response = await health_of(engine)
    finally:
        await engine.aclose()
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "upstream_unavailable"
    assert body["upstream"]["status"] is None and body["upstream"]["error"]


async def test_a_silent_engine_is_down_after_the_checks_timeout() -> None:
    fake = FakeOpenAI()
    fake.health_hold = True
    check = UpstreamCheck(fake_engine(fake), timeout_s=0.2)
    async with asyncio.timeout(5):
        state = await check.state()
    assert not state.up and state.status is None
    assert 150 <= state.latency_ms < 5_000


async def test_without_a_health_path_the_engine_is_not_asked() -> None:
    fake = FakeOpenAI()
    response = await health_of(fake_engine(fake), upstream_health_path=None)
    assert response.status_code == 200 and "upstream" not in response.json()
    assert fake.health_checks == 0


async def test_a_closing_gate_reads_closed_before_upstream() -> None:
    fake = FakeOpenAI()
    fake.health_status = 503
    engine = fake_engine(fake)
    gate = LLMGate(engine, SLO)
    async with gateway_lifespan(gate):
        pass
    async with asgi_client(gateway_app(gate, engine=engine)) as client:
        response = await client.get("/health")
    assert response.status_code == 503 and response.json()["status"] == "closed"


async def test_readings_are_kept_for_max_age_and_shared_while_under_way() -> None:
    fake = FakeOpenAI()
    clock = Clock()
    check = UpstreamCheck(fake_engine(fake), max_age_s=1.0, clock=clock)
    first, second = await asyncio.gather(check.state(), check.state())
    assert first is second and fake.health_checks == 1
    clock.now_s += 0.5
    assert await check.state() is first and fake.health_checks == 1
    clock.now_s += 0.6
    third = await check.state()
    assert third is not first and fake.health_checks == 2
    assert third.as_json(clock()) | {"age_s": 0.0} == third.as_json(third.checked_at_s)


async def test_an_outage_is_logged_when_it_begins_and_ends_not_per_check() -> None:
    fake = FakeOpenAI()
    clock = Clock()
    check = UpstreamCheck(fake_engine(fake), max_age_s=0.0, clock=clock)
    with structlog.testing.capture_logs() as logs:
        await check.state()  # up: nothing to say
        fake.health_status = 503
        for _ in range(5):
            clock.now_s += 1.0
            await check.state()
        fake.health_status = 200
        clock.now_s += 1.0
        await check.state()
        await check.state()
    assert [entry["event"] for entry in logs] == ["gateway.upstream_down", "gateway.upstream_up"]
    assert logs[0]["failures"] == 1 and logs[0]["url"] == "http://fake/health"
    assert logs[1]["failures"] == 5 and logs[1]["down_for_s"] == 5.0
    assert fake.health_checks == 7


def test_bad_arguments_are_named() -> None:
    engine = OpenAIEngine("http://127.0.0.1:9")
    with pytest.raises(TypeError, match="engine"):
        UpstreamCheck("http://x")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="path"):
        UpstreamCheck(engine, path="health")
    with pytest.raises(ValueError, match="timeout_s"):
        UpstreamCheck(engine, timeout_s=0)
    with pytest.raises(ValueError, match="max_age_s"):
        UpstreamCheck(engine, max_age_s=-1)
    with pytest.raises(TypeError, match="upstream_health_path"):
        gateway_app(LLMGate(engine, SLO), engine=engine, upstream_health_path=3)  # type: ignore[arg-type]

"""The gateway mounted in a FastAPI service, wired as docs/llm.md shows: the service's lifespan
starts and closes the gate, the mounted app serves under its prefix."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
from fastapi import FastAPI

from adaptive_batcher.gateway import (
    LLMGate,
    OpenAIEngine,
    PrometheusEngineTelemetry,
    gateway_app,
    gateway_lifespan,
)
from adaptive_batcher.gateway.readings import GATE_METRICS
from adaptive_batcher.llm import token_slo_preset
from tests.gateway.fake_openai import FakeOpenAI
from tests.gateway.fakes import eventually
from tests.gateway.servers import serving

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "llm.md"
BOUND_S = 20.0


def service(upstream: str) -> tuple[FastAPI, LLMGate, OpenAIEngine]:
    engine = OpenAIEngine(upstream)
    gate = LLMGate(
        engine,
        token_slo_preset("chat"),
        telemetry=PrometheusEngineTelemetry(f"{upstream}/metrics", interval_s=0.05),
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with gateway_lifespan(gate, drain_timeout_s=30):
            yield
        await engine.aclose()

    app = FastAPI(lifespan=lifespan)
    app.mount("/llm", gateway_app(gate, engine=engine))
    return app, gate, engine


async def test_a_mounted_gateway_serves_under_its_prefix_within_the_service_lifespan() -> None:
    fake = FakeOpenAI()
    async with serving(fake) as upstream:
        app, gate, _engine = service(upstream)
        transport = httpx.ASGITransport(app=app)
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=transport, base_url="http://service") as client,
        ):
            body = {"prompt": "hello", "max_tokens": 3, "stream": True}
            answer = await client.post("/llm/v1/completions", json=body)
            health = await client.get("/llm/health")
            models = await client.get("/llm/v1/models")
            await eventually(lambda: gate.stats().engine is not None, BOUND_S)  # its /metrics
            assert not gate.stats().closed
        assert gate.stats().closed  # the service's shutdown closed the gate
    assert answer.status_code == 200 and answer.content.endswith(b"data: [DONE]\n\n")
    assert health.status_code == 200 and health.json()["gate"]["counts"]["completed"] == 1
    assert models.status_code == 200
    assert [b["prompt"] for b in fake.bodies] == ["hello"]


def test_the_guide_lists_every_gate_metric() -> None:
    listed = set(re.findall(r"`(adaptive_batcher_llm_[a-z_]+)`", GUIDE.read_text()))
    assert listed == {metric.name for metric in GATE_METRICS}

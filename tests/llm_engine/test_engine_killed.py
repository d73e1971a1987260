"""vLLM killed mid-run behind the gateway: its open streams fail with a clear error, new
requests get 502 at once while it is down, and the gateway serves again once it is back on the
same port, with nothing restarted on the gateway's side. Its own server: it is killed."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from adaptive_batcher.gateway.sse import SSESplitter, event_data
from tests.llm_engine.harness import completion, gateway
from tests.llm_engine.vllm_server import VLLMServer


@pytest.fixture
def engine(engine_python: str, tiny_model: Path, engine_log: Path) -> Iterator[VLLMServer]:
    server = VLLMServer(engine_python, tiny_model, engine_log)
    yield server
    asyncio.run(server.stop())


async def test_a_killed_engine_fails_its_streams_and_the_gateway_recovers(
    engine: VLLMServer,
) -> None:
    url = await engine.start()
    async with gateway(url) as (client, gate):
        async with client.stream(
            "POST", "/v1/completions", json=completion(900, stream=True)
        ) as response:
            assert response.status_code == 200
            received = b""
            body = response.aiter_raw()
            async for data in body:
                received += data
                if b'"text"' in received:
                    break
            await engine.kill()
            async for data in body:
                received += data
        last = SSESplitter().feed(received)[-1]
        error = json.loads(event_data(last) or "")["error"]
        assert error["code"] == "upstream_protocol", error
        assert error["message"]
        down = await client.post("/v1/completions", json=completion(4, stream=True))
        assert down.status_code == 502, down.text
        assert down.json()["error"]["code"] == "upstream_unavailable"
        await engine.start(engine.port)
        back = await client.post("/v1/completions", json=completion(4, stream=True))
        assert back.status_code == 200, back.text
        assert back.content.endswith(b"data: [DONE]\n\n")
        counts = gate.stats().counts
    assert counts.failed == 2 and counts.completed == 1
    assert counts.ended == counts.submitted == 3

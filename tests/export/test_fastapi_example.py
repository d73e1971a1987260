"""The README's FastAPI service, run as written: its /metrics endpoint, scraped after some
requests, shows the batcher's counts."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import httpx

from adaptive_batcher.export.prometheus import unregister_prometheus
from tests.export.helpers import parse, value

README = Path(__file__).resolve().parents[2] / "README.md"
_EXAMPLE = re.compile(
    r"^### In a FastAPI service\n\n```python\n(.*?)^```", re.MULTILINE | re.DOTALL
)


def readme_app() -> Any:
    """The ``app`` the README's FastAPI example defines."""
    found = _EXAMPLE.search(README.read_text(encoding="utf-8"))
    assert found is not None, "README.md has no FastAPI example"
    namespace: dict[str, Any] = {"__name__": "readme_fastapi_example"}
    exec(compile(found.group(1), "README.md (FastAPI example)", "exec"), namespace)
    return namespace["app"]


def test_the_metrics_endpoint_shows_the_batchers_counts() -> None:
    app = readme_app()
    requests = 40

    async def main() -> tuple[Any, str, list[int]]:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
                features = [0.5] * 256
                answers = await asyncio.gather(
                    *(client.post("/predict", json=features) for _ in range(requests))
                )
                metrics = await client.get("/metrics")
                assert metrics.status_code == 200
                assert metrics.headers["content-type"].startswith("text/plain")
                batcher = app.state.batcher
                stats = batcher.stats()
            unregister_prometheus(batcher)  # the default registry outlives this test
        return stats, metrics.text, [a.status_code for a in answers]

    stats, text, statuses = asyncio.run(main())
    counts = stats.counts
    assert counts.submitted == requests
    assert statuses.count(200) == counts.completed > 0  # the rest shed under load: 503
    assert set(statuses) <= {200, 503}
    samples = parse(text)
    for outcome in ("completed", "failed", "rejected", "expired", "cancelled"):
        got = value(samples, "adaptive_batcher_requests_total", batcher="linear", outcome=outcome)
        assert got == getattr(counts, outcome), outcome
    assert value(samples, "adaptive_batcher_requests_submitted_total", batcher="linear") == requests
    latency = value(samples, "adaptive_batcher_request_latency_seconds_count", batcher="linear")
    assert latency == counts.completed
    batches = value(samples, "adaptive_batcher_batch_size_count", batcher="linear")
    assert batches == counts.batches
    assert value(samples, "adaptive_batcher_batch_size_sum", batcher="linear") == counts.completed
    assert value(samples, "adaptive_batcher_batch_execution_seconds_count", batcher="linear") == (
        batches
    )
    assert value(samples, "adaptive_batcher_slo_latency_seconds", batcher="linear") == 0.05

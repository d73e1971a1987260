"""PrometheusEngineTelemetry: the metric names of vLLM, SGLang and llama.cpp, label sets
summed, missing metrics, and reads that fail without raising."""

from __future__ import annotations

import httpx
import pytest
import structlog

from adaptive_batcher.gateway.telemetry import PrometheusEngineTelemetry, parse_engine_metrics
from adaptive_batcher.gateway.types import EngineTelemetry
from adaptive_batcher.llm.signals import EngineMetrics
from tests.gateway.fake_openai import FakeOpenAI

VLLM = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny"} 3.0
vllm:num_requests_running{engine="1",model_name="tiny"} 2.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="tiny"} 4.0
vllm:num_requests_waiting{engine="1",model_name="tiny"} 1.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="tiny"} 0.75
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{engine="0",model_name="tiny"} 6.0
vllm:num_preemptions_created{engine="0",model_name="tiny"} 1.7e9
vllm:num_preemptions_total{engine="1",model_name="tiny"} 1.0
"""

OLD_VLLM = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 1.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 0.0
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="m"} 0.125
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{model_name="m"} 9.0
"""

SGLANG = """\
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m"} 12.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="m"} 30.0
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="m"} 0.28
"""

LLAMACPP = """\
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 2
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 5
# TYPE llamacpp:kv_cache_usage_ratio gauge
llamacpp:kv_cache_usage_ratio 0.0625
"""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (VLLM, EngineMetrics(running=5, waiting=5, kv_usage=0.75, preemptions=7)),
        (OLD_VLLM, EngineMetrics(running=1, waiting=0, kv_usage=0.125, preemptions=9)),
        (SGLANG, EngineMetrics(running=12, waiting=30, kv_usage=0.28, preemptions=0)),
        (LLAMACPP, EngineMetrics(running=2, waiting=5, kv_usage=0.0625, preemptions=0)),
    ],
    ids=["vllm", "vllm-old-names", "sglang", "llamacpp"],
)
def test_each_engines_names_are_read(text: str, expected: EngineMetrics) -> None:
    assert parse_engine_metrics(text) == expected


def test_missing_metrics() -> None:
    assert parse_engine_metrics("# TYPE other gauge\nother 1\n") is None
    assert parse_engine_metrics("") is None
    only_running = "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 3\n"
    assert parse_engine_metrics(only_running) == EngineMetrics(3, 0, 0.0, 0)


async def test_a_read_of_the_fake_engines_page() -> None:
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=FakeOpenAI()))
    telemetry = PrometheusEngineTelemetry("http://fake/metrics", client=client, interval_s=0.5)
    assert isinstance(telemetry, EngineTelemetry)
    assert telemetry.interval_s == 0.5
    assert await telemetry.read() == EngineMetrics(0, 0, 0.25, 2)
    await telemetry.aclose()
    assert not client.is_closed  # a client given stays open
    await client.aclose()


@pytest.mark.parametrize(
    "answer",
    [
        lambda request: httpx.Response(404, text="not found"),
        lambda request: httpx.Response(200, text="this is {not prometheus"),
        lambda request: (_ for _ in ()).throw(httpx.ConnectError("refused")),
    ],
    ids=["404", "garbage", "refused"],
)
async def test_a_failed_read_logs_and_returns_none(answer: object) -> None:
    client = httpx.AsyncClient(transport=httpx.MockTransport(answer))  # type: ignore[arg-type]
    telemetry = PrometheusEngineTelemetry("http://engine/metrics", client=client)
    with structlog.testing.capture_logs() as logs:
        assert await telemetry.read() is None
    assert [entry["event"] for entry in logs] == ["engine_telemetry.failed"]
    assert logs[0]["url"] == "http://engine/metrics"


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="metrics_url"):
        PrometheusEngineTelemetry("localhost/metrics")
    with pytest.raises(ValueError, match="interval_s"):
        PrometheusEngineTelemetry("http://x/metrics", interval_s=0)
    with pytest.raises(TypeError, match="client"):
        PrometheusEngineTelemetry("http://x/metrics", client="c")  # type: ignore[arg-type]

"""OutageLog: a run of failures is logged when it begins, at doubling spacing while it lasts, and
once when it ends; the telemetry source logs its failed reads through it."""

from __future__ import annotations

import httpx
import pytest
import structlog

from adaptive_batcher._log import get_logger
from adaptive_batcher.gateway.outage import OutageLog, loggable_url
from adaptive_batcher.gateway.telemetry import PrometheusEngineTelemetry
from tests.gateway.fake_openai import FakeOpenAI


class Clock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


def test_failures_every_second_for_an_hour_log_a_dozen_lines() -> None:
    clock = Clock()
    outage = OutageLog(get_logger("test"), "thing.down", "thing.up", clock=clock)
    with structlog.testing.capture_logs() as logs:
        for _ in range(3600):
            outage.failed(error="refused")
            clock.now_s += 1.0
        outage.succeeded()
    downs = [entry for entry in logs if entry["event"] == "thing.down"]
    # at 0, 10, 30, 70, 150, 310, then every 300 s (the spacing doubles up to 300 s)
    assert [entry["down_for_s"] for entry in downs[:9]] == [0, 10, 30, 70, 150, 310, 610, 910, 1210]
    assert len(downs) == 16 and downs[-1]["down_for_s"] == 3310
    assert [entry["failures"] for entry in downs[:3]] == [1, 11, 31]
    assert downs[0]["error"] == "refused" and downs[0]["log_level"] == "warning"
    assert logs[-1] == logs[-1] | {"event": "thing.up", "failures": 3600, "log_level": "warning"}
    assert outage.failures == 0


def test_a_new_outage_starts_its_spacing_again() -> None:
    clock = Clock()
    outage = OutageLog(get_logger("test"), "thing.down", "thing.up", clock=clock)
    with structlog.testing.capture_logs() as logs:
        for _ in range(2):
            for _ in range(12):
                outage.failed()
                clock.now_s += 1.0
            outage.succeeded()
            outage.succeeded()  # nothing more to say
    assert [entry["event"] for entry in logs] == ["thing.down", "thing.down", "thing.up"] * 2


def test_bad_spacings_are_named() -> None:
    with pytest.raises(ValueError, match="first_repeat_s"):
        OutageLog(get_logger("test"), "a", "b", first_repeat_s=0)
    with pytest.raises(ValueError, match="max_repeat_s"):
        OutageLog(get_logger("test"), "a", "b", first_repeat_s=10, max_repeat_s=5)


async def test_telemetry_logs_an_outage_once_and_its_end() -> None:
    up = True

    def answer(request: httpx.Request) -> httpx.Response:
        if not up:
            raise httpx.ConnectError("refused")
        return httpx.Response(200, text="vllm:num_requests_running 1\n")

    client = httpx.AsyncClient(transport=httpx.MockTransport(answer))
    telemetry = PrometheusEngineTelemetry("http://engine/metrics", client=client)
    with structlog.testing.capture_logs() as logs:
        assert await telemetry.read() is not None
        up = False
        for _ in range(5):
            assert await telemetry.read() is None
        up = True
        assert await telemetry.read() is not None
    events = [entry["event"] for entry in logs]
    assert events == ["engine_telemetry.failed", "engine_telemetry.recovered"]
    assert [entry["log_level"] for entry in logs] == ["warning", "warning"]  # both at the default
    assert logs[1]["failures"] == 5
    await client.aclose()


async def test_telemetry_of_the_fake_engine_logs_nothing_while_it_works() -> None:
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=FakeOpenAI()))
    telemetry = PrometheusEngineTelemetry("http://fake/metrics", client=client)
    with structlog.testing.capture_logs() as logs:
        for _ in range(3):
            assert await telemetry.read() is not None
    assert logs == []
    await client.aclose()


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://user:pw@127.0.0.1:8000/metrics", "http://127.0.0.1:8000/metrics"),
        ("https://token@engine.local/health", "https://engine.local/health"),
        ("http://u:p@[::1]:9/x", "http://[::1]:9/x"),
        ("http://127.0.0.1:8000/metrics", "http://127.0.0.1:8000/metrics"),
    ],
)
def test_logged_urls_carry_no_credentials(url: str, shown: str) -> None:
    assert loggable_url(url) == shown


async def test_telemetry_logs_its_url_without_credentials() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused")

    client = httpx.AsyncClient(transport=httpx.MockTransport(refuse))
    telemetry = PrometheusEngineTelemetry("http://user:secret@engine/metrics", client=client)
    with structlog.testing.capture_logs() as logs:
        assert await telemetry.read() is None
    assert logs[0]["url"] == "http://engine/metrics" and "secret" not in str(logs)
    await client.aclose()

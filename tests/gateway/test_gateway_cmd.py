"""``adaptive-batcher gateway``: its arguments, a real run in a child process in front of the
fake engine (stopped by SIGTERM to its PID), and the extra it needs."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from adaptive_batcher.cli.gateway_cmd import gateway_controller, slo_of
from adaptive_batcher.cli.main import build_parser, main
from adaptive_batcher.llm import ModelLimit, TokenController, TokenSLO
from tests.gateway.fake_openai import FakeOpenAI
from tests.gateway.servers import ROOT, serving

BOUND_S = 60.0


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ([], "the following arguments are required: --upstream"),
        (["--upstream", "127.0.0.1:8000"], "--upstream must be an http:// or https:// URL"),
        (["--upstream", "http://h:99999"], "--upstream has a bad port"),
        (["--upstream", "http://h", "--ttft-ms", "0"], "--ttft-ms"),
        (["--upstream", "http://h", "--tpot-ms", "-5"], "--tpot-ms"),
        (["--upstream", "http://h", "--port", "70000"], "--port must be a port in [0, 65535]"),
        (["--upstream", "http://h", "--max-in-flight", "0"], "--max-in-flight"),
        (["--upstream", "http://h", "--max-queue", "-1"], "--max-queue"),
        (["--upstream", "http://h", "--fixed-limit", "0"], "--fixed-limit"),
        (["--upstream", "http://h", "--initial-limit", "0"], "--initial-limit"),
        (["--upstream", "http://h", "--metrics-url", "nope"], "--metrics-url"),
        (["--upstream", "http://h:8000/v1"], "--upstream is the server's root, without /v1"),
        (["--upstream", "http://h", "--metrics-interval-s", "0.001"], "--metrics-interval-s"),
        (["--upstream", "http://h", "--max-body-bytes", "0"], "--max-body-bytes must be >= 1"),
        (["--upstream", "http://h", "--percentile", "100"], "--percentile must be a number in"),
        (["--upstream", "http://h", "--slo-margin", "0"], "--slo-margin must be a number in"),
        (["--upstream", "http://h", "--slo-margin", "1.5"], "--slo-margin must be a number in"),
        (
            ["--upstream", "http://h", "--upstream-health-path", "health"],
            "--upstream-health-path must start with '/'",
        ),
    ],
)
def test_bad_arguments_are_clear_errors(
    arguments: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["gateway", *arguments])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_the_defaults() -> None:
    args = build_parser().parse_args(["gateway", "--upstream", "http://127.0.0.1:8000/"])
    assert args.upstream == "http://127.0.0.1:8000"
    assert (args.ttft_ms, args.tpot_ms, args.host, args.port) == (300.0, 50.0, "127.0.0.1", 9000)
    assert (args.max_in_flight, args.max_queue, args.max_body_bytes) == (256, None, 1 << 20)
    assert args.metrics_url is None and not args.no_engine_metrics
    assert args.upstream_health_path == "/health" and not args.no_upstream_health
    assert args.fixed_limit is None and args.initial_limit is None and args.loop == "auto"
    assert slo_of(args) == TokenSLO(ttft_ms=300, tpot_ms=50, percentile=99, margin=0.9)


def test_prefill_pacing_is_on_unless_turned_off_for_ours_and_a_fixed_limit() -> None:
    def controller(*flags: str) -> TokenController | None:
        args = build_parser().parse_args(["gateway", "--upstream", "http://h", *flags])
        assert args.no_prefill_pacing == ("--no-prefill-pacing" in flags)
        return gateway_controller(args, slo_of(args))

    assert controller() is None  # the gate's default: ours
    assert controller("--no-prefill-pacing") is None  # ours, told LLMGate(pace_prefill=False)
    fixed = controller("--fixed-limit", "16")
    assert fixed is not None and fixed.pace_prefill and fixed.limit == 16
    unpaced = controller("--fixed-limit", "16", "--no-prefill-pacing")
    assert unpaced is not None and not unpaced.pace_prefill


def test_the_slo_flags_reach_the_objective_and_the_controllers_aim() -> None:
    arguments = ["gateway", "--upstream", "http://h", "--ttft-ms", "200", "--tpot-ms", "40"]
    args = build_parser().parse_args([*arguments, "--percentile", "90", "--slo-margin", "0.95"])
    slo = slo_of(args)
    assert slo == TokenSLO(ttft_ms=200, tpot_ms=40, percentile=90, margin=0.95)
    assert ModelLimit(slo).aim == 0.95  # the law steers the TPOT percentile to the margin


def test_metrics_url_and_no_engine_metrics_exclude_each_other(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = [
        "gateway",
        "--upstream",
        "http://h",
        "--metrics-url",
        "http://h/m",
        "--no-engine-metrics",
    ]
    assert main(argv) == 2
    assert "exclude each other" in capsys.readouterr().err


def test_loop_uvloop_without_uvloop_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from adaptive_batcher.cli import gateway_cmd

    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop raises ImportError
    assert main(["gateway", "--upstream", "http://h", "--loop", "uvloop"]) == 2
    assert "--loop uvloop needs uvloop installed" in capsys.readouterr().err
    assert gateway_cmd._loop_factory("auto") is None  # auto falls back to asyncio's loop
    assert gateway_cmd._loop_factory("asyncio") is None


def test_a_fixed_limit_above_max_in_flight_is_a_clear_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["gateway", "--upstream", "http://h", "--fixed-limit", "300"]) == 2
    assert "--fixed-limit 300 is above --max-in-flight 256" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--initial-limit", "300"], "--initial-limit 300 is above --max-in-flight 256"),
        (["--initial-limit", "4", "--fixed-limit", "4"], "exclude each other"),
    ],
)
def test_an_initial_limit_that_cannot_apply_is_a_clear_error(
    arguments: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["gateway", "--upstream", "http://h", *arguments]) == 2
    assert message in capsys.readouterr().err


def test_a_busy_port_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["gateway", "--upstream", "http://h", "--port", str(port)]) == 2
    assert f"cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err


async def test_the_command_serves_and_stops_on_sigterm() -> None:
    fake = FakeOpenAI()
    async with serving(fake) as upstream:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "adaptive_batcher.cli.main",
            "gateway",
            "--upstream",
            upstream,
            "--port",
            "0",
            "--metrics-interval-s",
            "0.2",
            "--fixed-limit",
            "3",
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            assert process.stderr is not None
            async with asyncio.timeout(BOUND_S):
                line = (await process.stderr.readline()).decode()
            assert line.startswith("adaptive-batcher gateway: serving on http://127.0.0.1:"), line
            url = line.split()[-1]
            async with httpx.AsyncClient(base_url=url, timeout=BOUND_S) as client:
                answer = await client.post("/v1/completions", json={"prompt": "x", "stream": True})
                health = await client.get("/health")
                metrics = await client.get("/metrics")
            assert answer.status_code == 200 and answer.content.endswith(b"data: [DONE]\n\n")
            assert health.status_code == 200 and health.json()["upstream"]["up"] is True
            assert "process_cpu_seconds_total" in metrics.text
            assert 'adaptive_batcher_llm_in_flight_limit{gate="gateway"} 3.0' in metrics.text
            os.kill(process.pid, signal.SIGTERM)
            async with asyncio.timeout(BOUND_S):
                status = await process.wait()
            rest = (await process.stderr.read()).decode()
            assert status == 0, rest
            assert "Traceback" not in rest
        finally:
            if process.returncode is None:
                os.kill(process.pid, signal.SIGKILL)
                await process.wait()


async def test_the_command_starts_the_controller_at_the_initial_limit() -> None:
    fake = FakeOpenAI()
    async with serving(fake) as upstream:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "adaptive_batcher.cli.main",
            "gateway",
            "--upstream",
            upstream,
            "--port",
            "0",
            "--no-engine-metrics",
            "--initial-limit",
            "5",
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            assert process.stderr is not None
            async with asyncio.timeout(BOUND_S):
                line = (await process.stderr.readline()).decode()
            url = line.split()[-1]
            async with httpx.AsyncClient(base_url=url, timeout=BOUND_S) as client:
                metrics = await client.get("/metrics")
            assert 'adaptive_batcher_llm_in_flight_limit{gate="gateway"} 5.0' in metrics.text
        finally:
            os.kill(process.pid, signal.SIGTERM)
            async with asyncio.timeout(BOUND_S):
                await process.wait()


BLOCKER = """
import sys

class NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("httpx", "prometheus_client", "uvicorn"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NotInstalled())
"""


def test_without_the_gateway_extra_the_modules_name_it(tmp_path: Path) -> None:
    code = BLOCKER + textwrap.dedent(
        """
        for module in ("openai", "telemetry", "app"):
            try:
                __import__(f"adaptive_batcher.gateway.{module}")
            except ImportError as exc:
                print(exc)
        from adaptive_batcher.cli.main import main
        print(main(["gateway", "--upstream", "http://127.0.0.1:8000"]))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert result.returncode == 0, result.stderr
    install = 'pip install "adaptive-batcher[gateway]"'
    lines = result.stdout.splitlines()
    assert lines[:3] == [
        f"adaptive_batcher.gateway.openai needs httpx (the gateway extra): {install}",
        f"adaptive_batcher.gateway.telemetry needs httpx (the gateway extra): {install}",
        # the app imports the adapter first
        f"adaptive_batcher.gateway.openai needs httpx (the gateway extra): {install}",
    ]
    assert lines[3] == "2"
    assert (
        result.stderr == f"adaptive-batcher gateway needs uvicorn (the gateway extra): {install}\n"
    )


@contextlib.asynccontextmanager
async def _gateway_command(
    upstream: str, *options: str
) -> AsyncIterator[tuple[asyncio.subprocess.Process, str]]:
    """``adaptive-batcher gateway`` in a child process in front of ``upstream``: the process
    and its URL once it serves; SIGKILLed and reaped if still running at the end."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "adaptive_batcher.cli.main", "gateway",
        "--upstream", upstream, "--port", "0", "--no-engine-metrics", *options,
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        assert process.stderr is not None
        async with asyncio.timeout(BOUND_S):
            url = (await process.stderr.readline()).decode().split()[-1]
        yield process, url
    finally:
        if process.returncode is None:
            os.kill(process.pid, signal.SIGKILL)
            await process.wait()


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
async def test_sigterm_drains_then_ends_the_rest_with_an_error_event(loop: str) -> None:
    """A stream that finishes within --drain-timeout-s ends with [DONE]; one still running then
    gets the gateway's error event and a complete body (not a cut connection)."""
    fake = FakeOpenAI()
    async with (
        serving(fake) as upstream,
        _gateway_command(upstream, "--drain-timeout-s", "1.5", "--loop", loop) as (process, url),
    ):
        async with httpx.AsyncClient(base_url=url, timeout=BOUND_S) as client:
            short = asyncio.ensure_future(_read_stream(client, tokens=6))
            long = asyncio.ensure_future(_read_stream(client, tokens=200))
            await fake.wait_active(2)
            os.kill(process.pid, signal.SIGTERM)
            short_body, long_body = await asyncio.gather(short, long)
        assert short_body.endswith(b"data: [DONE]\n\n"), short_body[-200:]
        last = long_body.rstrip(b"\n").rsplit(b"\n\n", 1)[-1]
        assert last.startswith(b"data: {"), long_body[-300:]
        assert b'"code": "gateway_closed"' in last, last
        async with asyncio.timeout(BOUND_S):
            status = await process.wait()
        assert process.stderr is not None
        rest = (await process.stderr.read()).decode()
        assert status == 0, rest
        assert "Traceback" not in rest


async def _read_stream(client: httpx.AsyncClient, tokens: int) -> bytes:
    payload = {"prompt": "x", "stream": True, "fake_tokens": tokens, "fake_interval_ms": 100}
    async with client.stream("POST", "/v1/completions", json=payload) as response:
        assert response.status_code == 200
        return b"".join([part async for part in response.aiter_raw()])


async def test_a_second_ctrl_c_cuts_the_drain_short() -> None:
    fake = FakeOpenAI()
    async with (
        serving(fake) as upstream,
        _gateway_command(upstream, "--drain-timeout-s", "60") as (process, url),
    ):
        async with httpx.AsyncClient(base_url=url, timeout=BOUND_S) as client:
            long = asyncio.ensure_future(_read_stream(client, tokens=600))  # 60 s
            await fake.wait_active(1)
            os.kill(process.pid, signal.SIGINT)
            await asyncio.sleep(0.5)
            os.kill(process.pid, signal.SIGINT)
            async with asyncio.timeout(15):  # not the 60 s drain
                body = await long
                await process.wait()
        last = body.rstrip(b"\n").rsplit(b"\n\n", 1)[-1]
        assert b'"code": "gateway_closed"' in last, body[-300:]
        assert process.stderr is not None
        assert "Traceback" not in (await process.stderr.read()).decode()

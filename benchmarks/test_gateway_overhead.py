"""What the gateway adds to each streamed chunk: the fake engine in its own process paces tokens
and stamps each with the moment it sends it (``time.monotonic_ns()``, one clock for every
process on the machine); clients read the same streams straight from the engine and through
``adaptive-batcher gateway`` (its own process, default options, loose SLOs so nothing is
refused), in alternating rounds of ``STREAMS`` concurrent streams: each of ``STREAMS`` clients
reads streams back to back, their starts spread out. A chunk's latency is its
arrival at the client less its stamp; the gateway's overhead is the difference of the two
paths' latencies, round against round. Time to first token is compared the same way.

Run: ``python -m pytest benchmarks/test_gateway_overhead.py -s`` (about 80 s); the table
goes to ``benchmarks/results/gateway_overhead.md``. Issue 24's target: p50 overhead <= 1 ms
at 32 concurrent streams.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import statistics
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import httpx
import numpy as np

from adaptive_batcher.gateway.sse import SSESplitter, event_data
from benchmarks.conftest import report_lines
from tests.gateway.servers import ROOT, FakeProcess

STREAMS = 32
TOKENS = 50
INTERVAL_MS = 20.0  # 50 tokens/s a stream, 1,600 chunks/s in all
ROUNDS = 6  # per path, alternating
ROUND_S = 4.0  # each client's streams, back to back
START_BOUND_S = 60.0
ROUND_BOUND_S = 60.0
TARGET_P50_MS = 1.0


@dataclass
class Round:
    """One round's readings on one path, milliseconds."""

    chunk_ms: list[float] = field(default_factory=list)
    ttft_ms: list[float] = field(default_factory=list)
    failures: int = 0


def payload() -> dict[str, object]:
    return {
        "model": "fake",
        "prompt": "x",
        "max_tokens": TOKENS,
        "stream": True,
        "fake_tokens": TOKENS,
        "fake_interval_ms": INTERVAL_MS,
        "fake_stamp": True,
    }


async def one_stream(client: httpx.AsyncClient, into: Round) -> None:
    """One stream read to its end; each token's latency from its stamp, and its TTFT less the
    engine's pacing before the first token."""
    sent_ns = time.monotonic_ns()
    first = True
    async with client.stream("POST", "/v1/completions", json=payload()) as response:
        if response.status_code != 200:
            await response.aread()
            into.failures += 1
            return
        splitter = SSESplitter()
        async for data in response.aiter_raw():
            arrived_ns = time.monotonic_ns()
            for event in splitter.feed(data):
                text = event_data(event)
                if text == "[DONE]":
                    continue
                choices = json.loads(text).get("choices") or []
                if not choices or not choices[0].get("text", "").isdigit():
                    continue
                into.chunk_ms.append((arrived_ns - int(choices[0]["text"])) / 1e6)
                if first:
                    into.ttft_ms.append((arrived_ns - sent_ns) / 1e6 - INTERVAL_MS)
                    first = False
    if first:
        into.failures += 1


async def one_round(url: str) -> Round:
    """``STREAMS`` clients, each reading streams back to back for ``ROUND_S`` seconds; their
    starts are spread over one stream's length, so that streams begin and end at a steady
    rate rather than all at once."""
    readings = Round()
    limits = httpx.Limits(max_connections=STREAMS, max_keepalive_connections=STREAMS)
    stream_s = TOKENS * INTERVAL_MS / 1e3
    loop = asyncio.get_running_loop()
    end_s = loop.time() + ROUND_S

    async def client_loop(client: httpx.AsyncClient, index: int) -> None:
        await asyncio.sleep(index * stream_s / STREAMS)
        while loop.time() < end_s:
            await one_stream(client, readings)

    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=ROUND_BOUND_S) as client:
        async with asyncio.timeout(ROUND_BOUND_S):
            await asyncio.gather(*(client_loop(client, i) for i in range(STREAMS)))
    return readings


@contextlib.asynccontextmanager
async def gateway_process(upstream: str) -> AsyncIterator[str]:
    """``adaptive-batcher gateway`` in front of ``upstream``, stopped by SIGTERM (then SIGKILL)."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "adaptive_batcher.cli.main",
        "gateway",
        "--upstream",
        upstream,
        "--port",
        "0",
        "--ttft-ms",
        "60000",
        "--tpot-ms",
        "60000",
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stderr is not None
        async with asyncio.timeout(START_BOUND_S):
            line = (await process.stderr.readline()).decode()
        assert line.startswith("adaptive-batcher gateway: serving on "), line
        yield line.split()[-1]
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
            try:
                async with asyncio.timeout(20):
                    await process.wait()
            except TimeoutError:
                process.kill()
                await process.wait()


def quantile(values: list[float], q: float) -> float:
    return float(np.quantile(values, q)) if values else float("nan")


async def test_gateway_overhead_per_chunk() -> None:
    engine = FakeProcess()
    upstream = await engine.start()
    try:
        async with gateway_process(upstream) as gateway:
            await one_round(gateway)  # warm both paths: connections, imports, the gate's fits
            await one_round(upstream)
            load_before = os.getloadavg()
            direct: list[Round] = []
            through: list[Round] = []
            for i in range(ROUNDS):
                for path in (upstream, gateway) if i % 2 == 0 else (gateway, upstream):
                    readings = await one_round(path)
                    (direct if path == upstream else through).append(readings)
            load_after = os.getloadavg()
    finally:
        await engine.kill()

    assert sum(r.failures for r in direct + through) == 0, "every stream must be answered"
    assert all(len(r.chunk_ms) == len(r.ttft_ms) * TOKENS for r in direct + through)
    rows = []
    overhead_p50 = []
    for d, g in zip(direct, through, strict=True):
        overhead_p50.append(quantile(g.chunk_ms, 0.5) - quantile(d.chunk_ms, 0.5))
        rows.append(
            f"| {len(rows) + 1}"
            f" | {quantile(d.chunk_ms, 0.5):.2f} / {quantile(d.chunk_ms, 0.99):.2f}"
            f" | {quantile(g.chunk_ms, 0.5):.2f} / {quantile(g.chunk_ms, 0.99):.2f}"
            f" | {overhead_p50[-1]:+.2f}"
            f" | {quantile(d.ttft_ms, 0.5):.2f} | {quantile(g.ttft_ms, 0.5):.2f} |"
        )
    all_direct = [x for r in direct for x in r.chunk_ms]
    all_through = [x for r in through for x in r.chunk_ms]
    ttft_direct = [x for r in direct for x in r.ttft_ms]
    ttft_through = [x for r in through for x in r.ttft_ms]
    median_overhead = statistics.median(overhead_p50)
    verdict = "pass" if median_overhead <= TARGET_P50_MS else "MISS"
    report_lines(
        "gateway_overhead",
        [
            f"## Gateway overhead per streamed chunk ({STREAMS} concurrent streams, "
            f"{TOKENS} tokens at {INTERVAL_MS:g} ms each, {ROUNDS} rounds of {ROUND_S:g} s "
            "a path)",
            "",
            f"Load average before {load_before[0]:.2f}, after {load_after[0]:.2f}.",
            "",
            "| round | direct chunk p50 / p99 ms | gateway chunk p50 / p99 ms "
            "| overhead p50 ms | direct TTFT p50 ms | gateway TTFT p50 ms |",
            "|---|---|---|---|---|---|",
            *rows,
            "",
            f"All rounds: chunk p50 {quantile(all_direct, 0.5):.2f} ms direct, "
            f"{quantile(all_through, 0.5):.2f} ms through the gateway; p99 "
            f"{quantile(all_direct, 0.99):.2f} / {quantile(all_through, 0.99):.2f} ms; "
            f"TTFT p50 {quantile(ttft_direct, 0.5):.2f} / {quantile(ttft_through, 0.5):.2f} ms "
            f"(less the engine's {INTERVAL_MS:g} ms before the first token).",
            f"Median over rounds of the p50 overhead: {median_overhead:+.2f} ms "
            f"(target <= {TARGET_P50_MS:g} ms): {verdict}.",
        ],
    )

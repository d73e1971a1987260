"""What the gateway adds to each streamed chunk: the fake engine in its own process paces tokens
and stamps each with the moment it sends it (``time.monotonic_ns()``, one clock for every
process on the machine); clients read the same streams straight from the engine and through
``adaptive-batcher gateway`` (its own process, default options, loose SLOs so nothing is
refused) on uvloop and on asyncio's own loop (``--loop``), in rotating rounds of ``STREAMS``
concurrent streams: each of ``STREAMS`` clients
reads streams back to back, their starts spread out. A chunk's latency is its
arrival at the client less its stamp; the gateway's overhead is the difference of the two
paths' latencies, round against round. Time to first token is compared the same way.

Run: ``python -m pytest benchmarks/test_gateway_overhead.py -s`` (about 2 minutes); the table
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
                if text is None or text == "[DONE]":
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
async def gateway_process(upstream: str, loop: str) -> AsyncIterator[str]:
    """``adaptive-batcher gateway --loop <loop>`` in front of ``upstream``, stopped by SIGTERM
    (then SIGKILL)."""
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
        "--loop",
        loop,
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
    rounds: dict[str, list[Round]] = {"direct": [], "uvloop": [], "asyncio": []}
    try:
        async with (
            gateway_process(upstream, "uvloop") as fast,
            gateway_process(upstream, "asyncio") as plain,
        ):
            urls = {"direct": upstream, "uvloop": fast, "asyncio": plain}
            for url in urls.values():
                await one_round(url)  # warm every path: connections, imports, the gate's fits
            load_before = os.getloadavg()
            order = list(urls)
            for i in range(ROUNDS):
                for name in order[i % 3 :] + order[: i % 3]:  # rotated: no path always first
                    rounds[name].append(await one_round(urls[name]))
            load_after = os.getloadavg()
    finally:
        await engine.kill()

    every = [r for paths in rounds.values() for r in paths]
    assert sum(r.failures for r in every) == 0, "every stream must be answered"
    assert all(len(r.chunk_ms) == len(r.ttft_ms) * TOKENS for r in every)
    rows = []
    overhead: dict[str, list[float]] = {"uvloop": [], "asyncio": []}
    for i, d in enumerate(rounds["direct"]):
        cells = [f"{quantile(d.chunk_ms, 0.5):.2f} / {quantile(d.chunk_ms, 0.99):.2f}"]
        for name in ("uvloop", "asyncio"):
            g = rounds[name][i]
            overhead[name].append(quantile(g.chunk_ms, 0.5) - quantile(d.chunk_ms, 0.5))
            cells.append(
                f"{quantile(g.chunk_ms, 0.5):.2f} / {quantile(g.chunk_ms, 0.99):.2f} "
                f"({overhead[name][-1]:+.2f})"
            )
        ttft = " / ".join(f"{quantile(rounds[n][i].ttft_ms, 0.5):.2f}" for n in rounds)
        rows.append(f"| {i + 1} | {' | '.join(cells)} | {ttft} |")

    def chunks(name: str) -> list[float]:
        return [x for r in rounds[name] for x in r.chunk_ms]

    def ttfts(name: str) -> list[float]:
        return [x for r in rounds[name] for x in r.ttft_ms]

    summary = []
    for name in ("uvloop", "asyncio"):
        median = statistics.median(overhead[name])
        verdict = "pass" if median <= TARGET_P50_MS else "MISS"
        summary.append(
            f"- gateway on {name}: chunk p50 {quantile(chunks(name), 0.5):.2f} ms, p99 "
            f"{quantile(chunks(name), 0.99):.2f} ms; TTFT p50 {quantile(ttfts(name), 0.5):.2f} "
            f"ms; median over rounds of the p50 overhead {median:+.2f} ms (target <= "
            f"{TARGET_P50_MS:g} ms): {verdict}."
        )
    report_lines(
        "gateway_overhead",
        [
            f"## Gateway overhead per streamed chunk ({STREAMS} concurrent streams, "
            f"{TOKENS} tokens at {INTERVAL_MS:g} ms each, {ROUNDS} rounds of {ROUND_S:g} s "
            "a path, the three paths rotated)",
            "",
            f"Load average before {load_before[0]:.2f}, after {load_after[0]:.2f}.",
            "",
            "| round | direct chunk p50 / p99 ms | gateway (uvloop) p50 / p99 ms (overhead) "
            "| gateway (asyncio) p50 / p99 ms (overhead) | TTFT p50 ms direct / uvloop / "
            "asyncio |",
            "|---|---|---|---|---|",
            *rows,
            "",
            f"- direct: chunk p50 {quantile(chunks('direct'), 0.5):.2f} ms, p99 "
            f"{quantile(chunks('direct'), 0.99):.2f} ms; TTFT p50 "
            f"{quantile(ttfts('direct'), 0.5):.2f} ms (TTFT less the engine's "
            f"{INTERVAL_MS:g} ms before the first token).",
            *summary,
        ],
    )

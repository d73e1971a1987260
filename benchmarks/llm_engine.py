"""Open-loop load on an OpenAI-compatible completions endpoint, for the real-engine benchmark
(benchmarks/test_llm_engine.py).

Arrivals are Poisson; each is one streamed completion, timed from its *scheduled* arrival, so a
client that falls behind counts against the contender. A request still open ``drain_s`` after
the load ends is cancelled (its connection closed, which aborts it in vLLM) and counted as
unanswered. A request is good when it was answered with every token it asked for, its TTFT and
its TPOT within the SLO (DistServe's goodput); a refusal is a miss.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np

from adaptive_batcher.gateway.sse import SSESplitter
from adaptive_batcher.llm.slo import TokenSLO
from tests.llm_engine.harness import token_events

UNANSWERED = 0  # the status of a request cancelled at the end of its phase


@dataclass(frozen=True)
class Sample:
    """One request: its HTTP status (``UNANSWERED``: cancelled), TTFT from its scheduled
    arrival and mean token gap after the first (seconds; nan where undefined), tokens."""

    status: int
    ttft_s: float = math.nan
    tpot_s: float = math.nan
    tokens: int = 0


@dataclass(frozen=True)
class Summary:
    """A phase's figures: goodput (good requests per second of load), SLO attainment over every
    request sent, the answered requests' TTFT/TPOT p50 and p99 (ms), refused % (429/503),
    expired (504: its first token could no longer come in time), unanswered, and errors (any
    other status, or a transport error)."""

    sent: int
    good: int
    goodput_rps: float
    attainment: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    tpot_p50_ms: float
    tpot_p99_ms: float
    refused_pct: float
    expired: int
    unanswered: int
    errors: int
    error_statuses: tuple[int, ...]  # the errors' statuses (-1: a transport error), sorted


async def stream_one(
    client: httpx.AsyncClient, payload: dict[str, Any], scheduled_s: float
) -> Sample:
    """POST ``payload`` to ``/v1/completions`` and read its stream to the end."""
    loop = asyncio.get_running_loop()
    async with client.stream("POST", "/v1/completions", json=payload) as response:
        if response.status_code != 200:
            await response.aread()
            return Sample(response.status_code)
        splitter, tokens, first, last = SSESplitter(), 0, math.nan, math.nan
        async for data in response.aiter_raw():
            arrived = token_events(splitter, data)
            if arrived:
                now = loop.time()
                first = now if tokens == 0 else first
                last = now
                tokens += arrived
    tpot = (last - first) / (tokens - 1) if tokens > 1 else math.nan
    return Sample(200, first - scheduled_s, tpot, tokens)


async def open_loop(
    client: httpx.AsyncClient,
    payload: dict[str, Any],
    rate_rps: float,
    duration_s: float,
    *,
    seed: int,
    drain_s: float,
) -> list[Sample]:
    """Poisson arrivals at ``rate_rps`` for ``duration_s``; every request's sample."""
    loop = asyncio.get_running_loop()
    rng = random.Random(seed)
    start = loop.time()
    tasks: list[asyncio.Task[Sample]] = []
    at = start + rng.expovariate(rate_rps)
    while at < start + duration_s:
        await asyncio.sleep(max(0.0, at - loop.time()))
        tasks.append(asyncio.ensure_future(_guarded(stream_one(client, payload, at))))
        at += rng.expovariate(rate_rps)
    done, pending = await asyncio.wait(tasks, timeout=drain_s) if tasks else (set(), set())
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    return [task.result() if task in done else Sample(UNANSWERED) for task in tasks]


async def _guarded(request: Awaitable[Sample]) -> Sample:
    try:
        return await request
    except httpx.HTTPError:
        return Sample(-1)  # a transport error: counted as an error


async def closed_loop_rate(
    client: httpx.AsyncClient, payload: dict[str, Any], concurrency: int, duration_s: float
) -> float:
    """Completed requests per second with ``concurrency`` clients each sending back to back."""
    loop = asyncio.get_running_loop()
    end = loop.time() + duration_s
    completed = 0

    async def worker() -> None:
        nonlocal completed
        while loop.time() < end:
            sample = await stream_one(client, payload, loop.time())
            completed += sample.status == 200

    started = loop.time()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return completed / (loop.time() - started)


def summarize(samples: list[Sample], slo: TokenSLO, tokens: int, duration_s: float) -> Summary:
    """The phase's :class:`Summary` (``tokens``: what each request asked for)."""
    answered = [s for s in samples if s.status == 200]
    good = sum(
        1
        for s in answered
        if s.tokens == tokens and s.ttft_s * 1e3 <= slo.ttft_ms and s.tpot_s * 1e3 <= slo.tpot_ms
    )
    refused = sum(1 for s in samples if s.status in (429, 503))
    failed = sorted(s.status for s in samples if s.status not in (200, 429, 503, 504, UNANSWERED))
    return Summary(
        sent=len(samples),
        good=good,
        goodput_rps=good / duration_s,
        attainment=good / max(len(samples), 1),
        ttft_p50_ms=_quantile_ms([s.ttft_s for s in answered], 0.5),
        ttft_p99_ms=_quantile_ms([s.ttft_s for s in answered], 0.99),
        tpot_p50_ms=_quantile_ms([s.tpot_s for s in answered], 0.5),
        tpot_p99_ms=_quantile_ms([s.tpot_s for s in answered], 0.99),
        refused_pct=100.0 * refused / max(len(samples), 1),
        expired=sum(1 for s in samples if s.status == 504),
        unanswered=sum(1 for s in samples if s.status == UNANSWERED),
        errors=len(failed),
        error_statuses=tuple(failed),
    )


def _quantile_ms(values_s: list[float], q: float) -> float:
    finite = [v for v in values_s if not math.isnan(v)]
    return float(np.quantile(finite, q)) * 1e3 if finite else math.nan


async def poll_engine(
    read: Callable[[], Awaitable[dict[str, float]]], into: list[dict[str, float]]
) -> None:
    """Append the engine's Prometheus samples to ``into`` every 0.5 s until cancelled."""
    while True:
        with contextlib.suppress(httpx.HTTPError):
            into.append(await read())
        await asyncio.sleep(0.5)

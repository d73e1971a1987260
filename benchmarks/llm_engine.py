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
import os
import random
import signal
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from adaptive_batcher.gateway.sse import SSESplitter
from adaptive_batcher.llm.slo import TokenSLO
from tests.llm_engine.harness import token_events

UNANSWERED = 0  # the status of a request cancelled at the end of its phase
GATEWAY_START_S = 60.0
GATEWAY_STOP_S = 40.0  # its drain (30 s by default) and a margin


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

    def meets_tails(self, slo: TokenSLO) -> bool:
        """Whether the answered requests' TTFT p99 and TPOT p99 are within ``slo``'s targets
        (issue 24's first target; False with none answered)."""
        return self.ttft_p99_ms <= slo.ttft_ms and self.tpot_p99_ms <= slo.tpot_ms


def best_by_goodput(
    summaries: dict[str, Summary], slo: TokenSLO | None = None
) -> tuple[str, Summary] | None:
    """The contender with the highest goodput, among those whose answered requests meet
    ``slo``'s tail targets when it is given; None when none does."""
    eligible = [(name, s) for name, s in summaries.items() if slo is None or s.meets_tails(slo)]
    return max(eligible, key=lambda item: item[1].goodput_rps, default=None)


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


async def slo_knee(
    probe: Callable[[float], Awaitable[float]],
    high_rps: float,
    *,
    attainment: float = 0.9,
    steps: int = 5,
) -> float:
    """The highest rate, req/s, at which ``probe(rate)`` (an open-loop phase's SLO attainment)
    stays at or above ``attainment``: a bisection of ``(0, high_rps]`` in ``steps`` probes
    (the lower end of the last bracket; ``high_rps`` if it passes at once). The knee of issue
    23's replays, measured on the engine itself."""
    if await probe(high_rps) >= attainment:
        return high_rps
    low, high = 0.0, high_rps
    for _ in range(steps - 1):
        middle = (low + high) / 2.0
        if await probe(middle) >= attainment:
            low = middle
        else:
            high = middle
    return low if low > 0.0 else high / 2.0


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


class GatewayProcess:
    """``adaptive-batcher gateway`` in a child process, as it is deployed (its own
    interpreter, so its CPU is not the load generator's); its stderr goes to ``log``.

    :meth:`metrics` reads its Prometheus page: the gate's counts, limit and queue."""

    def __init__(self, arguments: list[str], log: Path) -> None:
        self.arguments = arguments
        self.log = log
        self.url = ""
        self._process: asyncio.subprocess.Process | None = None
        self._client: httpx.AsyncClient | None = None

    async def start(self) -> str:
        """Start it on a free port; its URL once it listens."""
        root = Path(__file__).parents[1]
        with self.log.open("wb") as log:
            self._process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "adaptive_batcher.cli.main", "gateway",
                *self.arguments, "--port", "0",
                cwd=root, env={**os.environ, "PYTHONPATH": str(root)}, stderr=log,
            )  # fmt: skip
        async with asyncio.timeout(GATEWAY_START_S):
            while not self.url:
                if self._process.returncode is not None:
                    raise RuntimeError(f"the gateway exited: {self.log.read_text()[-2000:]}")
                for line in self.log.read_text().splitlines():
                    if "serving on http://" in line:
                        self.url = line.split()[-1]
                await asyncio.sleep(0.05)
        self._client = httpx.AsyncClient(base_url=self.url, timeout=10.0, trust_env=False)
        return self.url

    async def metrics(self) -> dict[str, float]:
        """The gate's samples, ``{name: value}``, less the ``adaptive_batcher_llm_`` prefix; a
        labelled one as ``name:<label values>`` (``requests_total:completed``)."""
        assert self._client is not None
        text = (await self._client.get("/metrics")).text
        samples: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if not sample.name.startswith("adaptive_batcher_llm_"):
                    continue
                name = sample.name.removeprefix("adaptive_batcher_llm_")
                labels = ",".join(v for k, v in sample.labels.items() if k != "gate")
                samples[f"{name}:{labels}" if labels else name] = sample.value
        return samples

    async def stop(self) -> None:
        """SIGTERM (it drains), SIGKILL after a bound; reaped."""
        if self._client is not None:
            await self._client.aclose()
        process = self._process
        if process is None or process.returncode is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            async with asyncio.timeout(GATEWAY_STOP_S):
                await process.wait()
        except TimeoutError:
            process.kill()
            await process.wait()

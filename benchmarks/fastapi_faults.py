"""The README's FastAPI app, served by uvicorn in its own process on 127.0.0.1, under HTTP load,
with a stall of its event loop and a body over its limit.

The app is the README's example as written (its code block, executed), with benchmark routes
added: ``/bench/stats`` (window, cap), ``/bench/stall?seconds=`` (a blocking call in a handler:
the loop stands still) and ``/bench/lag`` (the longest the loop was late by since the last
read, from a task that sleeps 5 ms at a time). A static contender is the same app with the
batcher's ``slo`` and ``shed_late`` replaced by a fixed ``window_ms``. The load is ``CLIENTS``
closed-loop clients posting 256 features each, timed by the client.
"""

from __future__ import annotations

import asyncio
import math
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
CLIENTS = 16
SLO_MS = 50.0  # the README app's SLO
BODY_AT_S = 3.0
STALL_AT_S = 8.0
STALL_S = 20.0
AFTER_S = 12.0
BIG_BODY_BYTES = 20_000_000

_EXAMPLE = re.compile(
    r"^### In a FastAPI service\n\n```python\n(.*?)^```", re.MULTILINE | re.DOTALL
)
_ADAPTIVE = "        slo=SLO(latency_ms=50),\n        shed_late=True,\n"

BENCH_ROUTES = """

import asyncio as _bench_asyncio
import time as _bench_time

_bench_lag = {"max_s": 0.0, "task": None}


@app.get("/bench/stats")
def _bench_stats() -> dict:
    stats = app.state.batcher.stats()
    return {
        "window_ms": stats.window_ms,
        "cap": stats.max_batch_size,
        "reasons": dict(stats.decision_reasons),
    }


@app.post("/bench/stall")
async def _bench_stall(seconds: float) -> dict:
    _bench_time.sleep(seconds)  # a blocking call in a handler: the event loop stands still
    return {"stalled_s": seconds}


async def _bench_watch_lag() -> None:
    loop = _bench_asyncio.get_running_loop()
    while True:
        before = loop.time()
        await _bench_asyncio.sleep(0.005)
        _bench_lag["max_s"] = max(_bench_lag["max_s"], loop.time() - before - 0.005)


@app.post("/bench/lag")
async def _bench_read_lag() -> dict:
    if _bench_lag["task"] is None:
        _bench_lag["task"] = _bench_asyncio.get_running_loop().create_task(_bench_watch_lag())
    worst, _bench_lag["max_s"] = _bench_lag["max_s"], 0.0
    return {"max_lag_ms": worst * 1e3}
"""


def app_source(window_ms: float | None) -> str:
    """The README's example with the benchmark routes; ``window_ms`` set: a static batcher."""
    found = _EXAMPLE.search(README.read_text(encoding="utf-8"))
    assert found is not None, "README.md has no FastAPI example"
    code = found.group(1)
    if window_ms is not None:
        assert _ADAPTIVE in code, "the README's batcher settings changed: update fastapi_faults"
        code = code.replace(_ADAPTIVE, f"        window_ms={window_ms!r},\n")
    return code + BENCH_ROUTES


@dataclass
class HttpRun:
    """One run against one app: what the clients saw, and the app's window and cap."""

    contender: str
    round: int
    answers: list[tuple[float, float, int]] = field(default_factory=list)  # (sent, s, status)
    timeline: list[tuple[float, float, int]] = field(default_factory=list)  # (t, window, cap)
    reasons: dict[str, int] = field(default_factory=dict)  # the controller's, at the end
    stall_end_s: float = math.nan
    big_body_status: int = 0
    big_body_s: float = math.nan
    max_lag_ms: float = math.nan
    load_average: float = math.nan

    @property
    def within_slo(self) -> int:
        return sum(status == 200 and s * 1e3 <= SLO_MS for _, s, status in self.answers)

    @property
    def ok(self) -> int:
        return sum(status == 200 for _, _, status in self.answers)

    def cap_recovery_s(self) -> float:
        """Seconds after the stall ends until the cap is back at its pre-stall median (0: it
        never fell; NaN: not within the run)."""
        before = [cap for t, _, cap in self.timeline if 2.0 <= t < STALL_AT_S]
        if not before or math.isnan(self.stall_end_s):
            return math.nan
        usual = sorted(before)[len(before) // 2]
        after = [(t, cap) for t, _, cap in self.timeline if t >= self.stall_end_s]
        low = [t for t, cap in after if cap < usual]
        if not low:
            return 0.0
        back = [t for t, cap in after if t > low[-1] and cap >= usual]
        return back[0] - self.stall_end_s if back else math.nan


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Server:
    """uvicorn serving ``source`` (as module ``bench_app``) in its own process."""

    def __init__(self, source: str) -> None:
        self.folder = tempfile.TemporaryDirectory()
        Path(self.folder.name, "bench_app.py").write_text(source, encoding="utf-8")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([self.folder.name, str(REPO)]))
        self.process = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "bench_app:app", "--host", "127.0.0.1",
             "--port", str(self.port), "--log-level", "warning"],
            cwd=self.folder.name, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"uvicorn exited: {self.process.stderr.read()!r}")  # type: ignore[union-attr]
            try:
                if httpx.post(f"{self.url}/bench/lag", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.2)
        raise TimeoutError("uvicorn did not answer within the timeout")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=40)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self.process.stderr is not None:
            self.process.stderr.close()
        self.folder.cleanup()


async def _load(url: str, run: HttpRun, origin: float, stop_at: float) -> None:
    features = [0.5] * 256
    async with httpx.AsyncClient(base_url=url, timeout=120.0) as client:

        async def worker() -> None:
            while time.monotonic() - origin < stop_at:
                sent = time.monotonic()
                try:
                    answer = await client.post("/predict", json=features)
                    status = answer.status_code
                except httpx.HTTPError:
                    status = 0
                run.answers.append((sent - origin, time.monotonic() - sent, status))

        async def stats() -> None:
            while time.monotonic() - origin < stop_at:
                got = (await client.get("/bench/stats")).json()
                run.timeline.append((time.monotonic() - origin, got["window_ms"], got["cap"]))
                run.reasons = got["reasons"]
                await asyncio.sleep(0.25)

        async def faults() -> None:
            await client.post("/bench/lag")
            await asyncio.sleep(BODY_AT_S - (time.monotonic() - origin))
            await client.post("/bench/lag")  # reset the worst lag
            body = b"[" + b",".join([b"0.123456789"] * (BIG_BODY_BYTES // 12)) + b"]"
            sent = time.monotonic()
            answer = await client.post(
                "/predict", content=body, headers={"content-type": "application/json"}
            )
            run.big_body_status, run.big_body_s = answer.status_code, time.monotonic() - sent
            await asyncio.sleep(0.5)
            run.max_lag_ms = (await client.post("/bench/lag")).json()["max_lag_ms"]
            await asyncio.sleep(STALL_AT_S - (time.monotonic() - origin))
            await client.post("/bench/stall", params={"seconds": STALL_S})
            run.stall_end_s = time.monotonic() - origin

        await asyncio.gather(*(worker() for _ in range(CLIENTS)), stats(), faults())


def http_run(contender: str, window_ms: float | None, round_: int) -> HttpRun:
    """Start the app, load it for the whole scenario, stop it; returns what was measured."""
    from benchmarks.realtime_faults import load_average

    server = Server(app_source(window_ms))
    try:
        server.wait_ready()
        run = HttpRun(contender, round_)
        origin = time.monotonic()
        asyncio.run(_load(server.url, run, origin, STALL_AT_S + STALL_S + AFTER_S))
        run.load_average = load_average()
        return run
    finally:
        server.stop()

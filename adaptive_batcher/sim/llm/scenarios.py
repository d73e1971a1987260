"""The LLM replay benchmark's building blocks: devices, contenders, workloads and searches.

* :data:`DEVICES`: the H200 roofline preset for Llama-3.1-8B; the closed-form fit of
  splitwise-sim's Llama-2-70B on four H100s; DistServe's measured OPT-13B on an A100 (each
  with vLLM's default caps for that GPU).
* :func:`contender`: ``vllm_defaults`` (no gate, the engine's caps, an unbounded engine
  queue), ``trtllm_tuner`` (TensorRT-LLM's dynamic batch tuner sets the engine's caps, no
  gate), ``aimd_gate`` (Netflix's AIMD limit in our gate), ``static_<N>`` (a fixed limit in our
  gate), both without prefill pacing (a hand-set limit and Netflix's limiter pace nothing),
  ``aimd_gate_paced`` (the AIMD limit with our prefill pacing) and ``ours``
  (:class:`~adaptive_batcher.llm.laws.ModelLimit`, with prefill pacing).
* :func:`workload`: ``poisson``, ``azure_conv``, ``azure_code`` at a mean rate; ``steps`` and
  ``bursts`` around a reference rate; ``long_output`` (KV-cache pressure).
* :func:`replay`, :func:`static_grid`, :func:`best_static`, :func:`best_static_per_phase`,
  :func:`knee`, :func:`capacity`.

Every replay is deterministic: the same names and rates give the same result.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache

import numpy as np

from adaptive_batcher.llm.controller import TokenController
from adaptive_batcher.llm.laws import AIMDLimit, ModelLimit, StaticLimit
from adaptive_batcher.llm.slo import TokenSLO, token_slo_preset
from adaptive_batcher.sim.llm.engine import EngineConfig
from adaptive_batcher.sim.llm.result import LLMSimResult
from adaptive_batcher.sim.llm.simulator import LLMContender, LLMSimulator
from adaptive_batcher.sim.llm.step_time import (
    A100_80GB,
    FITS,
    H100,
    LLAMA_2_70B,
    OPT_13B,
    Deployment,
    h200_llama_8b,
    kv_capacity_tokens,
)
from adaptive_batcher.sim.llm.workloads import (
    IndependentLengths,
    TokenArrivals,
    TraceLengths,
    load_token_trace,
    token_workload,
)
from adaptive_batcher.sim.workloads import LognormalSizes, MMPPBursts, Poisson, Steps

__all__ = [
    "CONTENDERS",
    "DEVICES",
    "STATIC_GRID",
    "WORKLOADS",
    "Device",
    "best_static",
    "best_static_per_phase",
    "capacity",
    "contender",
    "knee",
    "replay",
    "static_grid",
    "workload",
]

CHAT: TokenSLO = token_slo_preset("chat")

STATIC_GRID: tuple[int, ...] = (4, 8, 16, 32, 48, 64, 96, 128, 160, 192, 256, 384, 512, 1024)
"""The in-flight limits of the hindsight static gate."""

CONTENDERS: tuple[str, ...] = ("vllm_defaults", "trtllm_tuner", "aimd_gate", "ours")
"""The named contenders (``static_<N>`` besides)."""

WORKLOADS: tuple[str, ...] = (
    "poisson",
    "azure_conv",
    "azure_code",
    "steps",
    "bursts",
    "long_output",
)

NOISE_SIGMA = 0.05
"""Lognormal jitter of every step time in the benchmark's replays."""


@dataclass(frozen=True)
class Device:
    """A deployment and the engine caps vLLM defaults to on it."""

    name: str
    deployment: Deployment
    engine: EngineConfig


def _h200() -> Device:
    deployment = h200_llama_8b()
    # vLLM's API-server defaults on a >= 70 GiB GPU other than an A100: 1024 sequences, 8192
    engine = EngineConfig.for_deployment(deployment, max_num_seqs=1024, max_num_batched_tokens=8192)
    return Device("h200_llama8b", deployment, engine)


def _a100_opt13b() -> Device:
    tokens = kv_capacity_tokens(OPT_13B, A100_80GB)
    deployment = Deployment(
        "OPT-13B on A100 (DistServe's vLLM profile)", FITS["distserve_opt13b_a100_vllm"], tokens
    )
    # vLLM's API-server defaults on an A100: 256 sequences, 2048 tokens a step
    engine = EngineConfig.for_deployment(deployment, max_num_seqs=256, max_num_batched_tokens=2048)
    return Device("a100_opt13b_fit", deployment, engine)


def _h100x4_llama70b() -> Device:
    tokens = kv_capacity_tokens(LLAMA_2_70B, H100, gpus=4)
    deployment = Deployment(
        "Llama-2-70B on 4 x H100 (fitted to splitwise-sim)",
        FITS["splitwise_llama2_70b_h100_tp4"],
        tokens,
    )
    # vLLM's API-server defaults on a >= 70 GiB GPU other than an A100: 1024 and 8192
    engine = EngineConfig.for_deployment(deployment, max_num_seqs=1024, max_num_batched_tokens=8192)
    return Device("h100x4_llama70b_fit", deployment, engine)


DEVICES: dict[str, Callable[[], Device]] = {
    "h200_llama8b": _h200,
    "h100x4_llama70b_fit": _h100x4_llama70b,
    "a100_opt13b_fit": _a100_opt13b,
}


def contender(name: str, device: Device, slo: TokenSLO = CHAT) -> LLMContender:
    """The contender ``name`` (one of :data:`CONTENDERS`, or ``static_<N>``) on ``device``.

    Raises:
        ValueError: an unknown name.
    """
    engine = device.engine
    cap = engine.max_num_seqs
    if name == "vllm_defaults":
        return LLMContender(name, engine)
    if name == "trtllm_tuner":
        return LLMContender(name, engine, trtllm_tuner=True)
    if name in ("aimd_gate", "aimd_gate_paced"):
        paced = name == "aimd_gate_paced"
        return LLMContender(
            name,
            engine,
            lambda: TokenController(
                slo,
                AIMDLimit(20, 0.9, 1, cap),
                initial_limit=20,
                max_limit=cap,
                pace_prefill=paced,
            ),
            reads_engine_metrics=False,
        )
    if name == "ours":
        return LLMContender(
            name,
            engine,
            lambda: TokenController(slo, ModelLimit(slo, maximum=cap), max_limit=cap),
        )
    if name == "ours_client_only":
        return LLMContender(
            name,
            engine,
            lambda: TokenController(slo, ModelLimit(slo, maximum=cap), max_limit=cap),
            reads_engine_metrics=False,
        )
    if name.startswith("static_"):
        limit = int(name.removeprefix("static_"))
        return LLMContender(
            name,
            engine,
            lambda: TokenController(
                slo,
                StaticLimit(limit),
                initial_limit=limit,
                max_limit=max(limit, 1),
                pace_prefill=False,
            ),
            reads_engine_metrics=False,
        )
    raise ValueError(f"unknown contender {name!r}")


def _trace_dir() -> str | None:
    return os.environ.get("ADAPTIVE_BATCHER_TRACES")


@cache
def _trace(name: str) -> TokenArrivals:
    return load_token_trace(name, trace_dir=_trace_dir())


def _representative_start(trace: TokenArrivals, span: float) -> float:
    """The start (on a 60 s grid of trace time) of the ``span``-long window whose request
    count is closest to the trace's mean rate times ``span`` (the earliest on a tie)."""
    last = max(float(trace.duration_s) - span, 0.0)
    starts = np.arange(0.0, last + 1e-9, 60.0)
    counts = np.searchsorted(trace.times_s, starts + span) - np.searchsorted(trace.times_s, starts)
    expected = span * trace.rate_rps
    return float(starts[int(np.argmin(np.abs(counts - expected)))])


def _trace_window(name: str, rate_rps: float, duration_s: float) -> TokenArrivals:
    trace = _trace(name)
    span = duration_s * rate_rps / trace.rate_rps  # trace seconds that become duration_s
    start_s = _representative_start(trace, span)
    keep = (trace.times_s >= start_s) & (trace.times_s < start_s + span)
    window = TokenArrivals(
        trace.times_s[keep] - start_s,
        trace.prompt_tokens[keep],
        trace.output_tokens[keep],
        name,
        span,
    )
    return window.at_rate(rate_rps, f"{name}@{rate_rps:g}")


def workload(
    name: str, rate_rps: float, duration_s: float = 300.0, *, seed: int = 0
) -> TokenArrivals:
    """The workload ``name`` (one of :data:`WORKLOADS`) at the rate ``rate_rps``: the mean
    rate of ``poisson``, the traces and ``long_output``; the reference rate that the phases of
    ``steps`` and ``bursts`` are multiples of.

    * ``poisson``: Poisson arrivals, prompt and output lengths drawn in pairs from the Azure
      conversation trace.
    * ``azure_conv``, ``azure_code``: ``duration_s * rate / native rate`` seconds of the
      trace, time-compressed so that its mean rate is ``rate_rps`` (bursts and lulls kept);
      the window starts where its request count is closest to the trace's mean rate (on a
      60 s grid: the code trace opens with a long lull).
    * ``steps``: Poisson with the conversation lengths at 0.5, 1.5, 1, 2, 0.7 x ``rate_rps``,
      a fifth of the run each.
    * ``bursts``: a two-state MMPP, 0.6 x ``rate_rps`` with bursts at 2.5 x, mean burst 10 s
      every 40 s.
    * ``long_output``: Poisson, prompts lognormal (median 400, sigma 0.6), outputs lognormal
      (median 1200, sigma 0.4), both at most 4000 tokens: the KV cache fills first.

    Raises:
        ValueError: an unknown name; FileNotFoundError: the trace is missing (the traces
            folder is ``ADAPTIVE_BATCHER_TRACES`` or the default
            :data:`~adaptive_batcher.sim.traces.TRACE_DIR`).
    """
    rng = np.random.default_rng(seed)
    if name in ("azure_conv", "azure_code"):
        return _trace_window(f"azure_llm_2023_{name.removeprefix('azure_')}", rate_rps, duration_s)
    if name == "long_output":
        lengths = IndependentLengths(
            LognormalSizes(400, 0.6, 4000), LognormalSizes(1200, 0.4, 4000)
        )
        return token_workload(Poisson(rate_rps), lengths, duration_s, rng)
    conv = TraceLengths.of(_trace("azure_llm_2023_conv"))
    if name == "poisson":
        return token_workload(Poisson(rate_rps), conv, duration_s, rng)
    if name == "steps":
        factors = (0.5, 1.5, 1.0, 2.0, 0.7)
        arrivals = Steps(tuple(f * rate_rps for f in factors), duration_s / len(factors))
        return token_workload(arrivals, conv, duration_s, rng)
    if name == "bursts":
        bursts = MMPPBursts(0.6 * rate_rps, 2.5 * rate_rps, 10.0, 30.0)
        return token_workload(bursts, conv, duration_s, rng)
    raise ValueError(f"unknown workload {name!r}")


def replay(
    device: Device, name: str, arrivals: TokenArrivals, slo: TokenSLO = CHAT, *, seed: int = 0
) -> LLMSimResult:
    """One replay of contender ``name`` on ``arrivals`` (step jitter :data:`NOISE_SIGMA`)."""
    simulator = LLMSimulator(
        device.deployment, contender(name, device, slo), slo, seed=seed, noise_sigma=NOISE_SIGMA
    )
    return simulator.run(arrivals)


def static_grid(
    device: Device,
    arrivals: TokenArrivals,
    slo: TokenSLO = CHAT,
    grid: Sequence[int] = STATIC_GRID,
) -> dict[int, LLMSimResult]:
    """A static gate at every limit of ``grid`` (at most the engine's cap) on ``arrivals``."""
    limits = [n for n in grid if n <= device.engine.max_num_seqs]
    return {n: replay(device, f"static_{n}", arrivals, slo) for n in limits}


def best_static(grid: dict[int, LLMSimResult]) -> tuple[int, LLMSimResult]:
    """The limit with the highest goodput in hindsight (the smaller on a tie)."""
    limit = max(sorted(grid), key=lambda n: grid[n].goodput_rps)
    return limit, grid[limit]


def best_static_per_phase(
    grid: dict[int, LLMSimResult], phases: Sequence[tuple[float, float]]
) -> tuple[float, list[int]]:
    """The goodput of the best static limit chosen anew for each phase in hindsight, an upper
    bound for a static gate on a non-stationary trace (a switch costs nothing here): its
    requests per second over the whole run, and the limit of each phase."""
    good = 0
    chosen: list[int] = []
    duration = next(iter(grid.values())).duration_s
    for start, end in phases:
        counts = {n: int(np.count_nonzero(r.phase(start, end).good_mask)) for n, r in grid.items()}
        best = max(sorted(counts), key=counts.__getitem__)
        chosen.append(best)
        good += counts[best]
    return good / duration, chosen


def phases_of(name: str, duration_s: float = 300.0) -> list[tuple[float, float]]:
    """The phases of a non-stationary workload: the steps of ``steps``, 30 s windows else."""
    if name == "steps":
        step = duration_s / 5
        return [(i * step, (i + 1) * step) for i in range(5)]
    count = max(int(duration_s // 30), 1)
    width = duration_s / count
    return [(i * width, (i + 1) * width) for i in range(count)]


def _search(
    attains: Callable[[float], float], low: float, high: float, target: float, steps: int
) -> float:
    """The highest rate whose attainment is >= ``target``, by bisection (attainment falls
    with the rate, to noise); the bracket ``[low, high]`` is halved or doubled until it holds
    the answer (0 when even ``low / 1024`` misses)."""
    for _ in range(10):
        if attains(low) >= target:
            break
        low, high = low / 2, low
    else:
        return 0.0
    while attains(high) >= target:
        low, high = high, high * 2
        if high > 1e5:
            return math.inf
    for _ in range(steps):
        middle = 0.5 * (low + high)
        if attains(middle) >= target:
            low = middle
        else:
            high = middle
    return low


def capacity(
    device: Device,
    name: str,
    workload_name: str,
    *,
    low: float,
    high: float,
    target: float = 0.9,
    steps: int = 6,
    duration_s: float = 300.0,
    slo: TokenSLO = CHAT,
    factor: float | None = None,
) -> float:
    """The highest mean rate at which contender ``name`` keeps ``target`` attainment on the
    workload.

    By bisection from the bracket ``[low, high]`` (moved until it holds the answer) with
    ``steps`` halvings; or, with ``factor`` (> 1), by a scan of the rates ``low * factor**k``
    up to ``high``, stopped after two misses in a row: the highest rate that made it (a
    contender whose attainment dips and recovers with the rate, as a gate's refusals can make
    it, is not cut short at its first dip). 0 when even the lowest misses.
    """

    def attains(rate: float) -> float:
        return replay(device, name, workload(workload_name, rate, duration_s), slo).attainment

    if factor is None:
        return _search(attains, low, high, target, steps)
    best, misses, rate = 0.0, 0, low
    while rate <= high * (1 + 1e-9) and misses < 2:
        if attains(rate) >= target:
            best, misses = rate, 0
        else:
            misses += 1
        rate *= factor
    return best


def knee(
    device: Device,
    workload_name: str,
    *,
    low: float = 1.0,
    high: float = 16.0,
    steps: int = 6,
    duration_s: float = 300.0,
    slo: TokenSLO = CHAT,
) -> float:
    """The knee of a workload: the rate at which ``vllm_defaults`` reaches 90 % attainment."""
    return capacity(
        device,
        "vllm_defaults",
        workload_name,
        low=low,
        high=high,
        steps=steps,
        duration_s=duration_s,
        slo=slo,
    )

"""LLM replays: every contender on the same token traces, in one run (issue 23's targets).

The device is the H200 roofline preset for Llama-3.1-8B (bf16) with vLLM's API-server caps
(1024 sequences, 8192 tokens a step), judged by the chat preset (TTFT 300 ms, TPOT 50 ms at
p99). The fitted profile is our closed-form fit of splitwise-sim's Llama-2-70B measurements on
four H100s (same caps), judged by TTFT 1 s / TPOT 100 ms: its prefill alone takes more than
300 ms for one conversation prompt in ten.
Each cell replays 300 s; step times carry a 5 % lognormal jitter; everything is deterministic.

* The **knee** of a workload is the rate at which ``vllm_defaults`` reaches 90 % attainment
  (bisection); the stationary cells run at 0.5, 0.8, 1, 1.5 and 2 x it.
* ``static_gate_best`` is the best in-flight limit of :data:`STATIC_GRID` on that very trace in
  hindsight; ``static_gate_best_per_phase`` (non-stationary workloads) picks the best anew for
  each phase.
* ``test_capacity`` scans each contender's rates from 0.7 to 2 x the knee in 5 % steps: its
  capacity is the highest at which it keeps >= 90 % attainment (two misses in a row end it).
* ``test_speed`` replays one simulated hour of the Azure conversation trace at its knee.
* ``test_llm_bursts_redrawn`` replays ``bursts`` drawn again with :data:`BURST_SEEDS` (the
  contenders only, no static grid): one draw of a bursty trace cannot tell whether a p99
  target holds.

``test_targets`` runs last: it writes ``benchmarks/results/llm_replay.md`` and the plots, then
checks the targets (docs/benchmarks.md, "LLM serving"): the misses recorded there
(:data:`KNOWN_MISSES`) are reported as MISS, any other miss fails it. Run the whole file:
``python -m pytest benchmarks/test_llm_replay.py`` (the traces folder is
``ADAPTIVE_BATCHER_TRACES``, default ``../shared/traces`` next to the repository).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from functools import cache
from typing import Any

import pytest

from adaptive_batcher.llm.slo import TokenSLO
from adaptive_batcher.sim.llm.report import LLMCell, comparison_markdown, plot_timeseries
from adaptive_batcher.sim.llm.result import LLMSimResult
from adaptive_batcher.sim.llm.scenarios import (
    CHAT,
    CONTENDERS,
    DEVICES,
    Device,
    best_static,
    best_static_per_phase,
    capacity,
    knee,
    phases_of,
    replay,
    static_grid,
    workload,
)
from adaptive_batcher.sim.llm.workloads import TokenArrivals
from benchmarks.conftest import RESULTS_DIR

CELLS: dict[tuple[str, str], LLMCell] = {}
CAPACITY: dict[tuple[str, str], float] = {}
SPEED: dict[str, float] = {}
STATIONARY = ("poisson", "azure_conv", "azure_code")
LOADS = (0.5, 0.8, 1.0, 1.5, 2.0)
GRID_LOADS = (0.5, 1.0, 1.5, 2.0)  # the cells judged against the best static gate
NONSTATIONARY = ("steps", "bursts")
BURST_SEEDS = (1, 2, 3, 4)  # bursts drawn again (the main cell is seed 0)
LONG_OUTPUT_RATE = 14.0  # vllm_defaults runs out of KV cache here (about a quarter preempted)
NOISE = 0.03  # goodput differences below 3 % are not told apart (docs/benchmarks.md)
ALL = (*CONTENDERS, "ours_client_only", "aimd_gate_paced")
FIT = "h100x4_llama70b_fit"
FIT_SLO = TokenSLO(ttft_ms=1000, tpot_ms=100)


def slo_of(device_name: str) -> TokenSLO:
    return FIT_SLO if device_name == FIT else CHAT


@cache
def device(name: str = "h200_llama8b") -> Device:
    return DEVICES[name]()


@cache
def knee_of(workload_name: str, device_name: str = "h200_llama8b") -> float:
    low, high = (0.5, 2.0) if workload_name == "azure_code" else (4.0, 16.0)
    if device_name != "h200_llama8b":
        low, high = low / 4, high / 4
    dev, slo = device(device_name), slo_of(device_name)
    return knee(dev, workload_name, low=low, high=high, steps=6, slo=slo)


def scenario_name(workload_name: str, load: float, device_name: str = "h200_llama8b") -> str:
    prefix = "" if device_name == "h200_llama8b" else f"{device_name}:"
    return f"{prefix}{workload_name}@{load:g}x"


@cache
def arrivals(workload_name: str, load: float, device_name: str = "h200_llama8b") -> TokenArrivals:
    if workload_name == "long_output":
        return workload("long_output", LONG_OUTPUT_RATE * load)
    reference = "poisson" if workload_name in NONSTATIONARY else workload_name
    return workload(workload_name, load * knee_of(reference, device_name))


def record(benchmark: Any, scenario: str, name: str, result: LLMSimResult, note: str = "") -> None:
    benchmark.extra_info.update(result.summary())
    benchmark.extra_info["note"] = note
    CELLS[(scenario, name)] = LLMCell(scenario, name, result, note)


def run_cell(benchmark: Any, scenario: str, name: str, make: Callable[[], LLMSimResult]) -> None:
    results: list[LLMSimResult] = []
    benchmark.pedantic(lambda: results.append(make()), rounds=1)
    result = results[0]
    record(benchmark, scenario, name, result)
    assert result.requests > 0


def grid_cell(
    benchmark: Any,
    scenario: str,
    work: TokenArrivals,
    dev: Device,
    phases: list[Any] | None,
    slo: TokenSLO = CHAT,
) -> None:
    grids: list[dict[int, LLMSimResult]] = []
    benchmark.pedantic(lambda: grids.append(static_grid(dev, work, slo)), rounds=1)
    limit, result = best_static(grids[0])
    record(benchmark, scenario, "static_gate_best", result, f"limit {limit}")
    if phases is not None:
        goodput, chosen = best_static_per_phase(grids[0], phases)
        benchmark.extra_info["per_phase_goodput_rps"] = goodput
        CELLS[(scenario, "static_gate_best_per_phase")] = LLMCell(
            scenario,
            "static_gate_best_per_phase",
            result,
            f"{goodput:.2f} req/s, limits {'/'.join(map(str, chosen))}",
        )
        PER_PHASE[scenario] = goodput


PER_PHASE: dict[str, float] = {}


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("load", LOADS)
@pytest.mark.parametrize("workload_name", STATIONARY)
def test_llm_cell(benchmark: Any, workload_name: str, load: float, name: str) -> None:
    work = arrivals(workload_name, load)
    run_cell(
        benchmark,
        scenario_name(workload_name, load),
        name,
        lambda: replay(device(), name, work),
    )


@pytest.mark.parametrize("load", GRID_LOADS)
@pytest.mark.parametrize("workload_name", STATIONARY)
def test_llm_static_grid(benchmark: Any, workload_name: str, load: float) -> None:
    work = arrivals(workload_name, load)
    phases = phases_of(workload_name) if workload_name == "azure_code" else None
    grid_cell(benchmark, scenario_name(workload_name, load), work, device(), phases)


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("workload_name", [*NONSTATIONARY, "long_output"])
def test_llm_nonstationary(benchmark: Any, workload_name: str, name: str) -> None:
    work = arrivals(workload_name, 1.0)
    run_cell(
        benchmark, scenario_name(workload_name, 1.0), name, lambda: replay(device(), name, work)
    )


@pytest.mark.parametrize("workload_name", [*NONSTATIONARY, "long_output"])
def test_llm_nonstationary_grid(benchmark: Any, workload_name: str) -> None:
    work = arrivals(workload_name, 1.0)
    phases = phases_of(workload_name) if workload_name in NONSTATIONARY else None
    grid_cell(benchmark, scenario_name(workload_name, 1.0), work, device(), phases)


@pytest.mark.parametrize("name", CONTENDERS)
@pytest.mark.parametrize("seed", BURST_SEEDS)
def test_llm_bursts_redrawn(benchmark: Any, seed: int, name: str) -> None:
    work = workload("bursts", knee_of("poisson"), seed=seed)
    scenario = scenario_name(f"bursts-seed{seed}", 1.0)
    run_cell(benchmark, scenario, name, lambda: replay(device(), name, work))


@pytest.mark.parametrize("name", CONTENDERS)
@pytest.mark.parametrize("load", GRID_LOADS)
def test_llm_fitted_profile(benchmark: Any, load: float, name: str) -> None:
    dev = device(FIT)
    work = arrivals("azure_conv", load, FIT)
    scenario = scenario_name("azure_conv", load, FIT)
    run_cell(benchmark, scenario, name, lambda: replay(dev, name, work, FIT_SLO))


@pytest.mark.parametrize("load", GRID_LOADS)
def test_llm_fitted_profile_grid(benchmark: Any, load: float) -> None:
    dev = device(FIT)
    work = arrivals("azure_conv", load, FIT)
    scenario = scenario_name("azure_conv", load, FIT)
    grid_cell(benchmark, scenario, work, dev, None, FIT_SLO)


@pytest.mark.parametrize("name", CONTENDERS)
@pytest.mark.parametrize("workload_name", STATIONARY)
def test_capacity(benchmark: Any, workload_name: str, name: str) -> None:
    base = knee_of(workload_name)
    found: list[float] = []
    benchmark.pedantic(
        lambda: found.append(
            capacity(device(), name, workload_name, low=0.7 * base, high=2.0 * base, factor=1.05)
        ),
        rounds=1,
    )
    CAPACITY[(workload_name, name)] = found[0]
    benchmark.extra_info["capacity_rps"] = found[0]
    assert found[0] > 0


def test_speed(benchmark: Any, one_core: None) -> None:
    """One simulated hour of the Azure conversation trace at its knee, ours (the slowest)."""
    rate = knee_of("azure_conv")
    hour = workload("azure_conv", rate, 3600.0 / 4).tiled(4)
    results: list[LLMSimResult] = []
    start = time.perf_counter()
    benchmark.pedantic(lambda: results.append(replay(device(), "ours", hour)), rounds=1)
    SPEED["ours"] = time.perf_counter() - start
    benchmark.extra_info["wall_s_per_simulated_hour"] = SPEED["ours"]
    benchmark.extra_info["requests"] = results[0].requests
    assert results[0].requests > 0


# -- the report and the targets ---------------------------------------------------------------


def test_targets() -> None:
    """Write the report, then check the targets on the cells that ran."""
    assert CELLS, "run the replay cells first (the whole file)"
    RESULTS_DIR.mkdir(exist_ok=True)
    cells = sorted(CELLS.values(), key=lambda c: (c.scenario, c.contender))
    verdicts = _verdicts()
    knees = ", ".join(f"{w} {knee_of(w):.2f} req/s" for w in STATIONARY)
    text = (
        f"Knees (vllm_defaults at 90 % attainment): {knees}; fitted profile azure_conv "
        f"{knee_of('azure_conv', FIT):.2f} req/s (TTFT 1 s / TPOT 100 ms).\n\n"
        + comparison_markdown(cells)
        + "\n"
        + _capacity_table()
        + "\n"
        + "\n".join(f"- {v}" for v in verdicts)
        + "\n"
    )
    (RESULTS_DIR / "llm_replay.md").write_text(text)
    for scenario in sorted({c.scenario for c in cells}):
        shown = {
            c.contender: c.result
            for c in cells
            if c.scenario == scenario and c.contender in (*CONTENDERS, "static_gate_best")
        }
        safe = scenario.replace(":", "_").replace("@", "_at_")
        slo = FIT_SLO if scenario.startswith(FIT) else CHAT
        plot_timeseries(
            shown,
            RESULTS_DIR / f"llm_{safe}.png",
            ttft_ms=slo.ttft_ms,
            tpot_ms=slo.tpot_ms,
            title=scenario,
        )
    print("\n" + text)
    failed = [v for v in verdicts if v.startswith("FAIL")]
    assert not failed, "\n".join(failed)


def _capacity_table() -> str:
    if not CAPACITY:
        return ""
    lines = [
        "| workload | contender | capacity req/s (>= 90 % attainment) | vs vllm |",
        "|---|---|---|---|",
    ]
    for (work, name), value in sorted(CAPACITY.items()):
        reference = CAPACITY.get((work, "vllm_defaults"))
        ratio = f"{value / reference:.2f}" if reference else "-"
        lines.append(f"| {work} | {name} | {value:.2f} | {ratio} |")
    return "\n".join(lines) + "\n"


def _good(scenario: str, name: str) -> float | None:
    cell = CELLS.get((scenario, name))
    return None if cell is None else cell.result.goodput_rps


# Targets this replay misses, recorded with their figures and reasons in docs/benchmarks.md
# ("LLM serving"): reported as MISS, not failing the run; any other miss is a FAIL.
KNOWN_MISSES = frozenset(
    {
        "vs_vllm:azure_code@1.5x",
        "vs_vllm:azure_code@2x",
        "light:poisson@0.5x",
        "light:azure_code@0.5x",
        "light:poisson@0.8x",
        "light:azure_conv@0.8x",
        "light:azure_code@0.8x",
        "slo:azure_code@0.8x",
        "slo:azure_code@1x",
        "slo:azure_code@1.5x",
        "slo:azure_code@2x",
        "capacity:poisson",
        "capacity:azure_conv",
        "capacity:azure_code",
        # bursts drawn again: ours' admitted TTFT p99 past the SLO on seed 3 (a burst at
        # start, before any forecast)
        "slo:bursts-seed3@1x",
    }
)


def _tag(ok: bool, key: str = "") -> str:
    if ok:
        return (
            "PASS (a known miss no longer misses: update docs/benchmarks.md)"
            if (key in KNOWN_MISSES)
            else "PASS"
        )
    return "MISS" if key in KNOWN_MISSES else "FAIL"


def _verdicts() -> list[str]:
    out: list[str] = []
    for work in STATIONARY:
        for load in GRID_LOADS:
            out += _versus_static(scenario_name(work, load), 0.95, load >= 1.5)
    for load in GRID_LOADS:
        out += _versus_static(scenario_name("azure_conv", load, FIT), 0.95, load >= 1.5)
    for work in NONSTATIONARY:
        out += _versus_static(scenario_name(work, 1.0), 1.0, False)
    out += _versus_static(scenario_name("azure_code", 1.0), 1.0, False)  # bursty: also non-stat.
    for load in (0.5, 0.8):
        for work in STATIONARY:
            out += _light(scenario_name(work, load))
    out += _admitted_meet_slo()
    out += _capacity()
    out += _long_output()
    out += _beats_baselines()
    if "ours" in SPEED:
        seconds = SPEED["ours"]
        out.append(
            f"{_tag(seconds < 60)} speed: a simulated hour of azure_conv at its knee in "
            f"{seconds:.1f} s (< 60)"
        )
    return out


def _versus_static(scenario: str, ratio: float, versus_vllm: bool) -> list[str]:
    ours, best = _good(scenario, "ours"), _good(scenario, "static_gate_best")
    vllm = _good(scenario, "vllm_defaults")
    if ours is None or best is None:
        return []
    got = ours / best if best > 0 else math.inf
    tag = _tag(got >= ratio, f"vs_static:{scenario}")
    line = f"{tag} {scenario}: ours {got:.3f}x static_gate_best (>= {ratio:g})"
    if scenario in PER_PHASE:
        bound = PER_PHASE[scenario]
        line += f"; per-phase upper bound {bound:.2f} req/s, ours {ours / bound:.3f}x it"
    out = [line]
    if versus_vllm and vllm is not None:
        over = ours / vllm if vllm > 0 else math.inf
        tag = _tag(over >= 1.5, f"vs_vllm:{scenario}")
        out.append(f"{tag} {scenario}: ours {over:.2f}x vllm_defaults (>= 1.5)")
    return out


def _light(scenario: str) -> list[str]:
    ours, vllm = CELLS.get((scenario, "ours")), CELLS.get((scenario, "vllm_defaults"))
    if ours is None or vllm is None:
        return []
    rejected = ours.result.rejected_fraction
    ratio = ours.result.goodput_rps / vllm.result.goodput_rps
    ok = rejected < 0.001 and ratio >= 0.99
    return [
        f"{_tag(ok, f'light:{scenario}')} {scenario} (light): ours rejects "
        f"{100 * rejected:.3f} % (< 0.1), "
        f"goodput {ratio:.3f}x vllm_defaults (>= 0.99)"
    ]


def _admitted_meet_slo() -> list[str]:
    out = []
    for (scenario, name), cell in sorted(CELLS.items()):
        if name != "ours" or scenario.startswith("long_output"):
            continue
        slo = FIT_SLO if scenario.startswith(FIT) else CHAT
        ttft, tpot = cell.result.ttft_ms(0.99), cell.result.tpot_ms(0.99)
        ok = ttft <= slo.ttft_ms and tpot <= slo.tpot_ms
        out.append(
            f"{_tag(ok, f'slo:{scenario}')} {scenario}: admitted TTFT p99 {ttft:.0f} ms "
            f"(<= {slo.ttft_ms:g}), "
            f"TPOT p99 {tpot:.1f} ms (<= {slo.tpot_ms:g})"
        )
    return out


def _capacity() -> list[str]:
    out = []
    for work in STATIONARY:
        ours, vllm = CAPACITY.get((work, "ours")), CAPACITY.get((work, "vllm_defaults"))
        if ours is None or vllm is None:
            continue
        ratio = ours / vllm
        out.append(
            f"{_tag(ratio >= 1.3, f'capacity:{work}')} {work}: capacity at >= 90 % attainment "
            f"{ours:.2f} req/s, "
            f"{ratio:.2f}x vllm_defaults' {vllm:.2f} (>= 1.3)"
        )
    return out


def _long_output() -> list[str]:
    scenario = scenario_name("long_output", 1.0)
    ours, vllm = CELLS.get((scenario, "ours")), CELLS.get((scenario, "vllm_defaults"))
    if ours is None or vllm is None:
        return []
    ok = vllm.result.engine_preemptions > 0 and ours.result.preempted_fraction < 0.01
    return [
        f"{_tag(ok)} {scenario}: vllm_defaults preempts "
        f"{100 * vllm.result.preempted_fraction:.2f} % of requests, ours "
        f"{100 * ours.result.preempted_fraction:.2f} % (< 1)"
    ]


def _beats_baselines() -> list[str]:
    out = []
    for scenario in sorted({s for s, _ in CELLS}):
        ours = _good(scenario, "ours")
        if ours is None:
            continue
        for rival in ("trtllm_tuner", "aimd_gate"):
            theirs = _good(scenario, rival)
            if theirs is None or abs(ours - theirs) <= NOISE * max(ours, theirs):
                continue
            out.append(
                f"{_tag(ours > theirs, f'beats:{scenario}:{rival}')} {scenario}: ours {ours:.2f} "
                f"vs {rival} {theirs:.2f} req/s"
            )
    return out

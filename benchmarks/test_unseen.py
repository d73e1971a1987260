"""Held-out replays: the controller on devices, SLOs and traffic its tuning never used.

The replay suite (``test_replay.py``) is where the controller was developed: resnet50 on an H200
under an SLO of p99 50 ms. Here the same contenders meet cases that were not looked at while
tuning: the named scenarios under other SLOs (20 and 100 ms) and on another model (bert base,
sequences of 128 tokens, from the same H200 table), and resnet50 under traffic shapes that are
not in the suite (gamma arrivals with a CV of 4, a slow ramp through capacity, short bursts, a
fast diurnal cycle, sustained overload at 120 % and 200 %, heavy stalls on 30 % of batches,
stalls at 5 % load; and two cases added later that are not held out, 10x spikes on 5 % of
batches at 15 % load and on 30 % at 5 % load; and ``resnet50_slo20_stalls``, held out no longer
either: the window plan's tail constraint and the stall hold's elasticity test were built while
looking at it and the spike cases). Issue 21 added its faults (event-loop stalls, a slowdown,
contention, long batches: ``adaptive_batcher.sim.faults``) on the other devices and SLOs, and at
other loads and timings on resnet50 (a 5 s stall at 30 %, a 3x slowdown for 10 s at 45 %, long
batches every 3 s at 80 %), judged as the noisy cases are. Each case reports our PID with and
without shedding beside Triton-like (window 0, cap 512), the best static setting in hindsight
with and without shedding and the cost oracle (a 4 x 4 grid: windows 0-30 ms, caps 64-512),
judged against the second-generation controller's targets where they apply (stationary:
attainment >= 99.5 % at <= 1.15x the oracle's device cost; overloaded: goodput >= 0.98x the best
static with shedding at <= 1.1x its cost per answer within the SLO; noisy: attainment never
below Triton-like and within 1 point of the best static, with and without shedding). The
verdicts are reported, not asserted: a held-out set measures. Every run of ours and
Triton-like's must still lose no request.

Run: ``python -m pytest benchmarks/test_unseen.py`` (25-40 min); writes
``benchmarks/results/unseen.md``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pytest

from adaptive_batcher.sim.faults import Faults, LongBatch, LoopStall, Slowdown
from adaptive_batcher.sim.result import SimResult
from adaptive_batcher.sim.scenarios import (
    CONTENDERS,
    SCENARIOS,
    Scenario,
    best_static,
    capacity_rps,
    cost_oracle,
    make_scenarios,
    run,
    static_grid,
)
from adaptive_batcher.sim.service import Noisy, Spikes, Stalls, TableService
from adaptive_batcher.sim.workloads import Arrivals, Diurnal, Gamma, MMPPBursts, Poisson, Steps
from adaptive_batcher.slo import SLO
from benchmarks.conftest import RESULTS_DIR, report_lines

WINDOWS_MS, CAPS = (0.0, 10.0, 20.0, 30.0), (64, 128, 256, 512)
SHED, PLAIN = "adaptive_pid_shed", "adaptive_pid"


@dataclass(frozen=True)
class Case:
    """A held-out scenario and which targets apply (``stationary``, ``overloaded``, ``noisy``)."""

    scenario: Scenario
    kind: str


def _other_devices() -> dict[str, Case]:
    kinds = {
        "poisson_30": "stationary",
        "poisson_90": "stationary",
        "steps": "overloaded",
        "bursts": "overloaded",
        "stalls": "noisy",
        "noise_30": "noisy",
        # issue 21's faults, judged as the noisy cases are
        "loop_stalls": "noisy",
        "slowdown_10x": "noisy",
        "contention": "noisy",
        "long_batch": "noisy",
    }
    cases = {}
    for model, slo_ms in (("resnet50", 20.0), ("resnet50", 100.0), ("bert_base_seq128", 50.0)):
        named = make_scenarios(TableService.from_h200(model), SLO(latency_ms=slo_ms))
        for name, kind in kinds.items():
            cases[f"{model}_slo{slo_ms:g}_{name}"] = Case(named[name], kind)
    return cases


def _generated(make: Callable[[], Any], duration_s: float) -> Callable[[int], Arrivals]:
    def build(seed: int) -> Arrivals:
        arrivals: Arrivals = make().generate(duration_s, np.random.default_rng(seed))
        return arrivals

    return build


def _other_traffic() -> dict[str, Case]:
    """resnet50, SLO 50 ms: traffic shapes the suite does not have (loads as fractions of the
    capacity the suite uses)."""
    table = TableService.from_h200("resnet50")
    capacity = capacity_rps(table, SLO(latency_ms=50.0))
    base = SCENARIOS["poisson_30"]
    measured = Noisy(table, cv=0.05)

    def case(name: str, kind: str, make: Callable[[], Any], duration_s: float, **kw: Any) -> Case:
        arrivals = _generated(make, duration_s)
        kw.setdefault("rate_rps", None)
        scenario = replace(
            base, name=name, description=name, arrivals=arrivals, stationary=False, **kw
        )
        return Case(scenario, kind)

    def load(*fractions: float) -> tuple[float, ...]:
        return tuple(f * capacity for f in fractions)

    cases = [
        case("gamma_cv4_60", "stationary", lambda: Gamma(0.6 * capacity, 4.0), 20.0),
        case("gamma_cv4_90", "stationary", lambda: Gamma(0.9 * capacity, 4.0), 20.0),
        case("ramp", "overloaded", lambda: Steps(load(*np.linspace(0.05, 1.3, 20)), 1.5), 30.0),
        case(
            "fast_bursts",
            "overloaded",
            lambda: MMPPBursts(0.2 * capacity, 1.6 * capacity, 0.2, 0.8),
            30.0,
        ),
        case("diurnal_fast", "overloaded", lambda: Diurnal(0.6 * capacity, 0.9, 4.0), 30.0),
        case("overload_120", "overloaded", lambda: Poisson(1.2 * capacity), 20.0),
        case("overload_200", "overloaded", lambda: Poisson(2.0 * capacity), 20.0),
        case(
            "steps_heavy_stalls",
            "overloaded",
            lambda: Steps(load(0.3, 0.9, 1.5, 0.3), 10.0),
            40.0,
            service=lambda: Stalls(measured, probability=0.3, scale_s=0.005, alpha=1.5),
        ),
        case(
            "light_stalls",
            "noisy",
            lambda: Poisson(0.05 * capacity),
            30.0,
            service=lambda: Stalls(measured, probability=0.05, scale_s=0.005, alpha=1.5),
            rate_rps=0.05 * capacity,
        ),
        # added later, and not held out: the window's noise-body error bars and shedding's
        # largest fitting cap were chosen while looking at spikes like these
        case(
            "light_spikes",
            "noisy",
            lambda: Poisson(0.15 * capacity),
            30.0,
            service=lambda: Spikes(measured, probability=0.05, factor=10.0),
            rate_rps=0.15 * capacity,
        ),
        case(
            "frequent_spikes",
            "noisy",
            lambda: Poisson(0.05 * capacity),
            30.0,
            service=lambda: Spikes(measured, probability=0.3, factor=10.0),
            rate_rps=0.05 * capacity,
        ),
        # issue 21's faults at other loads and timings than the suite's
        case(
            "stall_5s_30",
            "noisy",
            lambda: Poisson(0.3 * capacity),
            30.0,
            faults=Faults((LoopStall(10.0, 5.0),)),
            rate_rps=0.3 * capacity,
        ),
        case(
            "slowdown_3x_45",
            "noisy",
            lambda: Poisson(0.45 * capacity),
            30.0,
            faults=Faults((Slowdown(8.0, 10.0, 3.0),)),
            rate_rps=0.45 * capacity,
        ),
        case(
            "long_batches_80",
            "noisy",
            lambda: Poisson(0.8 * capacity),
            30.0,
            faults=Faults(tuple(LongBatch(5.0 + 3.0 * i, 0.2) for i in range(8))),
            rate_rps=0.8 * capacity,
        ),
    ]
    return {c.scenario.name: c for c in cases}


CASES: dict[str, Case] = {**_other_devices(), **_other_traffic()}
ROWS: dict[str, dict[str, SimResult | str | None]] = {}


@pytest.mark.parametrize("name", list(CASES))
def test_unseen(benchmark: Any, name: str) -> None:
    scenario = CASES[name].scenario
    row: dict[str, SimResult | str | None] = {}

    def replay() -> None:
        for contender in (SHED, PLAIN, "triton_like"):
            row[contender] = run(scenario, CONTENDERS[contender](scenario))
        plain = static_grid(scenario, windows_ms=WINDOWS_MS, caps=CAPS)
        best = best_static(plain)
        oracle = cost_oracle(plain)
        best_shed = best_static(static_grid(scenario, shed=True, windows_ms=WINDOWS_MS, caps=CAPS))
        row["best_static"], row["best_static_label"] = best.result, best.label
        row["best_static_shed"] = best_shed.result
        row["cost_oracle"] = None if oracle is None else oracle.result

    benchmark.pedantic(replay, rounds=1)
    ROWS[name] = row
    for contender in (SHED, PLAIN, "triton_like"):
        result = row[contender]
        assert isinstance(result, SimResult)
        assert result.lost == 0
        benchmark.extra_info[contender] = result.summary()


def test_unseen_report() -> None:
    """The table and the verdicts of the cases that ran (run the whole file)."""
    assert ROWS, "run the cases first (the whole file)"
    lines = [
        "| case | targets | Triton-like | best static | best static, shed | PID | PID, shed "
        "| cost / oracle (PID, shed) | goodput / best shed | cost per good / best shed "
        "| verdict |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    misses = 0
    for name, row in ROWS.items():
        cells, verdict = _row(CASES[name].kind, row)
        misses += verdict.startswith("miss")
        lines.append(f"| {name} | {CASES[name].kind} | " + " | ".join(cells) + f" | {verdict} |")
    lines.append("")
    lines.append(f"{len(ROWS) - misses} of {len(ROWS)} cases meet their targets.")
    RESULTS_DIR.mkdir(exist_ok=True)
    (RESULTS_DIR / "unseen.md").write_text("\n".join(lines) + "\n")
    report_lines("unseen", lines)


def _result(row: dict[str, Any], key: str) -> SimResult:
    result = row[key]
    assert isinstance(result, SimResult)
    return result


def _row(kind: str, row: dict[str, Any]) -> tuple[list[str], str]:
    triton, best = _result(row, "triton_like"), _result(row, "best_static")
    best_shed, oracle = _result(row, "best_static_shed"), row["cost_oracle"]
    plain, shed = _result(row, PLAIN), _result(row, SHED)
    cost = (
        f"{plain.device_ms_per_request / oracle.device_ms_per_request:.3f} / "
        f"{shed.device_ms_per_request / oracle.device_ms_per_request:.3f}"
        if oracle is not None
        else "no setting meets the SLO"
    )
    goodput = shed.goodput_rps / best_shed.goodput_rps
    per_good = shed.device_ms_per_good / best_shed.device_ms_per_good
    cells = [
        f"{triton.slo_attainment:.4f}",
        f"{best.slo_attainment:.4f} ({row['best_static_label']})",
        f"{best_shed.slo_attainment:.4f}",
        f"{plain.slo_attainment:.4f}",
        f"{shed.slo_attainment:.4f}",
        cost,
        f"{goodput:.3f}",
        f"{per_good:.3f}",
    ]
    return cells, _verdict(kind, row, goodput, per_good)


def _verdict(kind: str, row: dict[str, Any], goodput: float, per_good: float) -> str:
    shed, oracle = _result(row, SHED), row["cost_oracle"]
    if kind == "stationary":
        if oracle is None:
            return "miss: no static setting meets the SLO (not stationary after all)"
        ratio = shed.device_ms_per_request / oracle.device_ms_per_request
        ok = shed.slo_attainment >= 0.995 and ratio <= 1.15
        return "meets" if ok else f"miss: attainment {shed.slo_attainment:.4f}, cost {ratio:.3f}x"
    if kind == "overloaded":
        ok = goodput >= 0.98 and per_good <= 1.1
        return "meets" if ok else f"miss: goodput {goodput:.3f}x, cost per good {per_good:.3f}x"
    triton, best = _result(row, "triton_like"), _result(row, "best_static")
    low = [
        f"{label} {ours.slo_attainment:.4f}"
        for label, ours in (("PID", _result(row, PLAIN)), ("PID, shed", shed))
        if ours.slo_attainment < triton.slo_attainment - 0.0001
        or ours.slo_attainment < best.slo_attainment - 0.01
    ]
    return "meets" if not low else "miss: " + ", ".join(low)

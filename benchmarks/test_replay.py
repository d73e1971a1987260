"""Deterministic replays: every policy and baseline on every scenario, in one run.

One benchmark per (scenario, contender) cell; SLO metrics go to ``extra_info``. The static grid
searched in hindsight (and, as an ablation, the same grid with SLO-aware shedding) is a cell of
its own. ``test_targets`` runs last: it writes ``benchmarks/results/replay.md`` and the plots,
then checks the targets (see docs/benchmarks.md).

Run: ``python -m pytest benchmarks/test_replay.py`` (about 5-8 minutes on 2 cores).
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from adaptive_batcher.sim.report import Cell, comparison_markdown, plot_goodput, plot_timeseries
from adaptive_batcher.sim.result import SimResult
from adaptive_batcher.sim.scenarios import CONTENDERS, SCENARIOS, best_static, run
from benchmarks.conftest import RESULTS_DIR

CELLS: dict[tuple[str, str], Cell] = {}
ADAPTIVE = "adaptive_pid_shed"
NON_STATIONARY = ("steps", "diurnal", "bursts", "azure_code")


def record(
    benchmark: Any, scenario: str, contender: str, result: SimResult, note: str = ""
) -> None:
    benchmark.extra_info.update(result.summary())
    benchmark.extra_info["note"] = note
    CELLS[(scenario, contender)] = Cell(scenario, contender, result, note)


@pytest.mark.parametrize("contender", list(CONTENDERS))
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_replay(benchmark: Any, scenario: str, contender: str) -> None:
    case = SCENARIOS[scenario]
    results: list[SimResult] = []
    benchmark.pedantic(lambda: results.append(run(case, CONTENDERS[contender](case))), rounds=1)
    result = results[0]
    note = ""
    if case.step_at_s is not None:
        recovery = result.recovery_time_s(case.step_at_s, case.slo.p99_ms)
        benchmark.extra_info["recovery_s"] = recovery
        note = f"p99 back under SLO {recovery:.2f} s after the step"
    record(benchmark, scenario, contender, result, note)
    assert result.lost == 0


@pytest.mark.parametrize("shed", [False, True], ids=["best_static", "best_static_shed"])
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_replay_static_grid(benchmark: Any, scenario: str, shed: bool) -> None:
    case = SCENARIOS[scenario]
    found: list[tuple[SimResult, tuple[float, int]]] = []
    grid = {"shed": shed, "windows_ms": (0.0,), "caps": (128, 256, 512)} if shed else {}
    benchmark.pedantic(lambda: found.append(best_static(case, **grid)), rounds=1)  # type: ignore[arg-type]
    result, (window, cap) = found[0]
    name = "best_static_shed" if shed else "best_static"
    record(benchmark, scenario, name, result, f"window {window:g} ms, cap {cap}")


def test_targets() -> None:
    """Write the report, then check the targets on the cells that ran."""
    assert CELLS, "run the replay cells first (the whole file)"
    cells = sorted(CELLS.values(), key=lambda c: (list(SCENARIOS).index(c.scenario), c.contender))
    RESULTS_DIR.mkdir(exist_ok=True)
    verdicts = _verdicts()
    text = comparison_markdown(cells) + "\n" + "\n".join(f"- {v}" for v in verdicts) + "\n"
    (RESULTS_DIR / "replay.md").write_text(text)
    plot_goodput(cells, RESULTS_DIR / "replay_goodput.png")
    for scenario in SCENARIOS:
        shown = {
            c.contender: c.result
            for c in cells
            if c.scenario == scenario and c.contender in (ADAPTIVE, "triton_like", "bentoml_cork")
        }
        if shown:
            plot_timeseries(
                shown,
                RESULTS_DIR / f"replay_{scenario}.png",
                slo_ms=SCENARIOS[scenario].slo.p99_ms,
                title=scenario,
            )
    print("\n" + text)
    failed = [v for v in verdicts if v.startswith("FAIL")]
    assert not failed, "\n".join(failed)


def _verdicts() -> list[str]:
    out: list[str] = []
    for name, case in SCENARIOS.items():
        ours, static = CELLS.get((name, ADAPTIVE)), CELLS.get((name, "best_static"))
        if ours is None or static is None:
            continue
        a, s = ours.result, static.result
        ratio = a.goodput_rps / s.goodput_rps
        if case.stationary:
            ok = ratio >= 0.95 and a.p99_ms <= case.slo.p99_ms
            out.append(
                f"{_tag(ok)} {name}: goodput {ratio:.3f}x best static (>= 0.95), "
                f"p99 {a.p99_ms:.1f} ms (<= {case.slo.p99_ms:g})"
            )
        if name in NON_STATIONARY and s.slo_attainment < 0.99:
            ok = ratio >= 1.2
            out.append(f"{_tag(ok)} {name}: goodput {ratio:.2f}x best static (>= 1.20)")
        elif name in NON_STATIONARY:  # nothing can serve 20 % more than everything
            out.append(
                f"N/A  {name}: the best static setting already answers "
                f"{s.slo_attainment:.2%} within the SLO; goodput {ratio:.2f}x"
            )
        if s.slo_attainment >= 0.99:
            ok = a.slo_attainment >= 0.99
            out.append(
                f"{_tag(ok)} {name}: SLO attainment {a.slo_attainment:.4f} (static "
                f"reached {s.slo_attainment:.4f}; >= 0.99)"
            )
        if case.step_at_s is not None:
            recovery = a.recovery_time_s(case.step_at_s, case.slo.p99_ms)
            ok = not math.isnan(recovery) and recovery <= 2.0
            out.append(
                f"{_tag(ok)} {name}: p99 back under the SLO {recovery:.2f} s after the "
                "3x step (<= 2 s)"
            )
        if case.memory is not None:
            lost = sum(c.result.lost for c in CELLS.values() if c.scenario == name)
            out.append(f"{_tag(lost == 0)} {name}: {lost} requests lost across all contenders")
    return out


def _tag(ok: bool) -> str:
    return "PASS" if ok else "FAIL"

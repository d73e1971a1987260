"""Deterministic replays: every policy and baseline on every scenario, in one run.

One benchmark per (scenario, contender) cell; SLO and cost metrics go to ``extra_info``. The
static grid replayed in hindsight gives two cells per scenario: the best static setting (the
highest goodput) and the cost oracle (the cheapest setting that answers >= 99 % within the
SLO). On the overloaded scenarios a second grid gives every static setting our SLO-aware
shedding (``best_static_shed``): how much of a gain is shedding alone, and the yardstick of
the shedding contenders' ``vs best`` (``-`` on the other scenarios). The fault scenarios
replay ours and Triton-like on four more seeds, and their verdicts compare the means of five
(one seed's draws decide a tenth of a point there). ``test_targets`` runs
last: it writes ``benchmarks/results/replay.md`` and the plots, then checks the targets (see
docs/benchmarks.md).

Run: ``python -m pytest benchmarks/test_replay.py`` (the whole file; ``test_targets`` judges
only the cells that ran in the same session).
"""

from __future__ import annotations

import math
from statistics import fmean
from typing import Any

import pytest

from adaptive_batcher.sim.report import Cell, comparison_markdown, plot_goodput, plot_timeseries
from adaptive_batcher.sim.result import SimResult
from adaptive_batcher.sim.scenarios import (
    CONTENDERS,
    SCENARIOS,
    Scenario,
    best_static,
    cost_oracle,
    run,
    share_scenarios,
    sheds,
    static_grid,
)
from benchmarks.conftest import RESULTS_DIR

CELLS: dict[tuple[str, str], Cell] = {}
ADAPTIVE, ADAPTIVE_NO_SHED = "adaptive_pid_shed", "adaptive_pid"
STATIONARY = ("poisson_30", "poisson_60", "poisson_90")
OVERLOADED = ("steps", "diurnal", "bursts")
NOISY = ("noise_30", "stalls", "bursts_stalls")
FAULTED = ("loop_stalls", "slowdown_10x", "contention", "long_batch")
AFTER_FAULT_S = 2.0  # the longest the cap may stay below the stability cap after a fault
FAULT_SEEDS = (1, 2, 3, 4)  # besides seed 0: the faults' cells are judged on the mean of five
FAULT_CONTENDERS = (ADAPTIVE, ADAPTIVE_NO_SHED, "triton_like")
SHED_GRID = {"windows_ms": (0.0, 10.0, 20.0, 30.0), "caps": (128, 256, 512)}
BANDITS = ("bandit_ucb_shed", "bandit_thompson_shed")


def record(
    benchmark: Any,
    scenario: str,
    contender: str,
    result: SimResult,
    note: str,
    *,
    shedding: bool = False,
) -> None:
    benchmark.extra_info.update(result.summary())
    benchmark.extra_info["note"] = note
    CELLS[(scenario, contender)] = Cell(scenario, contender, result, note, sheds=shedding)


@pytest.mark.parametrize("contender", list(CONTENDERS))
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_replay(benchmark: Any, scenario: str, contender: str) -> None:
    case = SCENARIOS[scenario]
    results: list[SimResult] = []
    config = CONTENDERS[contender](case)
    benchmark.pedantic(lambda: results.append(run(case, config)), rounds=1)
    result = results[0]
    note = ""
    if case.step_at_s is not None:
        recovery = result.recovery_time_s(case.step_at_s, case.slo.latency_ms)
        benchmark.extra_info["recovery_s"] = recovery
        note = f"p99 back under SLO {recovery:.2f} s after the step"
    record(benchmark, scenario, contender, result, note, shedding=sheds(config))
    assert result.lost == 0


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_replay_static_grid(benchmark: Any, scenario: str) -> None:
    """Every static (window, cap) on the grid: the best one and the cheapest that meets the SLO."""
    case = SCENARIOS[scenario]
    grids: list[Any] = []
    benchmark.pedantic(lambda: grids.append(static_grid(case)), rounds=1)
    best = best_static(grids[0])
    record(benchmark, scenario, "best_static", best.result, best.label)
    oracle = cost_oracle(grids[0])
    if oracle is not None:
        record(benchmark, scenario, "cost_oracle", oracle.result, oracle.label)


@pytest.mark.parametrize(
    "scenario", [*OVERLOADED, "overload_then_light", "bursts_stalls", *FAULTED]
)
def test_replay_static_grid_with_shedding(benchmark: Any, scenario: str) -> None:
    case = SCENARIOS[scenario]
    grids: list[Any] = []
    benchmark.pedantic(lambda: grids.append(static_grid(case, shed=True, **SHED_GRID)), rounds=1)
    best = best_static(grids[0])
    record(benchmark, scenario, "best_static_shed", best.result, best.label, shedding=True)


# attainment on FAULT_SEEDS: {scenario: {contender: [one per seed]}}
FAULT_SEED_CELLS: dict[str, dict[str, list[float]]] = {}


@pytest.mark.parametrize("scenario", FAULTED)
def test_replay_faults_on_more_seeds(benchmark: Any, scenario: str) -> None:
    """Issue 21's fault cells on four more seeds (arrivals and service draws): near capacity,
    or right after a stall, one seed's draws move a contender by tenths of a point (in
    ``contention`` ours and Triton-like both ran window 0 at cap 512 and parted by chance)."""
    case = SCENARIOS[scenario]
    row: dict[str, list[float]] = {}

    def replay() -> None:
        for contender in FAULT_CONTENDERS:
            results = [run(case, CONTENDERS[contender](case), seed) for seed in FAULT_SEEDS]
            assert all(r.lost == 0 for r in results)
            row[contender] = [r.slo_attainment for r in results]

    benchmark.pedantic(replay, rounds=1)
    FAULT_SEED_CELLS[scenario] = row


SHARE = share_scenarios()
SHARE_WINDOWS = (0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5)  # fractions of the SLO's latency
SHARE_CAPS = (16, 32, 64, 128, 256, 512)
SHARE_CELLS: dict[str, dict[str, SimResult | str]] = {}


@pytest.mark.parametrize("scenario", list(SHARE))
def test_replay_share(benchmark: Any, scenario: str) -> None:
    """Issue 27: one batch takes a large share of the SLO (slow models, a tight SLO, noisy
    service). Ours with and without shedding, Triton-like, and the cost oracle of a grid of
    windows scaled to the SLO."""
    case = SHARE[scenario]
    row: dict[str, SimResult | str] = {}

    def replay() -> None:
        for contender in (ADAPTIVE, ADAPTIVE_NO_SHED, "triton_like"):
            row[contender] = run(case, CONTENDERS[contender](case))
        windows = tuple(f * case.slo.latency_ms for f in SHARE_WINDOWS)
        oracle = cost_oracle(static_grid(case, windows_ms=windows, caps=SHARE_CAPS))
        if oracle is not None:
            row["cost_oracle"], row["cost_oracle_label"] = oracle.result, oracle.label

    benchmark.pedantic(replay, rounds=1)
    SHARE_CELLS[scenario] = row
    for contender in (ADAPTIVE, ADAPTIVE_NO_SHED, "triton_like"):
        result = row[contender]
        assert isinstance(result, SimResult) and result.lost == 0


# misses recorded when issue 27 landed: the case, the cost ratio it may not exceed (its figure
# then, plus 2 %), and why (a known miss is reported as MISS; beyond its limit it is a FAIL).
# None since the measured slack (docs/policies.md): resnet50_slo20_poisson_90 was one, at 1.19x.
KNOWN_SHARE_MISSES: dict[str, tuple[float, str]] = {}


def _share_verdicts() -> list[str]:
    """Attainment >= 99.5 % at <= 1.15x the cost oracle's device time, with and without
    shedding (issue 27's targets); a known miss must stay within its recorded figure."""
    out = []
    for name, row in SHARE_CELLS.items():
        oracle = row.get("cost_oracle")
        if not isinstance(oracle, SimResult):
            out.append(f"FAIL {name}: no static setting meets the SLO")
            continue
        for contender in (ADAPTIVE, ADAPTIVE_NO_SHED):
            ours = row[contender]
            assert isinstance(ours, SimResult)
            ratio = ours.device_ms_per_request / oracle.device_ms_per_request
            ok = ours.slo_attainment >= 0.995 and ratio <= 1.15
            tag = _tag(ok)
            if not ok and name in KNOWN_SHARE_MISSES:
                limit, why = KNOWN_SHARE_MISSES[name]
                known = ours.slo_attainment >= 0.995 and ratio <= limit
                tag = f"MISS (known, <= {limit:g}x: {why})" if known else tag
            out.append(
                f"{tag} {name} ({contender}): SLO attainment {ours.slo_attainment:.4f} "
                f"(>= 0.995), device cost {ratio:.3f}x the cost oracle (<= 1.15; "
                f"{row['cost_oracle_label']}), p99 {ours.p99_ms:.1f} ms"
            )
    return out


def test_targets() -> None:
    """Write the report, then check the targets on the cells that ran."""
    assert CELLS or SHARE_CELLS, "run the replay cells first (the whole file)"
    order = list(SCENARIOS)
    cells = sorted(CELLS.values(), key=lambda c: (order.index(c.scenario), c.contender))
    RESULTS_DIR.mkdir(exist_ok=True)
    verdicts = _verdicts()
    text = comparison_markdown(cells) + "\n" + "\n".join(f"- {v}" for v in verdicts) + "\n"
    (RESULTS_DIR / "replay.md").write_text(text)
    if cells:
        plot_goodput(cells, RESULTS_DIR / "replay_goodput.png")
    shown_contenders = (ADAPTIVE, "triton_like", "bentoml_cork", "best_static")
    for scenario in SCENARIOS:
        shown = {
            c.contender: c.result
            for c in cells
            if c.scenario == scenario and c.contender in shown_contenders
        }
        if shown:
            plot_timeseries(
                shown,
                RESULTS_DIR / f"replay_{scenario}.png",
                slo_ms=SCENARIOS[scenario].slo.latency_ms,
                title=scenario,
            )
    print("\n" + text)
    failed = [v for v in verdicts if v.startswith("FAIL")]
    assert not failed, "\n".join(failed)


def _cell(scenario: str, contender: str) -> SimResult | None:
    cell = CELLS.get((scenario, contender))
    return cell.result if cell is not None else None


def _verdicts() -> list[str]:
    out: list[str] = []
    for name in STATIONARY:
        out += _stationary(name)
    for name in OVERLOADED:
        out += _overloaded(name)
    out += _light_after_overload("overload_then_light")
    for name in NOISY:
        out += _noise(name)
    for name in FAULTED:
        out += _fault(name)
    out += _bandits("poisson_30_long")
    out += _earlier_targets()
    out += _share_verdicts()
    return out


def _stationary(name: str) -> list[str]:
    ours, oracle = _cell(name, ADAPTIVE), _cell(name, "cost_oracle")
    if ours is None or oracle is None:
        return []
    slo = SCENARIOS[name].slo
    ratio = ours.device_ms_per_request / oracle.device_ms_per_request
    ok = ours.slo_attainment >= 0.995 and ratio <= 1.15 and ours.p99_ms <= slo.latency_ms
    return [
        f"{_tag(ok)} {name}: SLO attainment {ours.slo_attainment:.4f} (>= 0.995), device cost "
        f"{ratio:.3f}x the cost oracle (<= 1.15), p99 {ours.p99_ms:.1f} ms (<= {slo.latency_ms:g})"
    ]


def _overloaded(name: str) -> list[str]:
    ours, static = _cell(name, ADAPTIVE), _cell(name, "best_static_shed")
    if ours is None or static is None:
        return []
    goodput = ours.goodput_rps / static.goodput_rps
    cost = ours.device_ms_per_good / static.device_ms_per_good
    ok = goodput >= 0.98 and cost <= 1.1
    return [
        f"{_tag(ok)} {name}: goodput {goodput:.3f}x the best static with shedding (>= 0.98), "
        f"device cost per answer within the SLO {cost:.3f}x its (<= 1.10)"
    ]


def _light_after_overload(name: str) -> list[str]:
    ours, case = _cell(name, ADAPTIVE), SCENARIOS[name]
    if ours is None or case.light_from_s is None:
        return []
    light = ours.phase(case.light_from_s, math.inf, case.slo)
    ok = light.shed_fraction < 0.005 and light.slo_attainment >= 0.99
    return [
        f"{_tag(ok)} {name}: in the light phase {light.shed_fraction:.3%} shed (< 0.5 %), "
        f"SLO attainment {light.slo_attainment:.4f} (>= 0.99)"
    ]


def _noise(name: str) -> list[str]:
    triton, static = _cell(name, "triton_like"), _cell(name, "best_static")
    if triton is None or static is None:
        return []
    out = []
    for contender in (ADAPTIVE, ADAPTIVE_NO_SHED):
        ours = _cell(name, contender)
        if ours is None:
            continue
        below_triton = triton.slo_attainment - ours.slo_attainment
        below_static = static.slo_attainment - ours.slo_attainment
        low_ticks = _ticks_below_stability_cap(SCENARIOS[name], ours)
        ok = below_triton <= 0.0001 and below_static <= 0.01 and (low_ticks or 0) <= 1
        out.append(
            f"{_tag(ok)} {name} ({contender}): SLO attainment {ours.slo_attainment:.4f}, "
            f"Triton-like {triton.slo_attainment:.4f} (never below, to 0.01 points), best "
            f"static {static.slo_attainment:.4f} (within 1 point); "
            f"{_describe_low(low_ticks)}"
        )
    return out


def _fault(name: str) -> list[str]:
    """Issue 21's targets for a fault replayed: attainment never below Triton-like's (on the
    mean of seed 0 and ``FAULT_SEEDS``, each seed's difference shown), within 1 point of the
    best static setting's on seed 0 (with shedding, for the contender that sheds), and the cap
    below the stability cap for at most ``AFTER_FAULT_S`` once the fault is over."""
    triton = _cell(name, "triton_like")
    case = SCENARIOS[name]
    out = []
    for contender, static_name in (
        (ADAPTIVE, "best_static_shed"),
        (ADAPTIVE_NO_SHED, "best_static"),
    ):
        ours, static = _cell(name, contender), _cell(name, static_name)
        seeds = FAULT_SEED_CELLS.get(name, {})
        if ours is None or triton is None or static is None or contender not in seeds:
            continue
        ours_all = [ours.slo_attainment, *seeds[contender]]
        triton_all = [triton.slo_attainment, *seeds["triton_like"]]
        diffs = [a - b for a, b in zip(ours_all, triton_all, strict=True)]
        below_triton = -sum(diffs) / len(diffs)
        below_static = static.slo_attainment - ours.slo_attainment
        low_s = _seconds_below_stability_cap(case, ours)
        ok = below_triton <= 0.0001 and below_static <= 0.01 and low_s <= AFTER_FAULT_S
        shown = " ".join(f"{100 * d:+.2f}" for d in diffs)
        out.append(
            f"{_tag(ok)} {name} ({contender}): SLO attainment {fmean(ours_all):.4f} over "
            f"{len(diffs)} seeds, Triton-like {fmean(triton_all):.4f} (never below, to 0.01 "
            f"points; ours - Triton-like by seed, points: {shown}); seed 0: "
            f"{ours.slo_attainment:.4f}, {static_name} {static.slo_attainment:.4f} (within 1 "
            f"point); after the fault {low_s:.2f} s below the stability cap "
            f"(<= {AFTER_FAULT_S:g})"
        )
    return out


def _seconds_below_stability_cap(case: Scenario, result: SimResult) -> float:
    """The longest span, after the scenario's faults end, that the cap spent below the
    smallest cap keeping up with its mean rate (measured table, no headroom), seconds."""
    stable = _stability_cap(case)
    decisions = result.series.decisions
    if stable is None or case.faults is None or not decisions.size:
        return 0.0
    longest, since = 0.0, None
    for at_s, _, cap in decisions[decisions[:, 0] >= case.faults.end_s]:
        if cap < stable:
            since = at_s if since is None else since
            longest = max(longest, at_s - since)
        else:
            since = None
    return longest


def _stability_cap(case: Scenario) -> int | None:
    if case.rate_rps is None or not case.warmup:
        return None
    keeping_up = [n for n, ms in case.warmup if n / (ms / 1e3) >= case.rate_rps]
    return min(keeping_up) if keeping_up else None


def _ticks_below_stability_cap(case: Scenario, result: SimResult) -> int | None:
    """Consecutive ticks the cap spent below what keeps up with the scenario's mean rate
    (measured table, no headroom), at most; None when the scenario has no single rate."""
    stable = _stability_cap(case)
    if stable is None:
        return None
    longest = run_length = 0
    for cap in result.series.decisions[:, 2]:
        run_length = run_length + 1 if cap < stable else 0
        longest = max(longest, run_length)
    return longest


def _describe_low(ticks: int | None) -> str:
    if ticks is None:
        return "the load varies: no single stability cap"
    return f"at most {ticks} tick(s) in a row below the stability cap (<= 1)"


def _bandits(name: str) -> list[str]:
    out = []
    for contender in BANDITS:
        result = _cell(name, contender)
        if result is None:
            continue
        after = result.phase(5.0, math.inf, SCENARIOS[name].slo)
        ok = after.shed_fraction < 0.01
        out.append(
            f"{_tag(ok)} {name} ({contender}): {after.shed_fraction:.3%} shed after 5 s of "
            f"learning (< 1 %), {result.expired / result.requests:.3%} over the whole run"
        )
    return out


def _earlier_targets() -> list[str]:
    out = []
    step = _cell("step_3x", ADAPTIVE)
    if step is not None:
        case = SCENARIOS["step_3x"]
        assert case.step_at_s is not None
        recovery = step.recovery_time_s(case.step_at_s, case.slo.latency_ms)
        ok = not math.isnan(recovery) and recovery <= 2.0
        out.append(f"{_tag(ok)} step_3x: p99 back under the SLO {recovery:.2f} s after the step")
    squeezed = [c.result.lost for c in CELLS.values() if c.scenario == "memory_squeeze"]
    if squeezed:
        out.append(f"{_tag(sum(squeezed) == 0)} memory_squeeze: {sum(squeezed)} requests lost")
    return out


def _tag(ok: bool) -> str:
    return "PASS" if ok else "FAIL"

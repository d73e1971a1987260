"""Real-time faults (issue 21): the controller against static settings, in process and behind
the README's FastAPI app, interleaved run by run.

In process (``realtime_faults.py``): each fault case, ``ROUNDS`` rounds; in each round every
contender runs once (the order rotates from round to round, so drift in the machine's load
reaches all alike): ours (SLO p99 60 ms with shedding), static windows 0, 5 and 20 ms, all at
cap 128. Targets: ours answers at least as many requests within the SLO as static window 0, up
to chance (``chance.py``), in all but one round and in total, at no more device time per
request. The best static setting
(the most answers within the SLO over the rounds, in hindsight) is reported beside them.

The FastAPI app (``fastapi_faults.py``): see ``test_fastapi_stall``. Closed-loop clients in
process (``closed_loop.py``): see ``test_closed_loop_clients``.

Run: ``python -m pytest benchmarks/test_realtime_faults.py`` on a quiet machine (about 40 min;
``ADAPTIVE_BATCHER_FAULT_ROUNDS`` sets the rounds, default 5). Results, with the machine's load
average, go to ``benchmarks/results/realtime_faults*.md`` and the window and cap over time to
``benchmarks/results/realtime_<case>.png``.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from benchmarks.chance import no_worse_beyond_chance
from benchmarks.conftest import RESULTS_DIR, report_lines
from benchmarks.realtime_faults import CASES, CONTENDERS, Model, RunResult, run_case

ROUNDS = int(os.environ.get("ADAPTIVE_BATCHER_FAULT_ROUNDS", "5"))


def _table(name: str, results: list[RunResult]) -> list[str]:
    case = CASES[name]
    lines = [
        f"### {name}: {case.description} ({case.model} model, {case.rate_rps:g} req/s)",
        "",
        "| contender | within SLO, per round | total | p99 ms (median run) | mean batch "
        "| device ms/req | cap back after (s) | load avg |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for contender in CONTENDERS:
        runs = sorted((r for r in results if r.contender == contender.name), key=_round)
        p99 = sorted(r.p99_ms for r in runs)[len(runs) // 2]
        device = sum(r.device_ms_per_request for r in runs) / len(runs)
        batch = sum(r.mean_batch for r in runs) / len(runs)
        recovery = (
            ", ".join(f"{r.cap_recovery_s():.1f}" for r in runs) if contender.adaptive else "-"
        )
        loads = ", ".join(f"{r.load_average:.1f}" for r in runs)
        lines.append(
            f"| {contender.name} | {' / '.join(str(r.within_slo) for r in runs)} "
            f"| {sum(r.within_slo for r in runs)} | {p99:.1f} | {batch:.1f} | {device:.3f} "
            f"| {recovery} | {loads} |"
        )
    return lines


def _round(result: RunResult) -> int:
    return result.round


def _plot(name: str, results: list[RunResult]) -> None:
    from adaptive_batcher._optional import agg_figure

    figure = agg_figure("realtime faults", figsize=(9, 5))
    window_ax, cap_ax = figure.subplots(2, 1, sharex=True)
    for result in results:
        if result.round != 0 or not result.timeline:
            continue
        times = [t for t, _, _ in result.timeline]
        window_ax.step(
            times, [w for _, w, _ in result.timeline], where="post", label=result.contender
        )
        cap_ax.step(times, [c for _, _, c in result.timeline], where="post", label=result.contender)
    for axis in (window_ax, cap_ax):
        axis.axvline(4.0, color="grey", linestyle=":", linewidth=1)
    window_ax.set_ylabel("window, ms")
    cap_ax.set_ylabel("batch cap")
    cap_ax.set_xlabel("time, s (the fault starts at the dotted line)")
    window_ax.legend(fontsize=7)
    window_ax.set_title(f"{name}: {CASES[name].description} (round 1)")
    figure.tight_layout()
    RESULTS_DIR.mkdir(exist_ok=True)
    figure.savefig(RESULTS_DIR / f"realtime_{name}.png", dpi=100)


@pytest.mark.parametrize("name", list(CASES))
def test_realtime_fault(benchmark: Any, name: str) -> None:
    case = CASES[name]
    model = Model(case.model)
    results: list[RunResult] = []

    def runs() -> None:
        for index in range(ROUNDS):
            shift = index % len(CONTENDERS)
            for contender in CONTENDERS[shift:] + CONTENDERS[:shift]:
                results.append(run_case(case, contender, model, seed=index))

    benchmark.pedantic(runs, rounds=1, iterations=1)
    lines = _table(name, results)
    ours = {r.round: r for r in results if r.contender == "ours"}
    window0 = {r.round: r for r in results if r.contender == "static_0"}
    # the same arrivals, but a run's end may cut one more or one fewer of them: the larger
    offered_in = {i: max(ours[i].submitted, window0[i].submitted) for i in range(ROUNDS)}
    wins = sum(
        no_worse_beyond_chance(ours[i].within_slo, window0[i].within_slo, offered_in[i])
        for i in range(ROUNDS)
    )
    total_ours = sum(r.within_slo for r in ours.values())
    total_0 = sum(r.within_slo for r in window0.values())
    offered = sum(offered_in.values())
    device_ours = sum(r.device_ms_per_request for r in ours.values())
    device_0 = sum(r.device_ms_per_request for r in window0.values())
    verdict = (
        f"ours no worse than window 0 within the SLO (beyond chance) in {wins}/{ROUNDS} rounds, "
        f"total {total_ours} vs "
        f"{total_0} ({total_ours / max(total_0, 1):.3f}x); device time per request "
        f"{device_ours / device_0:.2f}x window 0's"
    )
    lines += ["", f"- {verdict}", ""]
    report_lines(f"realtime_faults_{name}", lines)
    _plot(name, results)
    benchmark.extra_info["verdict"] = verdict
    assert all(r.submitted == r.answered + r.errors for r in results), "a request was lost"
    assert wins >= ROUNDS - 1, verdict
    assert no_worse_beyond_chance(total_ours, total_0, offered), verdict
    assert device_ours <= device_0, verdict


FASTAPI_CONTENDERS: tuple[tuple[str, float | None], ...] = (
    ("ours", None),
    ("static_0", 0.0),
    ("static_5", 5.0),
)


def test_fastapi_stall(benchmark: Any) -> None:
    """The README's app under 16 closed-loop HTTP clients: a 20 MB body at 3 s (413 at once,
    the loop never late by more than 50 ms), then a blocking call that stalls the loop for
    20 s at 8 s. Targets, in every run: ours' cap is back at its pre-stall value within 5 s
    of the stall's end, and it answers at least as many requests within the SLO as static
    window 0 and as the best static setting less 1 %."""
    from benchmarks.fastapi_faults import STALL_S, HttpRun, http_run

    runs: list[HttpRun] = []

    def serve() -> None:
        for index in range(ROUNDS):
            shift = index % len(FASTAPI_CONTENDERS)
            order = FASTAPI_CONTENDERS[shift:] + FASTAPI_CONTENDERS[:shift]
            for name, window_ms in order:
                runs.append(http_run(name, window_ms, index))

    benchmark.pedantic(serve, rounds=1, iterations=1)
    lines = [
        f"### FastAPI app: 20 MB body, then a {STALL_S:g} s loop stall, 16 clients",
        "",
        "| round | contender | within SLO | answered 200 | big body: status, s, worst lag ms "
        "| cap back after (s) | load avg |",
        "|---|---|---|---|---|---|---|",
    ]
    by_round: dict[int, dict[str, HttpRun]] = {}
    for run in sorted(runs, key=lambda r: (r.round, r.contender)):
        by_round.setdefault(run.round, {})[run.contender] = run
        recovery = f"{run.cap_recovery_s():.1f}" if run.contender == "ours" else "-"
        lines.append(
            f"| {run.round + 1} | {run.contender} | {run.within_slo} | {run.ok} "
            f"| {run.big_body_status}, {run.big_body_s:.2f}, {run.max_lag_ms:.1f} "
            f"| {recovery} | {run.load_average:.1f} |"
        )
    failures = []
    for index, by_name in by_round.items():
        ours = by_name["ours"]
        best = max(r.within_slo for name, r in by_name.items() if name != "ours")
        if not ours.cap_recovery_s() <= 5.0:
            failures.append(f"round {index + 1}: cap back after {ours.cap_recovery_s():.1f} s")
        if ours.within_slo < by_name["static_0"].within_slo or ours.within_slo < 0.99 * best:
            failures.append(f"round {index + 1}: {ours.within_slo} within the SLO, best {best}")
        for run in by_name.values():
            if run.big_body_status != 413 or not run.max_lag_ms <= 50.0:
                status = run.big_body_status
                failures.append(f"round {index + 1} {run.contender}: big body {status}")
    lines += ["", *(f"- FAIL {f}" for f in failures)] if failures else ["", "- all targets met"]
    report_lines("realtime_faults_fastapi", lines)
    assert not failures, "\n".join(lines)


def test_closed_loop_clients(benchmark: Any) -> None:
    """16 closed-loop clients whose requests reach the batcher spread over 2-40 ms (as HTTP
    parsing spreads them): ours against static window 0, ``ROUNDS`` rounds, the order
    alternating. Target: ours answers at least 0.9x as many requests as window 0 in total (the
    window throttles such clients; the probes that find it out cost a few batches each)."""
    from benchmarks.closed_loop import ClosedLoopRun, closed_loop_run

    runs: list[ClosedLoopRun] = []

    def serve() -> None:
        for index in range(ROUNDS):
            contenders = (("ours", None), ("static_0", 0.0))
            for name, window_ms in contenders if index % 2 == 0 else contenders[::-1]:
                runs.append(closed_loop_run(name, window_ms, index))

    benchmark.pedantic(serve, rounds=1, iterations=1)
    from benchmarks.realtime_faults import load_average

    lines = [
        "### Closed-loop clients: 16, each 2-40 ms outside the batcher per request",
        "",
        f"load average after the runs: {load_average():.1f}",
        "",
        "| round | contender | answers | batcher p50 ms | mean batch | decisions by reason |",
        "|---|---|---|---|---|---|",
    ]
    for run in sorted(runs, key=lambda r: (r.round, r.contender)):
        lines.append(
            f"| {run.round + 1} | {run.contender} | {run.answers} | {run.inside_p50_ms:.1f} "
            f"| {run.mean_batch:.2f} | {run.reasons} |"
        )
    ours = sum(r.answers for r in runs if r.contender == "ours")
    static = sum(r.answers for r in runs if r.contender == "static_0")
    verdict = f"ours / window 0 answers: {ours / static:.3f}"
    lines += ["", f"- {verdict}"]
    report_lines("realtime_faults_closed_loop", lines)
    assert ours >= 0.9 * static, "\n".join(lines)


@pytest.mark.parametrize("slo_ms", [5.0, 10.0, 20.0])
def test_tight_slo(benchmark: Any, slo_ms: float) -> None:
    """A fast model (the README's, 0.03 ms a batch, on the loop) under Poisson 3,000 req/s
    with an SLO of 5, 10 or 20 ms at p99: the event loop's own latency and the controller's
    tick are a large share of it. Ours against static windows 0 and 1 ms, ``ROUNDS`` rounds,
    the order rotating. Target: ours keeps its SLO (at least 99 % of the requests within it)
    in all but one round; reported beside: the static windows' shares, and the controller's
    tick (mean and worst, ms)."""
    from benchmarks.realtime_faults import load_average
    from benchmarks.tight_slo import CONTENDERS as TIGHT
    from benchmarks.tight_slo import TightRun, rotated_runs

    runs: list[TightRun] = []
    benchmark.pedantic(lambda: runs.extend(rotated_runs(slo_ms, ROUNDS)), rounds=1, iterations=1)
    lines = [
        f"### Tight SLO: p99 {slo_ms:g} ms, the README's model, Poisson 3,000 req/s",
        "",
        f"load average after the runs: {load_average():.1f}",
        "",
        "| contender | within the SLO, per round | p99 ms, per round | tick ms, mean / worst |",
        "|---|---|---|---|",
    ]
    for name, _ in TIGHT:
        mine = sorted((r for r in runs if r.contender == name), key=lambda r: r.round)
        ticks = [t for r in mine for t in r.ticks_ms]
        tick = f"{sum(ticks) / len(ticks):.2f} / {max(ticks):.2f}" if ticks else "-"
        lines.append(
            f"| {name} | {' / '.join(f'{r.within_share:.4f}' for r in mine)} "
            f"| {' / '.join(f'{r.p99_ms:.1f}' for r in mine)} | {tick} |"
        )
    kept = sum(r.within_share >= 0.99 for r in runs if r.contender == "ours")
    verdict = f"ours kept its SLO in {kept}/{ROUNDS} rounds"
    lines += ["", f"- {verdict}"]
    report_lines(f"realtime_tight_slo_{slo_ms:g}ms", lines)
    assert kept >= ROUNDS - 1, "\n".join(lines)


def test_pausing_model(benchmark: Any) -> None:
    """The README's model pausing 8 ms on every 20th call (run in a thread), SLO p99 10 ms,
    Poisson 1,500 req/s: the batch a p99 request rides is out of the SLO's reach at any window
    once the loop's lag is set aside, and the narrowest window answers the most. Ours against
    static windows 0 and 1 ms, ``ROUNDS`` rounds, the order rotating. Target: ours above
    window 1 ms in every round and within two points of window 0 in all but one (window 0
    still answers more: docs/benchmarks.md, "The batch a p99 request rides, priced as a
    pause")."""
    from benchmarks.tight_slo import CONTENDERS as TIGHT
    from benchmarks.tight_slo import Pauses, TightRun, rotated_runs

    runs: list[TightRun] = []
    slo_ms = 10.0
    benchmark.pedantic(
        lambda: runs.extend(rotated_runs(slo_ms, ROUNDS, Pauses())), rounds=1, iterations=1
    )
    title = "### A model that pauses 8 ms on every 20th call: p99 10 ms, Poisson 1,500 req/s"
    lines, shares = _pause_table(title, runs, [name for name, _ in TIGHT])
    ours = shares["ours"]
    close = sum(o >= s - 0.02 for o, s in zip(ours, shares["static_0"], strict=True))
    above = sum(o > s for o, s in zip(ours, shares["static_1"], strict=True))
    verdict = (
        f"ours within two points of window 0 in {close}/{ROUNDS} rounds, "
        f"above window 1 ms in {above}/{ROUNDS}"
    )
    lines += ["", f"- {verdict}"]
    report_lines("realtime_pausing_model", lines)
    assert close >= ROUNDS - 1 and above == ROUNDS, "\n".join(lines)


def test_pauses_longer_than_the_slo(benchmark: Any) -> None:
    """The README's model pausing 15 ms on every 20th call (in a thread), SLO p99 10 ms,
    Poisson 1,500 req/s: each pause overruns the SLO by itself, so no window saves its riders,
    and the more calls, the more pauses. Ours against static windows 0 and 5 ms, ``ROUNDS``
    rounds, the order rotating. Target: ours above window 0 in every round (the pauses priced:
    docs/policies.md, "The plan"); the 5 ms window, which still answers more, is reported."""
    from benchmarks.tight_slo import Pauses, TightRun, rotated_runs

    contenders: tuple[tuple[str, float | None], ...] = (
        ("ours", None),
        ("static_0", 0.0),
        ("static_5", 5.0),
    )
    runs: list[TightRun] = []
    pauses = Pauses(pause_ms=15.0)
    benchmark.pedantic(
        lambda: runs.extend(rotated_runs(10.0, ROUNDS, pauses, contenders)),
        rounds=1,
        iterations=1,
    )
    title = "### A model that pauses 15 ms on every 20th call: p99 10 ms, Poisson 1,500 req/s"
    lines, shares = _pause_table(title, runs, [name for name, _ in contenders])
    above = sum(o > s for o, s in zip(shares["ours"], shares["static_0"], strict=True))
    lines += ["", f"- ours above window 0 in {above}/{ROUNDS} rounds"]
    report_lines("realtime_long_pauses", lines)
    assert above == ROUNDS, "\n".join(lines)


def _pause_table(
    title: str, runs: list[Any], contenders: list[str]
) -> tuple[list[str], dict[str, list[float]]]:
    """A report's lines (``title``, the load average, each contender's share within the SLO
    and p99 by round) and the shares by contender, rounds in order, of ``runs`` (TightRun)."""
    from benchmarks.realtime_faults import load_average

    lines = [
        title,
        "",
        f"load average after the runs: {load_average():.1f}",
        "",
        "| contender | within the SLO, per round | p99 ms, per round |",
        "|---|---|---|",
    ]
    shares: dict[str, list[float]] = {}
    for name in contenders:
        mine = sorted((r for r in runs if r.contender == name), key=lambda r: r.round)
        shares[name] = [r.within_share for r in mine]
        lines.append(
            f"| {name} | {' / '.join(f'{r.within_share:.4f}' for r in mine)} "
            f"| {' / '.join(f'{r.p99_ms:.1f}' for r in mine)} |"
        )
    return lines, shares

"""The run's files: one CSV per table, ``phases.csv``, and ``summary.md`` with the targets of
issue 26 checked against the figures (PASS, FAIL, or N/A where a figure is missing)."""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from benchmarks.gpu.config import RunConfig
from benchmarks.gpu.results import COLUMNS, EventCounter, PhaseOutcome, Table, write_csv

__all__ = ["rows_of", "targets", "write_results"]

SAMPLE_COST_LIMIT_US = 50.0
ENERGY_TOLERANCE = 0.10


def rows_of(outcomes: Iterable[PhaseOutcome], name: str) -> list[dict[str, Any]]:
    """Every row of the tables called ``name``."""
    return [row for o in outcomes for t in o.tables if t.name == name for row in t.rows]


def _number(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _verdict(ok: bool | None) -> str:
    return "N/A" if ok is None else ("PASS" if ok else "FAIL")


def _serving(rows: list[dict[str, Any]], rate: float, config: str) -> dict[str, Any] | None:
    for row in rows:
        if _number(row["rate_rps"]) == rate and row["config"] == config and not row["error"]:
            return row
    return None


def targets(outcomes: list[PhaseOutcome], config: RunConfig) -> list[tuple[str, str, str]]:
    """(target, verdict, figures) for each target of issue 26, at this run's rates and SLOs
    (the full run: 6,000 and 2,000 req/s, SLOs 10 and 50 ms)."""
    checks: list[tuple[str, str, str]] = []
    serving = rows_of(outcomes, "serving")
    for suffix in ("", "_graphs") if config.graphs else ("",):
        checks += _serving_targets(serving, config, suffix)
    checks += _telemetry_targets(outcomes)
    squeeze = [row for row in rows_of(outcomes, "squeeze") if row["stage"] == "end"]
    lost = _number(squeeze[-1]["lost"]) if squeeze else math.nan
    checks.append(
        (
            "memory squeeze: no request lost",
            _verdict(None if math.isnan(lost) else lost == 0),
            f"lost {lost:g}",
        )
    )
    return checks


def _serving_targets(
    serving: list[dict[str, Any]], config: RunConfig, suffix: str
) -> list[tuple[str, str, str]]:
    """The latency and energy targets for ours against static window 0, the model eager
    (``suffix`` "") or as CUDA graphs (``"_graphs"``)."""
    checks: list[tuple[str, str, str]] = []
    label = " (CUDA graphs)" if suffix else ""
    if len(config.rates_rps) >= 2 and config.slos_ms:
        rate, slo = config.rates_rps[1], min(config.slos_ms)
        row = _serving(serving, rate, f"ours_slo{slo:g}{suffix}")
        p99 = _number(row["p99_ms"]) if row else math.nan
        checks.append(
            (
                f"{rate:g} req/s, SLO p99 {slo:g} ms: ours{label} p99 <= {slo:g} ms",
                _verdict(None if math.isnan(p99) else p99 <= slo),
                f"p99 {p99:.2f} ms",
            )
        )
    if config.rates_rps and config.slos_ms:
        rate, slo = config.rates_rps[0], max(config.slos_ms)
        ours, static = (
            _serving(serving, rate, f"ours_slo{slo:g}{suffix}"),
            _serving(serving, rate, f"static_w0{suffix}"),
        )
        a = _number(ours["j_per_request"]) if ours else math.nan
        b = _number(static["j_per_request"]) if static else math.nan
        known = not (math.isnan(a) or math.isnan(b))
        checks.append(
            (
                f"J/request at {rate:g} req/s: ours (SLO {slo:g} ms) <= static window 0{label}",
                _verdict(a <= b if known else None),
                f"{a:.4g} J vs {b:.4g} J",
            )
        )
    return checks


def _telemetry_targets(outcomes: list[PhaseOutcome]) -> list[tuple[str, str, str]]:
    readings = rows_of(outcomes, "telemetry_readings")
    costs = [
        row
        for row in rows_of(outcomes, "telemetry_cost")
        if not row["source"].startswith("pynvml") and "[unavailable]" not in row["source"]
    ]
    in_range = [bool(row["in_range"]) for row in readings]
    ratios = [_number(row["energy_ratio"]) for row in readings]
    known_ratios = [r for r in ratios if not math.isnan(r)]
    loop = [_number(r["median_us"]) for r in costs if r["source"] == "TelemetrySampler.latest"]
    known_loop = [m for m in loop if not math.isnan(m)]
    sources = [r for r in costs if r["source"] != "TelemetrySampler.latest"]
    known_medians = [m for r in sources if not math.isnan(m := _number(r["median_us"]))]
    return [
        (
            "telemetry readings within their ranges (0-100 %, free <= total)",
            _verdict(all(in_range) if in_range else None),
            f"{sum(in_range)} of {len(in_range)} states",
        ),
        (
            f"energy counter within {ENERGY_TOLERANCE:.0%} of power x time",
            _verdict(
                all(abs(r - 1.0) <= ENERGY_TOLERANCE for r in known_ratios)
                if known_ratios
                else None
            ),
            "ratios " + ", ".join(f"{r:.3f}" for r in ratios),
        ),
        (
            f"the loop thread's telemetry call (TelemetrySampler.latest) cheaper than "
            f"{SAMPLE_COST_LIMIT_US:g} us (median)",
            _verdict(all(m < SAMPLE_COST_LIMIT_US for m in known_loop) if known_loop else None),
            f"max median {max(known_loop, default=math.nan):.2f} us",
        ),
        (
            "each source's sample(), in the sampler's thread (median; not a target)",
            "info",
            f"max median {max(known_medians, default=math.nan):.1f} us",
        ),
    ]


def _section(lines: list[str], outcomes: list[PhaseOutcome], phase: str, title: str) -> None:
    found = [o for o in outcomes if o.phase == phase]
    if not found:
        return
    outcome = found[0]
    lines += ["", f"## {title}", ""]
    if outcome.detail:
        lines += [outcome.detail, ""]
    lines += [f"- {note}" for note in outcome.notes]
    for table in outcome.tables:
        lines += ["", f"`{table.name}.csv`", "", *table.markdown()]


def summary_lines(
    outcomes: list[PhaseOutcome],
    config: RunConfig,
    platform: str,
    events: EventCounter,
    started: float,
) -> list[str]:
    """The whole of ``summary.md``."""
    env = {row["key"]: row["value"] for row in rows_of(outcomes, "environment")}
    phases = Table("phases")
    for outcome in outcomes:
        phases.add(
            phase=outcome.phase,
            status=outcome.status,
            seconds=outcome.seconds,
            detail=outcome.detail,
        )
    lines = [
        f"# GPU check ({platform}), {time.strftime('%Y-%m-%d %H:%M:%S %Z')}",
        "",
        f"Machine: {env.get('gpu_name', '?')}, driver {env.get('driver', '?')}, torch "
        f"{env.get('torch', '?')} (CUDA {env.get('torch_cuda', '?')}); budget "
        f"{config.budget_s:g} s, {time.monotonic() - started:.0f} s used.",
    ]
    if platform != "cuda":
        lines += ["", "Dry run: the figures come from fakes and the CPU; they measure nothing."]
    lines += ["", "## Phases", "", *phases.markdown(), "", "## Targets (issue 26)", ""]
    if platform != "cuda":
        lines += [
            "At the dry run's tiny rates and sizes, against fakes: a verdict here checks the "
            "report's arithmetic, not the library (a FAIL is no failure of the device's).",
            "",
        ]
    lines += ["| target | verdict | figures |", "|---|---|---|"]
    lines += [f"| {t} | {v} | {f} |" for t, v, f in targets(outcomes, config)]
    for phase, title in (
        ("environment", "Environment"),
        ("telemetry", "Telemetry"),
        ("serving", "Serving: resnet behind AdaptiveBatcher, Poisson load"),
        ("squeeze", "Memory squeeze"),
        ("llm", "Decoder step times"),
    ):
        _section(lines, outcomes, phase, title)
    lines += ["", "## Library log events (warning and above)", ""]
    lines += [f"- {level} `{name}`: {n}" for (level, name), n in sorted(events.counts.items())]
    lines += [f"- e.g. {example}" for example in events.examples[:10]]
    failures = [o for o in outcomes if o.traceback]
    if failures:
        lines += ["", "## Tracebacks"]
        for outcome in failures:
            lines += ["", f"### {outcome.phase}", "", "```", outcome.traceback.rstrip(), "```"]
    return lines


def write_results(
    out: Path,
    outcomes: list[PhaseOutcome],
    config: RunConfig,
    platform: str,
    events: EventCounter,
    started: float,
) -> None:
    """Write every file (the tables so far; the others with their header only)."""
    out.mkdir(parents=True, exist_ok=True)
    write_csv(
        out / "phases.csv",
        COLUMNS["phases"],
        (
            {"phase": o.phase, "status": o.status, "seconds": o.seconds, "detail": o.detail}
            for o in outcomes
        ),
    )
    for name, columns in COLUMNS.items():
        if name != "phases":
            write_csv(out / f"{name}.csv", columns, rows_of(outcomes, name))
    text = "\n".join(summary_lines(outcomes, config, platform, events, started)) + "\n"
    (out / "summary.md").write_text(text, encoding="utf-8")

"""Runs the phases in order, each on its own: a phase that raises is recorded (with its
traceback) and the next one runs; the files are rewritten after every phase, so a run stopped
from outside still leaves what it measured."""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import structlog

from benchmarks.gpu.config import RunConfig
from benchmarks.gpu.context import Context
from benchmarks.gpu.devices import CudaPlatform, DryRunPlatform, Platform
from benchmarks.gpu.environment import run_environment
from benchmarks.gpu.llm import run_llm
from benchmarks.gpu.report import targets, write_results
from benchmarks.gpu.results import EventCounter, PhaseOutcome
from benchmarks.gpu.serving import run_serving
from benchmarks.gpu.squeeze import run_squeeze
from benchmarks.gpu.telemetry import run_telemetry

__all__ = ["PHASE_FUNCTIONS", "run"]

PhaseFunction = Callable[[Context], PhaseOutcome]

PHASE_FUNCTIONS: dict[str, PhaseFunction] = {
    "environment": run_environment,
    "telemetry": run_telemetry,
    "serving": run_serving,
    "squeeze": run_squeeze,
    "llm": run_llm,
}


def _needs_s(phase: str, config: RunConfig) -> float:
    """The least time a phase needs to be worth starting (the decoder adapts to what is left)."""
    return {
        "environment": 1.0,
        "telemetry": config.idle_s + config.load_s + config.load_settle_s + 1.0,
        "serving": config.run_s + config.drain_s,
        "squeeze": config.squeeze_s + 2.0,
        "llm": min(10.0, config.llm_budget_s),
    }[phase]


@contextmanager
def counting_events() -> Iterator[EventCounter]:
    """The library's warnings and errors counted (not printed) while inside; the structlog
    configuration found before is put back after."""
    counter = EventCounter()
    was_configured, previous = structlog.is_configured(), structlog.get_config()
    structlog.configure(
        processors=[counter],
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        cache_logger_on_first_use=False,
    )
    try:
        yield counter
    finally:
        if was_configured:
            structlog.configure(**previous)
        else:
            structlog.reset_defaults()


def _run_phase(ctx: Context, phase: str) -> PhaseOutcome:
    start = time.monotonic()
    if ctx.remaining_s() - ctx.reserve_s < _needs_s(phase, ctx.config):
        outcome = PhaseOutcome(phase, status="skipped", detail="time budget")
    else:
        try:
            outcome = PHASE_FUNCTIONS[phase](ctx)
        except Exception as exc:
            outcome = PhaseOutcome(phase, status="failed", detail=f"{type(exc).__name__}: {exc}")
            outcome.traceback = traceback.format_exc()
    outcome.seconds = time.monotonic() - start
    return outcome


def make_platform(dry_run: bool) -> Platform:
    return DryRunPlatform() if dry_run else CudaPlatform()


def run(config: RunConfig, phases: Sequence[str], out: Path, *, dry_run: bool) -> int:
    """Run ``phases`` and write the results under ``out``; returns 0 when every phase ran
    (fully or cut short by the budget), 1 when one failed."""
    started = time.monotonic()
    outcomes: list[PhaseOutcome] = []
    with counting_events() as events:
        try:
            platform = make_platform(dry_run)
        except Exception as exc:
            failed = PhaseOutcome("platform", status="failed", detail=str(exc))
            failed.traceback = traceback.format_exc()
            write_results(out, [failed], config, "none", events, started)
            print(f"no device: {exc}", flush=True)
            return 1
        with platform.activate():
            ctx = Context(config, platform, events, deadline_s=started + config.budget_s)
            try:
                for index, phase in enumerate(phases):
                    later = phases[index + 1 :]
                    ctx.reserve_s = sum(_needs_s(p, config) for p in later if p != "llm")
                    outcome = _run_phase(ctx, phase)
                    outcomes.append(outcome)
                    print(
                        f"[{time.monotonic() - started:6.1f} s] {phase}: {outcome.status} "
                        f"({outcome.seconds:.1f} s) {outcome.detail}",
                        flush=True,
                    )
                    write_results(out, outcomes, config, platform.name, events, started)
            finally:
                ctx.close()
        write_results(out, outcomes, config, platform.name, events, started)
    for target, verdict, figures in targets(outcomes, config):
        print(f"{verdict:4} {target}: {figures}", flush=True)
    print(f"results: {out}", flush=True)
    return 1 if any(o.status == "failed" for o in outcomes) else 0

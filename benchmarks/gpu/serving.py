"""The serving phase: the ResNet behind ``AdaptiveBatcher`` under Poisson load, four ways.

Contenders, at each rate, in this order (the naive one first, so it meets the coldest
shapes):

* ``naive``: what a first try looks like: a worker thread (``executor="thread"``), the
  library's default 5 ms window, the cap, no buckets, no warm-up.
* ``static_w0``: window 0 (natural batching), the buckets, warmed, the CUDA executor; no
  controller.
* ``ours_slo<N>``: the CUDA executor, the buckets, warmed (``warmup(freeze_gc=...)``), and the
  controller (PID behind the default guards) steering to SLO p99 N ms.

Every batcher samples the run's telemetry; the energy of a run is the NVML energy counter's
difference over the run (every process on the GPU, idle power included).
"""

from __future__ import annotations

import asyncio
import gc
import math
import time
import traceback
from dataclasses import dataclass, replace
from typing import Any

from adaptive_batcher import SLO, AdaptiveBatcher, BatcherStats
from benchmarks.gpu.context import Context, nvml_handle
from benchmarks.gpu.load import LoadRun, poisson_times, quantile_ms
from benchmarks.gpu.results import PhaseOutcome, Table

__all__ = ["Contender", "contenders", "make_batcher", "run_serving"]


@dataclass(frozen=True)
class Contender:
    """One way of serving the model."""

    name: str
    executor: str
    warmed: bool
    buckets: bool
    window_ms: float
    slo_ms: float | None = None
    graphs: bool = False


def contenders(slos_ms: tuple[float, ...], graphs: bool = False) -> list[Contender]:
    """naive, static window 0, then ours at each SLO; with ``graphs``, static window 0 and ours
    again with the model as one CUDA graph per bucket (``_graphs`` after their names)."""
    warmed = [
        Contender("static_w0", "cuda", warmed=True, buckets=True, window_ms=0.0),
        *(
            Contender(
                f"ours_slo{slo:g}", "cuda", warmed=True, buckets=True, window_ms=5.0, slo_ms=slo
            )
            for slo in slos_ms
        ),
    ]
    graphed = [replace(c, name=f"{c.name}_graphs", graphs=True) for c in warmed] if graphs else []
    return [
        Contender("naive", "thread", warmed=False, buckets=False, window_ms=5.0),
        *warmed,
        *graphed,
    ]


def make_batcher(ctx: Context, contender: Contender) -> AdaptiveBatcher[int, Any]:
    """The contender's batcher over the run's ResNet and telemetry."""
    config = ctx.config
    kwargs: dict[str, Any] = {
        "max_batch_size": config.cap if contender.buckets else config.naive_cap,
        "window_ms": contender.window_ms,
        "executor": contender.executor,
        "telemetry": ctx.telemetry,
        "telemetry_hz": config.telemetry_hz,
        "control_interval_ms": config.control_interval_ms,
        "name": contender.name,
    }
    if contender.buckets:
        kwargs["batch_sizes"] = config.buckets
    if contender.slo_ms is not None:
        kwargs["slo"] = SLO(latency_ms=contender.slo_ms)
    if contender.executor == "cuda":
        kwargs["cuda_event_factory"] = ctx.platform.event_factory()
    model = ctx.graphed_resnet()[0] if contender.graphs else ctx.resnet().forward
    return AdaptiveBatcher(model, **kwargs)


async def warm(ctx: Context, batcher: AdaptiveBatcher[int, Any], contender: Contender) -> float:
    """Warm the contender's buckets (not the naive one's: it unfreezes the heap instead);
    returns the seconds it took."""
    start = time.perf_counter()
    if contender.warmed:
        await batcher.warmup(lambda: 0, freeze_gc=ctx.config.freeze_gc)
        ctx.platform.synchronize()
    else:
        gc.unfreeze()
    return time.perf_counter() - start


def energy_j(ctx: Context) -> float:
    """The NVML energy counter now, joules (NaN: unknown), read directly: the run's telemetry
    source reads it at most once a second."""
    try:
        with nvml_handle(ctx) as (nvml, handle):
            return float(nvml.nvmlDeviceGetTotalEnergyConsumption(handle)) / 1e3
    except Exception:
        return math.nan


def _diff(after: float | None, before: float | None) -> float:
    """``after - before``; a ``before`` unknown because the sampler had not read yet (a
    batcher not warmed up starts its sampler at its first request) counts as 0."""
    if after is None:
        return math.nan
    return after - (before or 0.0)


def _gpu(stats: BatcherStats, field: str) -> float | None:
    return None if stats.gpu is None else getattr(stats.gpu, field)


async def serve_once(
    ctx: Context, contender: Contender, rate_rps: float, seed: int
) -> dict[str, Any]:
    """One contender at one rate; returns its ``serving`` row."""
    config = ctx.config
    batcher = make_batcher(ctx, contender)
    try:
        warmup_s = await warm(ctx, batcher, contender)
        run = LoadRun(batcher)
        times = poisson_times(rate_rps, config.run_s, seed)
        before, energy_before = batcher.stats(), energy_j(ctx)
        start = await run.drive(times)
        await run.settle(config.drain_s)
        elapsed_s = asyncio.get_running_loop().time() - start
        after, energy_after = batcher.stats(), energy_j(ctx)
        lost = await run.finish(config.drain_s)
    finally:  # a run that failed must not leave its sampler thread behind
        await batcher.aclose(drain=False, timeout_s=config.drain_s)
    counts, first = after.counts, before.counts
    batches = counts.batches - first.batches
    completed = run.outcomes["completed"]
    energy = energy_after - energy_before
    busy = counts.device_busy_s - first.device_busy_s
    answered = completed + run.outcomes["failed"]
    return {
        "rate_rps": rate_rps,
        "config": contender.name,
        "executor": contender.executor,
        "warmed": contender.warmed,
        "arrivals": len(times),
        "completed": completed,
        "failed": run.outcomes["failed"],
        "rejected": run.outcomes["rejected"],
        "expired": run.outcomes["expired"],
        "lost": lost,
        "throughput_rps": completed / elapsed_s if elapsed_s > 0 else math.nan,
        "p50_ms": quantile_ms(run.latencies_s, 0.5),
        "p99_ms": quantile_ms(run.latencies_s, 0.99),
        "max_ms": quantile_ms(run.latencies_s, 1.0),
        "arrival_lag_p99_ms": quantile_ms(run.lags_s, 0.99),
        "mean_batch": (counts.batch_items - first.batch_items) / batches if batches else math.nan,
        "batches": batches,
        "oom_errors": counts.oom_errors - first.oom_errors,
        "device_busy_s": busy,
        "device_ms_per_request": busy * 1e3 / answered if answered else math.nan,
        "gpu_busy_s": _diff(_gpu(after, "gpu_busy_s"), _gpu(before, "gpu_busy_s")),
        "sm_active_s": _diff(_gpu(after, "sm_active_s"), _gpu(before, "sm_active_s")),
        "energy_j": energy,
        "j_per_request": energy / completed if completed else math.nan,
        "mean_power_w": energy / elapsed_s if elapsed_s > 0 else math.nan,
        "window_ms_end": after.window_ms,
        "cap_end": after.max_batch_size,
        "decisions": after.decisions,
        "warmup_s": warmup_s,
        "error": "",
    }


def run_serving(ctx: Context) -> PhaseOutcome:
    """Every contender at every rate; a run that fails is a row with its error, and the phase
    goes on; runs that would pass the budget are skipped."""
    outcome = PhaseOutcome("serving")
    table = Table("serving")
    outcome.tables.append(table)
    config = ctx.config
    resnet = ctx.resnet()
    outcome.notes.append(f"model: {resnet.source}, built in {resnet.build_s:.1f} s")
    runs = [
        (index, rate, contender)
        for index, rate in enumerate(config.rates_rps)
        for contender in contenders(config.slos_ms, config.graphs)
    ]
    needed_s = config.run_s + config.drain_s
    for seed, rate, contender in runs:  # the same arrivals for every contender at a rate
        if ctx.remaining_s() < needed_s + ctx.reserve_s:
            table.add(rate_rps=rate, config=contender.name, error="skipped: time budget")
            continue
        try:
            table.add(**asyncio.run(serve_once(ctx, contender, rate, seed)))
        except Exception as exc:
            outcome.traceback += traceback.format_exc()
            table.add(rate_rps=rate, config=contender.name, error=f"{type(exc).__name__}: {exc}")
    if ctx.graph_capture_s is not None:
        outcome.notes.append(
            f"CUDA graphs: {len(config.buckets)} captured in {ctx.graph_capture_s:.1f} s"
        )
    errors = [row for row in table.rows if row["error"]]
    if errors:
        outcome.status = (
            "failed" if any(not r["error"].startswith("skipped") for r in errors) else "partial"
        )
    outcome.detail = f"{len(table.rows) - len(errors)} of {len(runs)} runs"
    return outcome

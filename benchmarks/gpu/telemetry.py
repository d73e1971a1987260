"""The telemetry phase: what one reading costs, what the readings say idle and under load, and
whether the energy counter agrees with the power draw integrated over time.

Costs (``telemetry_cost``): each library source's ``sample()`` (``NvmlTelemetry`` without and
with GPM, ``TorchCudaMemory``, the run's ``auto_telemetry()``), ``TelemetrySampler.latest``
(the only telemetry call the event loop makes), and the raw NVML calls beneath (utilization,
memory v2, the energy counter, the power draw), each timed call by call on this thread.

Readings (``telemetry_readings``): ``TelemetrySampler.sample_now()`` of a fresh
``auto_telemetry()`` at ``telemetry_hz`` for ``idle_s`` idle, then for ``load_s`` under the
platform's load (after ``load_settle_s``), with the power draw (``nvmlDeviceGetPowerUsage``)
read beside each. ``energy_counter_j`` is the sampler's ``usage.energy_j`` (NVML's energy
counter from the first reading that has it to the last: ``NvmlTelemetry`` reads the counter at
most once a second); ``power_integral_j`` the trapezoid of the power readings over the same span
(each stamped with its reading's ``time_s``); ``energy_ratio`` their ratio.
"""

from __future__ import annotations

import itertools
import math
import time
import traceback
from collections.abc import Callable
from statistics import fmean
from typing import Any

import numpy as np

from adaptive_batcher.telemetry import (
    NvmlTelemetry,
    Telemetry,
    TelemetrySample,
    TelemetrySampler,
    TorchCudaMemory,
    auto_telemetry,
)
from benchmarks.gpu.context import Context, nvml_handle
from benchmarks.gpu.results import PhaseOutcome, Table

__all__ = ["run_telemetry"]

GIB = 2**30
PERCENT_FIELDS = (
    "gpu_util_pct",
    "mem_util_pct",
    "sm_util_pct",
    "sm_occupancy_pct",
    "tensor_util_pct",
)


def time_calls(fn: Callable[[], Any], calls: int) -> tuple[float, float, float]:
    """(median, p99, mean) of ``calls`` timed calls of ``fn``, microseconds."""
    fn()  # the first call may set things up
    spent = np.empty(calls)
    clock = time.perf_counter_ns
    for index in range(calls):
        start = clock()
        fn()
        spent[index] = clock() - start
    spent /= 1e3
    return float(np.median(spent)), float(np.quantile(spent, 0.99)), float(spent.mean())


def _sources(ctx: Context) -> list[tuple[str, Telemetry]]:
    sources: list[tuple[str, Telemetry]] = []
    plain, gpm = NvmlTelemetry(gpm=False), NvmlTelemetry(gpm=True)
    sources.append(("NvmlTelemetry(gpm=False).sample", plain))
    gpm_name = "NvmlTelemetry(gpm=True).sample"
    sources.append((gpm_name if gpm.gpm_enabled else gpm_name + " [no GPM]", gpm))
    torch_memory = TorchCudaMemory()
    label = "" if torch_memory.available else " [unavailable]"
    sources.append((f"TorchCudaMemory.sample{label}", torch_memory))
    sources.append((f"auto_telemetry().sample [{ctx.telemetry.name}]", ctx.telemetry))
    return sources


def cost_rows(ctx: Context, state: str, table: Table, outcome: PhaseOutcome) -> None:
    """One ``telemetry_cost`` row per source and raw call, in ``state``."""
    calls = ctx.config.cost_samples
    sources = _sources(ctx)
    sampler = TelemetrySampler(ctx.telemetry)
    sampler.sample_now()
    timed: list[tuple[str, Callable[[], Any]]] = [(n, s.sample) for n, s in sources]
    timed.append(("TelemetrySampler.latest", lambda: sampler.latest))
    with nvml_handle(ctx) as (nvml, handle):
        timed += [
            (
                "pynvml.nvmlDeviceGetUtilizationRates",
                lambda: nvml.nvmlDeviceGetUtilizationRates(handle),
            ),
            (
                "pynvml.nvmlDeviceGetMemoryInfo(v2)",
                lambda: nvml.nvmlDeviceGetMemoryInfo(handle, version=nvml.nvmlMemory_v2),
            ),
            (
                "pynvml.nvmlDeviceGetTotalEnergyConsumption",
                lambda: nvml.nvmlDeviceGetTotalEnergyConsumption(handle),
            ),
            ("pynvml.nvmlDeviceGetPowerUsage", lambda: nvml.nvmlDeviceGetPowerUsage(handle)),
        ]
        for name, fn in timed:
            try:
                median, p99, mean = time_calls(fn, calls)
            except Exception as exc:
                outcome.notes.append(f"{state}: {name} failed: {type(exc).__name__}: {exc}")
                median = p99 = mean = math.nan
            table.add(
                source=name, state=state, calls=calls, median_us=median, p99_us=p99, mean_us=mean
            )
    for _, source in sources[:3]:
        source.close()


def _stat(
    readings: list[TelemetrySample], field: str, fold: Callable[[list[float]], float]
) -> float:
    values = [float(v) for r in readings if (v := getattr(r, field)) is not None]
    return fold(values) if values else math.nan


def _in_range(readings: list[TelemetrySample]) -> bool:
    for reading in readings:
        for field in PERCENT_FIELDS:
            value = getattr(reading, field)
            if value is not None and not 0.0 <= value <= 100.0:
                return False
        free, total = reading.mem_free_bytes, reading.mem_total_bytes
        if free is not None and total is not None and not 0 <= free <= total:
            return False
    return True


def _trapezoid(points: list[tuple[float, float]]) -> float:
    total = 0.0
    for (t0, p0), (t1, p1) in itertools.pairwise(points):
        total += (p0 + p1) / 2.0 * (t1 - t0)
    return total


def _counter_span(
    readings: list[TelemetrySample], power: list[tuple[float, float]]
) -> list[tuple[float, float]]:
    """The power points from the first reading with the energy counter to the last one."""
    stamps = [r.time_s for r in readings if r.energy_mj is not None and r.time_s is not None]
    if not stamps:
        return power
    return [(t, w) for t, w in power if stamps[0] <= t <= stamps[-1]]


def readings_row(ctx: Context, state: str, duration_s: float, table: Table) -> None:
    """Readings at ``telemetry_hz`` for ``duration_s``, and the energy check, as one row."""
    source = auto_telemetry()  # fresh: its first reading has the energy counter
    try:
        _readings_row(ctx, state, duration_s, table, source)
    finally:
        source.close()


def _readings_row(
    ctx: Context, state: str, duration_s: float, table: Table, source: Telemetry
) -> None:
    sampler = TelemetrySampler(source)
    period_s = 1.0 / ctx.config.telemetry_hz
    readings: list[TelemetrySample] = []
    power: list[tuple[float, float]] = []
    with nvml_handle(ctx) as (nvml, handle):
        end = time.monotonic() + duration_s
        while True:
            reading = sampler.sample_now()
            try:
                watts = nvml.nvmlDeviceGetPowerUsage(handle) / 1e3
            except Exception:
                watts = math.nan
            readings.append(reading)
            # stamped with the reading's time (taken just before its energy counter read), so
            # the integral spans what the counter does
            stamp = time.monotonic() if reading.time_s is None else reading.time_s
            power.append((stamp, watts))
            if stamp >= end:
                break
            time.sleep(period_s)
    usage = sampler.usage
    integral = _trapezoid(_counter_span(readings, power))
    counter = math.nan if usage.energy_j is None else usage.energy_j
    table.add(
        state=state,
        readings=len(readings),
        span_s=usage.span_s,
        gpu_util_mean_pct=_stat(readings, "gpu_util_pct", fmean),
        gpu_util_max_pct=_stat(readings, "gpu_util_pct", max),
        mem_util_mean_pct=_stat(readings, "mem_util_pct", fmean),
        sm_util_mean_pct=_stat(readings, "sm_util_pct", fmean),
        sm_util_max_pct=_stat(readings, "sm_util_pct", max),
        sm_occupancy_mean_pct=_stat(readings, "sm_occupancy_pct", fmean),
        tensor_util_mean_pct=_stat(readings, "tensor_util_pct", fmean),
        tensor_util_max_pct=_stat(readings, "tensor_util_pct", max),
        free_min_gib=_stat(readings, "mem_free_bytes", min) / GIB,
        power_mean_w=fmean(w for _, w in power),
        energy_counter_j=counter,
        power_integral_j=integral,
        energy_ratio=counter / integral if integral > 0 else math.nan,
        in_range=_in_range(readings),
    )


def run_telemetry(ctx: Context) -> PhaseOutcome:
    """Costs and readings idle, then both again under load."""
    outcome = PhaseOutcome("telemetry")
    costs, readings = Table("telemetry_cost"), Table("telemetry_readings")
    outcome.tables += [costs, readings]
    config = ctx.config
    steps: list[tuple[str, Callable[[], None]]] = [
        ("idle costs", lambda: cost_rows(ctx, "idle", costs, outcome)),
        ("idle readings", lambda: readings_row(ctx, "idle", config.idle_s, readings)),
    ]
    for name, step in steps:
        _step(outcome, name, step)
    try:
        with ctx.platform.load():
            time.sleep(config.load_settle_s)
            _step(
                outcome, "load readings", lambda: readings_row(ctx, "load", config.load_s, readings)
            )
            _step(outcome, "load costs", lambda: cost_rows(ctx, "load", costs, outcome))
    except Exception:
        outcome.status = "failed"
        outcome.traceback += traceback.format_exc()
    nvml = NvmlTelemetry()
    outcome.detail = f"gpm={nvml.gpm_enabled} nvml={nvml.available}"
    nvml.close()
    return outcome


def _step(outcome: PhaseOutcome, name: str, step: Callable[[], None]) -> None:
    """Run one part of the phase; a failure is recorded and the next part runs."""
    try:
        step()
    except Exception:
        outcome.status = "failed"
        outcome.traceback += f"{name}:\n{traceback.format_exc()}"

"""Energy and busy time from the readings: NVML's energy counter, utilization integrals."""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

import pytest

from adaptive_batcher import SLO, AdaptiveBatcher
from adaptive_batcher.telemetry import (
    NvmlTelemetry,
    TelemetrySample,
    TelemetrySampler,
    TelemetryUsage,
)
from adaptive_batcher.testing import FakePynvml, FakeTelemetry
from tests.telemetry._helpers import warnings_named

Logs = list[MutableMapping[str, Any]]


def test_nvml_reads_the_energy_counter(fake_nvml: FakePynvml) -> None:
    nvml = NvmlTelemetry(clock=lambda: 1.0, energy_interval_s=0.0)
    assert nvml.sample().energy_mj == 123_456_789
    fake_nvml.energy_mj += 2_500
    assert nvml.sample().energy_mj == 123_459_289


def test_nvml_reads_the_energy_counter_at_most_once_an_interval(fake_nvml: FakePynvml) -> None:
    now = [10.0]
    nvml = NvmlTelemetry(clock=lambda: now[0])  # the default: once a second
    readings = []
    for _ in range(20):  # 2.5 s at 8 Hz (steps exact in binary)
        readings.append(nvml.sample())
        now[0] += 0.125
    read_at = [r.time_s for r in readings if r.energy_mj is not None]
    assert read_at == pytest.approx([10.0, 11.0, 12.0])
    assert fake_nvml.calls["nvmlDeviceGetTotalEnergyConsumption"] == 3
    assert all(r.gpu_util_pct == 99.0 for r in readings)  # the cheap fields every time


@pytest.mark.parametrize("bad", [-0.1, float("nan"), float("inf")])
def test_a_bad_energy_interval_is_refused(fake_nvml: FakePynvml, bad: float) -> None:
    with pytest.raises(ValueError, match="energy_interval_s"):
        NvmlTelemetry(energy_interval_s=bad)


def test_a_gpu_without_an_energy_counter_is_asked_once_and_not_logged(
    monkeypatch: pytest.MonkeyPatch, logs: Logs
) -> None:
    import sys

    fake = FakePynvml(energy_supported=False)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    nvml = NvmlTelemetry(clock=lambda: 1.0)
    readings = [nvml.sample() for _ in range(3)]
    assert all(r.energy_mj is None for r in readings)
    assert all(r.gpu_util_pct == 99.0 for r in readings)  # the rest still reads
    assert fake.calls["nvmlDeviceGetTotalEnergyConsumption"] == 1
    assert warnings_named(logs, "telemetry.unavailable") == []


def reading(t: float, gpu: float | None, sm: float | None, energy: int | None) -> TelemetrySample:
    return TelemetrySample(time_s=t, gpu_util_pct=gpu, sm_util_pct=sm, energy_mj=energy)


def test_usage_integrates_the_readings_by_trapezoids() -> None:
    source = FakeTelemetry(
        [
            reading(10.0, 40.0, None, 1_000_000),
            reading(10.5, 60.0, 30.0, 1_150_000),
            reading(11.5, 100.0, 50.0, 1_450_000),
        ]
    )
    sampler = TelemetrySampler(source)
    assert sampler.usage == TelemetryUsage()  # nothing read yet
    for _ in range(3):
        sampler.sample_now()
    usage = sampler.usage
    assert usage.span_s == pytest.approx(1.5)
    assert usage.energy_j == pytest.approx(450.0)  # 1,450,000 - 1,000,000 mJ
    # (40 + 60) / 2 % for 0.5 s, then (60 + 100) / 2 % for 1 s: 0.25 + 0.8 s
    assert usage.gpu_busy_s == pytest.approx(1.05)
    # GPM starts at the second reading: (30 + 50) / 2 % for 1 s
    assert usage.sm_active_s == pytest.approx(0.4)


def test_usage_takes_the_energy_from_the_readings_that_have_the_counter() -> None:
    source = FakeTelemetry(
        [
            reading(10.0, 50.0, None, 1_000_000),
            reading(10.5, 50.0, None, None),
            reading(11.0, 50.0, None, 1_300_000),
            reading(11.5, 50.0, None, None),
        ]
    )
    sampler = TelemetrySampler(source)
    for _ in range(4):
        sampler.sample_now()
    usage = sampler.usage
    assert usage.span_s == pytest.approx(1.5)
    assert usage.energy_j == pytest.approx(300.0)  # 10.0 s to 11.0 s, the counter's own span


def test_usage_is_unknown_where_the_readings_are() -> None:
    source = FakeTelemetry([reading(1.0, None, None, None), reading(2.0, None, None, None)])
    sampler = TelemetrySampler(source)
    sampler.sample_now()
    sampler.sample_now()
    assert sampler.usage == TelemetryUsage(span_s=1.0)


async def test_stats_report_the_gpu_usage_with_telemetry_and_none_without() -> None:
    source = FakeTelemetry([reading(1.0, 50.0, 40.0, 10_000), reading(2.0, 50.0, 40.0, 40_000)])
    async with AdaptiveBatcher(
        lambda b: b, slo=SLO(latency_ms=50), telemetry=source, telemetry_hz=1000
    ) as batcher:
        await batcher.submit_many(range(10))
        gpu = batcher.stats().gpu
    assert gpu is not None and gpu.span_s >= 0.0
    async with AdaptiveBatcher(lambda b: b) as plain:
        await plain.submit(1)
        assert plain.stats().gpu is None
        assert plain.stats().counts.device_busy_s > 0.0
        assert plain.stats().counts.device_ms_per_request > 0.0

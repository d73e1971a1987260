"""TelemetrySample, merge, utilization_headroom, NullTelemetry and the public names."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

import adaptive_batcher.telemetry as telemetry
import adaptive_batcher.testing as testing
from adaptive_batcher.telemetry import (
    NullTelemetry,
    Telemetry,
    TelemetrySample,
    merge,
    utilization_headroom,
)

MEASURED = (
    "gpu_util_pct",
    "mem_util_pct",
    "sm_util_pct",
    "sm_occupancy_pct",
    "tensor_util_pct",
    "mem_total_bytes",
    "mem_used_bytes",
    "mem_free_bytes",
    "mem_reserved_bytes",
    "torch_allocated_bytes",
    "torch_reserved_bytes",
    "energy_mj",
)


def test_sample_fields_are_unit_suffixed_and_unknown_by_default() -> None:
    sample = TelemetrySample()
    names = [f.name for f in dataclasses.fields(TelemetrySample)]
    assert names == ["time_s", *MEASURED, "source"]
    assert all(getattr(sample, name) is None for name in ["time_s", *MEASURED])
    assert sample.source == "unknown"
    assert sample.is_unknown


def test_sample_is_frozen_and_slotted() -> None:
    sample = TelemetrySample(gpu_util_pct=50.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        sample.gpu_util_pct = 60.0  # type: ignore[misc]
    assert not hasattr(sample, "__dict__")


def test_is_unknown_ignores_time_and_source() -> None:
    assert TelemetrySample(time_s=3.0, source="nvml").is_unknown
    assert not TelemetrySample(torch_reserved_bytes=0).is_unknown


@pytest.mark.parametrize(
    ("free", "total", "expected"),
    [
        (25, 100, 0.25),
        (0, 100, 0.0),
        (100, 100, 1.0),
        (150, 100, 1.0),  # a torn reading is clamped
        (None, 100, None),
        (25, None, None),
        (0, 0, None),
    ],
)
def test_free_fraction(free: int | None, total: int | None, expected: float | None) -> None:
    sample = TelemetrySample(mem_free_bytes=free, mem_total_bytes=total)
    assert sample.free_fraction == expected


def test_merge_first_non_none_wins_per_field() -> None:
    nvml = TelemetrySample(time_s=1.0, gpu_util_pct=100.0, mem_free_bytes=10, source="nvml")
    torch = TelemetrySample(
        time_s=2.0, mem_free_bytes=99, torch_allocated_bytes=7, gpu_util_pct=None, source="t"
    )
    merged = merge(nvml, torch)
    assert merged == TelemetrySample(
        time_s=1.0, gpu_util_pct=100.0, mem_free_bytes=10, torch_allocated_bytes=7, source="nvml"
    )
    # Order matters: the other way round the torch figures win where both are known.
    assert merge(torch, nvml).mem_free_bytes == 99
    assert merge(torch, nvml).time_s == 2.0


def test_merge_keeps_zero_values() -> None:
    # 0 is a measurement, not "unknown": it must win over a later non-zero value.
    merged = merge(TelemetrySample(gpu_util_pct=0.0), TelemetrySample(gpu_util_pct=80.0))
    assert merged.gpu_util_pct == 0.0


def test_merge_of_nothing_is_unknown() -> None:
    assert merge() == TelemetrySample()


optional_pct = st.none() | st.floats(min_value=0, max_value=100)


@given(st.lists(st.builds(TelemetrySample, gpu_util_pct=optional_pct), min_size=1, max_size=5))
def test_merge_property_first_known_value(samples: list[TelemetrySample]) -> None:
    known = [s.gpu_util_pct for s in samples if s.gpu_util_pct is not None]
    assert merge(*samples).gpu_util_pct == (known[0] if known else None)
    assert merge(*samples).source == samples[0].source


@pytest.mark.parametrize(
    ("sm_util_pct", "expected"),
    [(0.0, 1.0), (37.7, 0.623), (91.6, 0.084), (100.0, 0.0), (103.0, 0.0), (-1.0, 1.0)],
)
def test_headroom_comes_from_gpm_sm_util(sm_util_pct: float, expected: float) -> None:
    sample = TelemetrySample(gpu_util_pct=100.0, sm_util_pct=sm_util_pct)
    assert utilization_headroom(sample) == pytest.approx(expected)


def test_headroom_never_comes_from_nvml_utilization() -> None:
    # nvml_signal.csv: NVML reads 100 % at resnet50 batch 64 while throughput still rises.
    saturated_nvml = TelemetrySample(gpu_util_pct=100.0, mem_util_pct=46.0)
    assert utilization_headroom(saturated_nvml) is None
    assert utilization_headroom(TelemetrySample(gpu_util_pct=28.0)) is None


def test_headroom_of_non_finite_sm_util_is_unknown() -> None:
    assert utilization_headroom(TelemetrySample(sm_util_pct=float("nan"))) is None


def test_null_telemetry_is_all_unknown_and_stamped() -> None:
    ticks = iter([5.0, 6.5])
    null = NullTelemetry(clock=lambda: next(ticks))
    assert isinstance(null, Telemetry)
    assert null.sample() == TelemetrySample(time_s=5.0, source="null")
    assert null.sample().time_s == 6.5
    null.close()
    null.close()  # idempotent


def test_telemetry_all_lists_exactly_the_public_names() -> None:
    public = {name for name in vars(telemetry) if not name.startswith("_")}
    modules = {"auto", "base", "combined", "headroom", "null", "nvml", "sampler", "torch_cuda"}
    assert set(telemetry.__all__) == public - modules


def test_testing_exports_the_telemetry_fakes() -> None:
    assert {"FakeTelemetry", "FakePynvml", "EchoModel", "FakeCudaEvent"} <= set(testing.__all__)
    for name in testing.__all__:
        assert hasattr(testing, name)

"""NvmlTelemetry against FakePynvml: GPM, memory v2 / v1, and every way NVML can fail."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import MutableMapping
from typing import Any

import pytest

from adaptive_batcher.telemetry import NvmlTelemetry, TelemetrySample
from adaptive_batcher.testing import FakePynvml
from tests.telemetry._helpers import warnings_named

Logs = list[MutableMapping[str, Any]]
GIB = 2**30


def unavailable(logs: Logs) -> list[dict[str, Any]]:
    return warnings_named(logs, "telemetry.unavailable")


def test_module_import_does_not_import_pynvml_or_torch() -> None:
    code = (
        "import sys, adaptive_batcher.telemetry, adaptive_batcher.testing; "
        "print('pynvml' in sys.modules, 'torch' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.split() == ["False", "False"]


def test_gpm_supported_values_come_from_consecutive_samples(
    fake_nvml: FakePynvml, logs: Logs
) -> None:
    ticks = iter([10.0, 10.05, 10.10])
    nvml = NvmlTelemetry(clock=lambda: next(ticks))
    assert nvml.available
    assert nvml.gpm_enabled

    first = nvml.sample()  # the GPM baseline: no interval yet
    assert first.time_s == 10.0
    assert first.source == "nvml"
    assert first.gpu_util_pct == 99.0
    assert (first.sm_util_pct, first.sm_occupancy_pct, first.tensor_util_pct) == (None,) * 3

    second = nvml.sample()
    assert second.time_s == 10.05
    assert second.sm_util_pct == 91.6
    assert second.sm_occupancy_pct == 51.7
    assert second.tensor_util_pct == 17.8

    fake_nvml.gpm_values = {2: 37.7, 3: 5.2, 5: 11.3}
    fake_nvml.gpu_util_pct = 59
    third = nvml.sample()
    assert (third.sm_util_pct, third.sm_occupancy_pct, third.tensor_util_pct) == (37.7, 5.2, 11.3)
    assert third.gpu_util_pct == 59.0
    assert fake_nvml.calls["nvmlGpmSampleGet"] == 3
    assert fake_nvml.calls["nvmlGpmMetricsGet"] == 2
    assert fake_nvml.calls["nvmlInit"] == 1
    assert unavailable(logs) == []


def test_gpm_metric_not_supported_is_unknown_alone(fake_nvml: FakePynvml) -> None:
    fake_nvml.gpm_unsupported_metrics = {fake_nvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL}
    nvml = NvmlTelemetry()
    nvml.sample()
    sample = nvml.sample()
    assert sample.tensor_util_pct is None
    assert sample.sm_util_pct == 91.6


def test_gpm_non_finite_value_is_unknown(fake_nvml: FakePynvml) -> None:
    fake_nvml.gpm_values = {2: float("nan"), 3: 10.0, 5: float("inf")}
    nvml = NvmlTelemetry()
    nvml.sample()
    sample = nvml.sample()
    assert (sample.sm_util_pct, sample.sm_occupancy_pct, sample.tensor_util_pct) == (
        None,
        10.0,
        None,
    )


def test_gpm_unsupported_device_keeps_nvml_figures(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakePynvml(gpm_supported=False, gpu_util_pct=28, mem_util_pct=0)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    nvml = NvmlTelemetry()
    assert not nvml.gpm_enabled
    for _ in range(2):
        sample = nvml.sample()
        assert sample.gpu_util_pct == 28.0
        assert sample.mem_util_pct == 0.0
        assert (sample.sm_util_pct, sample.sm_occupancy_pct, sample.tensor_util_pct) == (None,) * 3
    assert fake.calls["nvmlGpmSampleAlloc"] == 0
    assert fake.calls["nvmlGpmSampleGet"] == 0


def test_gpm_query_missing_in_old_driver_means_unsupported(
    fake_nvml: FakePynvml, logs: Logs
) -> None:
    fake_nvml.fail("nvmlGpmQueryDeviceSupport", code=fake_nvml.NVML_ERROR_FUNCTION_NOT_FOUND)
    nvml = NvmlTelemetry()
    assert nvml.available
    assert not nvml.gpm_enabled
    assert nvml.sample().gpu_util_pct == 99.0
    assert unavailable(logs) == []  # no GPM is normal before Hopper, not a failure


def test_gpm_disabled_by_argument(fake_nvml: FakePynvml) -> None:
    nvml = NvmlTelemetry(gpm=False)
    nvml.sample()
    assert nvml.sample().sm_util_pct is None
    assert fake_nvml.calls["nvmlGpmQueryDeviceSupport"] == 0


def test_memory_uses_the_v2_struct(fake_nvml: FakePynvml) -> None:
    sample = NvmlTelemetry().sample()
    assert sample.mem_used_bytes == round(2.53 * GIB)
    assert sample.mem_reserved_bytes == round(0.6 * GIB)
    assert sample.mem_free_bytes == round(137.3 * GIB)
    assert sample.mem_total_bytes == fake_nvml.memory_total_bytes
    assert sample.free_fraction == pytest.approx(137.3 / (2.53 + 0.6 + 137.3))


def test_memory_falls_back_to_v1_and_stays_there(
    monkeypatch: pytest.MonkeyPatch, logs: Logs
) -> None:
    fake = FakePynvml(memory_v2_supported=False)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    nvml = NvmlTelemetry()
    for _ in range(3):
        sample = nvml.sample()
        assert sample.mem_reserved_bytes is None
        # v1 counts the reserved memory as used.
        assert sample.mem_used_bytes == fake.memory_used_bytes + fake.memory_reserved_bytes
        assert sample.mem_free_bytes == fake.memory_free_bytes
        assert sample.mem_total_bytes == fake.memory_total_bytes
    assert fake.calls["nvmlDeviceGetMemoryInfo"] == 4  # one v2 attempt, then v1 only
    assert unavailable(logs) == []
    assert [e["event"] for e in logs if e["log_level"] == "info"] == [
        "telemetry.memory_v1_fallback"
    ]


def test_pynvml_without_memory_v2_uses_v1(
    fake_nvml: FakePynvml, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delattr(FakePynvml, "nvmlMemory_v2")
    sample = NvmlTelemetry().sample()
    assert sample.mem_reserved_bytes is None
    assert sample.mem_total_bytes == fake_nvml.memory_total_bytes
    assert fake_nvml.calls["nvmlDeviceGetMemoryInfo"] == 1


def test_transient_v2_failure_does_not_switch_to_v1(fake_nvml: FakePynvml, logs: Logs) -> None:
    nvml = NvmlTelemetry()
    fake_nvml.fail("nvmlDeviceGetMemoryInfo", calls={0, 1})  # v2 and the v1 retry both fail
    lost = nvml.sample()
    assert (lost.mem_total_bytes, lost.mem_used_bytes, lost.mem_free_bytes) == (None,) * 3
    assert lost.gpu_util_pct == 99.0
    assert nvml.sample().mem_reserved_bytes == round(0.6 * GIB)  # still on v2
    assert len(unavailable(logs)) == 1


def test_init_failure_gives_unknowns_and_exactly_one_warning(
    fake_nvml: FakePynvml, logs: Logs
) -> None:
    fake_nvml.fail("nvmlInit", code=fake_nvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    nvml = NvmlTelemetry(clock=lambda: 7.0)
    assert not nvml.available
    for _ in range(3):
        assert nvml.sample() == TelemetrySample(time_s=7.0, source="nvml")
    warnings = unavailable(logs)
    assert len(warnings) == 1
    assert warnings[0]["source"] == "nvml"
    assert warnings[0]["stage"] == "init"
    assert warnings[0]["device_index"] == 0
    assert warnings[0]["error"] == "FakeNVMLError: NVML Shared Library Not Found"
    nvml.close()
    assert fake_nvml.shutdown_calls == 0  # never initialised, so never shut down


def test_missing_pynvml_gives_unknowns_and_one_warning(
    monkeypatch: pytest.MonkeyPatch, logs: Logs
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    nvml = NvmlTelemetry()
    assert nvml.sample().is_unknown
    warnings = unavailable(logs)
    assert len(warnings) == 1
    assert warnings[0]["error"].startswith("ModuleNotFoundError")


def test_bad_device_index_shuts_nvml_down(fake_nvml: FakePynvml, logs: Logs) -> None:
    nvml = NvmlTelemetry(device_index=3)
    assert not nvml.available
    assert nvml.sample().is_unknown
    assert fake_nvml.init_refcount == 0
    assert [w["stage"] for w in unavailable(logs)] == ["device"]


def test_device_index_is_validated() -> None:
    with pytest.raises(ValueError, match=r"^device_index must be >= 0, got -1$"):
        NvmlTelemetry(device_index=-1)
    with pytest.raises(TypeError, match=r"^device_index must be an int, got str$"):
        NvmlTelemetry(device_index="0")  # type: ignore[arg-type]


def test_call_failing_mid_run_gives_unknown_and_one_warning(
    fake_nvml: FakePynvml, logs: Logs
) -> None:
    nvml = NvmlTelemetry(gpm=False)
    assert nvml.sample().gpu_util_pct == 99.0
    fake_nvml.fail("nvmlDeviceGetUtilizationRates", code=fake_nvml.NVML_ERROR_GPU_IS_LOST)
    for _ in range(3):
        sample = nvml.sample()
        assert (sample.gpu_util_pct, sample.mem_util_pct) == (None, None)
        assert sample.mem_free_bytes == fake_nvml.memory_free_bytes  # memory still read
    fake_nvml.recover("nvmlDeviceGetUtilizationRates")
    assert nvml.sample().gpu_util_pct == 99.0  # retried at every sample
    warnings = unavailable(logs)
    assert len(warnings) == 1
    assert warnings[0]["stage"] == "utilization"
    assert warnings[0]["error"] == "FakeNVMLError: GPU is lost"
    assert nvml.failure_count == 3


def test_gpm_sample_failure_restarts_the_interval(fake_nvml: FakePynvml, logs: Logs) -> None:
    nvml = NvmlTelemetry()
    nvml.sample()
    fake_nvml.fail("nvmlGpmSampleGet", calls={1})
    failed = nvml.sample()
    assert failed.sm_util_pct is None
    assert failed.gpu_util_pct == 99.0
    assert nvml.sample().sm_util_pct is None  # a new baseline after the failed sample
    assert nvml.sample().sm_util_pct == 91.6
    assert [w["stage"] for w in unavailable(logs)] == ["gpm"]


def test_gpm_metrics_failure_keeps_the_new_baseline(fake_nvml: FakePynvml) -> None:
    nvml = NvmlTelemetry()
    nvml.sample()
    fake_nvml.fail("nvmlGpmMetricsGet", calls={0})
    assert nvml.sample().sm_util_pct is None
    # The sample taken during the failed call is a valid baseline: no extra warm-up reading.
    assert nvml.sample().sm_util_pct == 91.6


def test_gpm_alloc_failure_disables_gpm_with_one_warning(fake_nvml: FakePynvml, logs: Logs) -> None:
    fake_nvml.fail("nvmlGpmSampleAlloc", calls={1})
    nvml = NvmlTelemetry()
    assert nvml.available
    assert not nvml.gpm_enabled
    assert fake_nvml.live_gpm_samples == 0  # the first buffer was freed again
    assert nvml.sample().gpu_util_pct == 99.0
    assert [w["stage"] for w in unavailable(logs)] == ["gpm"]


def test_close_frees_gpm_buffers_and_shuts_down_once(fake_nvml: FakePynvml) -> None:
    nvml = NvmlTelemetry()
    nvml.sample()
    assert fake_nvml.live_gpm_samples == 2
    assert fake_nvml.init_refcount == 1
    nvml.close()
    nvml.close()
    assert fake_nvml.live_gpm_samples == 0
    assert fake_nvml.init_refcount == 0
    assert fake_nvml.shutdown_calls == 1
    assert not nvml.available
    calls_before = sum(fake_nvml.calls.values())
    assert nvml.sample().is_unknown  # no NVML call after close
    assert sum(fake_nvml.calls.values()) == calls_before


def test_context_manager_closes(fake_nvml: FakePynvml) -> None:
    with NvmlTelemetry() as nvml:
        assert nvml.sample().gpu_util_pct == 99.0
    assert fake_nvml.init_refcount == 0


def test_shutdown_failure_is_swallowed(fake_nvml: FakePynvml, logs: Logs) -> None:
    nvml = NvmlTelemetry()
    fake_nvml.fail("nvmlShutdown")
    nvml.close()
    assert not nvml.available
    assert [e["event"] for e in logs if e["log_level"] == "debug"] == ["telemetry.close_failed"]


def test_two_instances_share_nvml_by_refcount(fake_nvml: FakePynvml) -> None:
    first, second = NvmlTelemetry(), NvmlTelemetry()
    first.close()
    assert second.sample().gpu_util_pct == 99.0  # still initialised for the second one
    second.close()
    assert fake_nvml.init_refcount == 0


def test_real_pynvml_never_raises(logs: Logs) -> None:
    """The installed nvidia-ml-py: without a GPU it degrades, with one it reads memory."""
    nvml = NvmlTelemetry()
    sample = nvml.sample()
    nvml.close()
    assert sample.source == "nvml"
    if nvml.failure_count == 0:
        assert sample.mem_total_bytes is not None and sample.mem_total_bytes > 0
        assert unavailable(logs) == []
    else:
        assert sample.is_unknown
        assert len(unavailable(logs)) == 1

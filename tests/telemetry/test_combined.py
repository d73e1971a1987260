"""CombinedTelemetry, auto_telemetry and the FakeTelemetry double."""

from __future__ import annotations

import sys
import types
from collections.abc import MutableMapping
from typing import Any

import pytest

from adaptive_batcher.telemetry import (
    CombinedTelemetry,
    NullTelemetry,
    NvmlTelemetry,
    Telemetry,
    TelemetrySample,
    TorchCudaMemory,
    auto_telemetry,
)
from adaptive_batcher.testing import FakePynvml, FakeTelemetry
from tests.telemetry._helpers import ScriptedCuda, warnings_named

Logs = list[MutableMapping[str, Any]]

NVML_LIKE = TelemetrySample(time_s=1.0, gpu_util_pct=99.0, mem_free_bytes=10, source="nvml")
TORCH_LIKE = TelemetrySample(
    time_s=2.0, mem_free_bytes=20, torch_allocated_bytes=5, source="torch_cuda"
)


def test_combined_merges_in_order_and_names_itself() -> None:
    first = FakeTelemetry([NVML_LIKE], name="nvml")
    second = FakeTelemetry([TORCH_LIKE], name="torch_cuda")
    combined = CombinedTelemetry(first, second)
    assert isinstance(combined, Telemetry)
    assert combined.name == "nvml+torch_cuda"
    assert combined.sample() == TelemetrySample(
        time_s=1.0,
        gpu_util_pct=99.0,
        mem_free_bytes=10,
        torch_allocated_bytes=5,
        source="nvml+torch_cuda",
    )


def test_combined_isolates_a_raising_source(logs: Logs) -> None:
    broken = FakeTelemetry([NVML_LIKE], raise_on=range(100), name="nvml")
    combined = CombinedTelemetry(broken, FakeTelemetry([TORCH_LIKE], name="torch_cuda"))
    for _ in range(3):
        sample = combined.sample()
        assert sample.gpu_util_pct is None
        assert sample.torch_allocated_bytes == 5
        assert sample.mem_free_bytes == 20
    warnings = warnings_named(logs, "telemetry.sample_failed")
    assert [w["source"] for w in warnings] == ["nvml"]


def test_combined_close_closes_every_source_even_if_one_raises(logs: Logs) -> None:
    class BadClose(FakeTelemetry):
        def close(self) -> None:
            super().close()
            raise OSError("handle already gone")

    first, second = BadClose([NVML_LIKE], name="bad"), FakeTelemetry([TORCH_LIKE])
    CombinedTelemetry(first, second).close()
    assert first.closed and second.closed
    assert [w["source"] for w in warnings_named(logs, "telemetry.close_failed")] == ["bad"]


def test_combined_needs_a_source() -> None:
    with pytest.raises(ValueError, match=r"^CombinedTelemetry needs at least one source$"):
        CombinedTelemetry()


def test_auto_without_nvml_or_cuda_is_null(monkeypatch: pytest.MonkeyPatch, logs: Logs) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setitem(sys.modules, "torch", None)
    source = auto_telemetry()
    assert isinstance(source, NullTelemetry)
    assert source.sample().is_unknown
    assert len(warnings_named(logs, "telemetry.unavailable")) == 1  # from NVML


def test_auto_with_nvml_only(fake_nvml: FakePynvml, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)
    source = auto_telemetry()
    assert isinstance(source, NvmlTelemetry)
    assert source.sample().gpu_util_pct == 99.0
    source.close()
    assert fake_nvml.init_refcount == 0


def test_auto_with_nvml_and_cuda_combines(
    fake_nvml: FakePynvml, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=ScriptedCuda()))
    source = auto_telemetry()
    assert isinstance(source, CombinedTelemetry)
    assert source.name == "nvml+torch_cuda"
    assert [type(s) for s in source.sources] == [NvmlTelemetry, TorchCudaMemory]
    sample = source.sample()
    assert sample.source == "nvml+torch_cuda"
    assert sample.gpu_util_pct == 99.0
    assert sample.mem_free_bytes == fake_nvml.memory_free_bytes  # NVML wins over torch
    assert sample.torch_allocated_bytes == 3 * 2**30
    source.close()
    assert fake_nvml.init_refcount == 0


def test_auto_with_cuda_but_no_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=ScriptedCuda()))
    assert isinstance(auto_telemetry(), TorchCudaMemory)


def test_auto_never_raises_on_a_bad_index(monkeypatch: pytest.MonkeyPatch, logs: Logs) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", FakePynvml())
    source = auto_telemetry(-1)
    assert isinstance(source, NullTelemetry)
    assert [w["source"] for w in warnings_named(logs, "telemetry.unavailable")] == ["auto"]


def test_fake_telemetry_repeats_the_last_scripted_sample() -> None:
    a, b = TelemetrySample(gpu_util_pct=1.0), TelemetrySample(gpu_util_pct=2.0)
    fake = FakeTelemetry([a, b])
    assert [fake.sample() for _ in range(4)] == [a, b, b, b]
    assert fake.calls == 4
    assert fake.name == "fake"


def test_fake_telemetry_callable_script_and_scripted_failures() -> None:
    fake = FakeTelemetry(lambda i: TelemetrySample(time_s=float(i)), raise_on=[1])
    assert fake.sample().time_s == 0.0
    with pytest.raises(RuntimeError, match=r"^FakeTelemetry: scripted failure on call 1$"):
        fake.sample()
    assert fake.sample().time_s == 2.0
    assert fake.calls == 3


def test_fake_telemetry_records_close_and_rejects_an_empty_script() -> None:
    fake = FakeTelemetry([TelemetrySample()])
    assert not fake.closed
    fake.close()
    assert fake.closed and fake.close_calls == 1
    with pytest.raises(ValueError, match=r"^script must hold at least one sample$"):
        FakeTelemetry([])

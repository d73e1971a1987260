"""TorchCudaMemory with the real CPU-only torch and with a scripted torch.cuda."""

from __future__ import annotations

import sys
import types
from collections.abc import MutableMapping
from typing import Any

import pytest

from adaptive_batcher.telemetry import TelemetrySample, TorchCudaMemory
from tests.telemetry._helpers import GIB, ScriptedCuda, warnings_named

Logs = list[MutableMapping[str, Any]]


def install(monkeypatch: pytest.MonkeyPatch, cuda: ScriptedCuda) -> None:
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))


def test_real_cpu_torch_gives_unknowns(logs: Logs) -> None:
    memory = TorchCudaMemory(clock=lambda: 2.0)
    assert not memory.available
    assert memory.sample() == TelemetrySample(time_s=2.0, source="torch_cuda")
    assert warnings_named(logs, "telemetry.unavailable") == []
    assert [e["log_level"] for e in logs if e["event"] == "telemetry.unavailable"] == ["debug"]


def test_missing_torch_gives_unknowns(monkeypatch: pytest.MonkeyPatch, logs: Logs) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)
    memory = TorchCudaMemory()
    assert not memory.available
    assert memory.sample().is_unknown
    assert warnings_named(logs, "telemetry.unavailable") == []


def test_cuda_figures_when_initialised(monkeypatch: pytest.MonkeyPatch) -> None:
    cuda = ScriptedCuda(device_count=2)
    install(monkeypatch, cuda)
    memory = TorchCudaMemory(device=1, clock=lambda: 4.0)
    assert memory.available
    assert memory.sample() == TelemetrySample(
        time_s=4.0,
        torch_allocated_bytes=3 * GIB + 1,
        torch_reserved_bytes=4 * GIB + 1,
        mem_free_bytes=100 * GIB,
        mem_total_bytes=140 * GIB,
        source="torch_cuda",
    )
    assert {device for _, device in cuda.calls} == {1}


def test_uninitialised_cuda_is_not_initialised_by_telemetry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cuda = ScriptedCuda(initialized=False)
    install(monkeypatch, cuda)
    sample = TorchCudaMemory().sample()
    assert sample.torch_allocated_bytes == 3 * GIB
    assert (sample.mem_free_bytes, sample.mem_total_bytes) == (None, None)
    assert ("mem_get_info", 0) not in cuda.calls


def test_device_beyond_the_visible_ones_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    install(monkeypatch, ScriptedCuda(device_count=1))
    memory = TorchCudaMemory(device=1)
    assert not memory.available
    assert memory.sample().is_unknown


def test_failing_call_gives_unknowns_and_one_warning(
    monkeypatch: pytest.MonkeyPatch, logs: Logs
) -> None:
    cuda = ScriptedCuda()
    install(monkeypatch, cuda)
    memory = TorchCudaMemory()
    cuda.fail_mem_get_info = True
    for _ in range(3):
        assert memory.sample().is_unknown
    warnings = warnings_named(logs, "telemetry.unavailable")
    assert len(warnings) == 1
    assert warnings[0]["source"] == "torch_cuda"
    assert warnings[0]["error"].startswith("RuntimeError: CUDA error")
    cuda.fail_mem_get_info = False
    assert memory.sample().mem_total_bytes == 140 * GIB


def test_close_stops_reading(monkeypatch: pytest.MonkeyPatch) -> None:
    cuda = ScriptedCuda()
    install(monkeypatch, cuda)
    memory = TorchCudaMemory()
    memory.close()
    memory.close()
    assert not memory.available
    assert memory.sample().is_unknown
    assert cuda.calls == []


def test_device_is_validated() -> None:
    with pytest.raises(ValueError, match=r"^device must be >= 0, got -2$"):
        TorchCudaMemory(device=-2)

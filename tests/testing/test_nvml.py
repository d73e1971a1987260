"""FakePynvml stays true to nvidia-ml-py, and NvmlTelemetry works with its real ctypes structs."""

from __future__ import annotations

import ctypes
import dataclasses
import inspect
import sys

import pynvml
import pytest

from adaptive_batcher.telemetry import NvmlTelemetry
from adaptive_batcher.testing import FakePynvml
from adaptive_batcher.testing.nvml import (
    FakeGpmMetric,
    FakeGpmMetricsGet,
    FakeGpmSupport,
    FakeMemory,
    FakeMemoryV2,
    FakeNVMLError,
    FakeUtilization,
)

API = sorted(
    name for name, value in vars(FakePynvml).items() if name.startswith("nvml") and callable(value)
)


def struct_fields(struct: type[ctypes.Structure]) -> list[str]:
    return [name for name, *_ in struct._fields_]


@pytest.mark.parametrize("name", API)
def test_fake_functions_exist_in_pynvml_with_the_same_arity(name: str) -> None:
    real = inspect.signature(getattr(pynvml, name)).parameters
    fake = inspect.signature(getattr(FakePynvml(), name)).parameters
    assert len(fake) == len(real)
    real_defaults = {k: p.default for k, p in real.items() if p.default is not p.empty}
    fake_defaults = {k: p.default for k, p in fake.items() if p.default is not p.empty}
    assert fake_defaults == real_defaults


def test_fake_implements_every_function_nvml_telemetry_needs() -> None:
    assert {
        "nvmlInit",
        "nvmlShutdown",
        "nvmlDeviceGetHandleByIndex",
        "nvmlDeviceGetUtilizationRates",
        "nvmlDeviceGetMemoryInfo",
        "nvmlGpmQueryDeviceSupport",
        "nvmlGpmSampleAlloc",
        "nvmlGpmSampleFree",
        "nvmlGpmSampleGet",
        "nvmlGpmMetricsGet",
    } <= set(API)


def test_fake_constants_match_pynvml() -> None:
    constants = [n for n in vars(FakePynvml) if n.startswith("NVML_")] + ["nvmlMemory_v2"]
    assert len(constants) > 10
    for name in constants:
        assert getattr(FakePynvml, name) == getattr(pynvml, name), name


@pytest.mark.parametrize(
    ("fake", "real"),
    [
        (FakeUtilization, pynvml.c_nvmlUtilization_t),
        (FakeMemory, pynvml.c_nvmlMemory_t),
        (FakeMemoryV2, pynvml.c_nvmlMemory_v2_t),
        (FakeGpmSupport, pynvml.c_nvmlGpmSupport_t),
    ],
)
def test_fake_structs_have_pynvml_fields(fake: type, real: type[ctypes.Structure]) -> None:
    assert [f.name for f in dataclasses.fields(fake)] == struct_fields(real)


def test_fake_gpm_request_has_pynvml_fields() -> None:
    request = FakeGpmMetricsGet()
    for name in struct_fields(pynvml.c_nvmlGpmMetricsGet_t):
        assert hasattr(request, name), name
    metric_fields = set(struct_fields(pynvml.c_nvmlGpmMetric_t)) - {"metricInfo"}
    assert metric_fields == {f.name for f in dataclasses.fields(FakeGpmMetric)}


def test_fake_enforces_init_and_handles() -> None:
    fake = FakePynvml(device_count=2)
    with pytest.raises(FakeNVMLError) as caught:
        fake.nvmlDeviceGetHandleByIndex(0)
    assert caught.value.value == fake.NVML_ERROR_UNINITIALIZED
    fake.nvmlInit()
    assert fake.nvmlDeviceGetCount() == 2
    with pytest.raises(FakeNVMLError, match=r"^Invalid Argument$"):
        fake.nvmlDeviceGetHandleByIndex(2)
    handle = fake.nvmlDeviceGetHandleByIndex(1)
    assert fake.nvmlDeviceGetUtilizationRates(handle) == FakeUtilization(gpu=99, memory=66)
    fake.nvmlShutdown()
    with pytest.raises(FakeNVMLError, match=r"^Uninitialized$"):
        fake.nvmlDeviceGetUtilizationRates(handle)


def test_fake_rejects_gpm_samples_out_of_order() -> None:
    fake = FakePynvml()
    fake.nvmlInit()
    handle = fake.nvmlDeviceGetHandleByIndex(0)
    first, second = fake.nvmlGpmSampleAlloc(), fake.nvmlGpmSampleAlloc()
    fake.nvmlGpmSampleGet(handle, first)
    fake.nvmlGpmSampleGet(handle, second)
    request = FakeGpmMetricsGet()
    request.version, request.numMetrics = 1, 1
    request.sample1, request.sample2 = second, first  # swapped
    request.metrics[0].metricId = fake.NVML_GPM_METRIC_SM_UTIL
    with pytest.raises(FakeNVMLError, match=r"^Invalid Argument$"):
        fake.nvmlGpmMetricsGet(request)
    request.sample1, request.sample2 = first, second
    assert fake.nvmlGpmMetricsGet(request).metrics[0].value == 91.6
    fake.nvmlGpmSampleFree(first)
    with pytest.raises(FakeNVMLError):
        fake.nvmlGpmMetricsGet(request)  # a freed buffer


def test_fake_failures_by_call_index() -> None:
    fake = FakePynvml()
    fake.fail("nvmlInit", calls=[1], code=fake.NVML_ERROR_LIBRARY_NOT_FOUND)
    fake.nvmlInit()
    with pytest.raises(FakeNVMLError, match=r"^NVML Shared Library Not Found$"):
        fake.nvmlInit()
    fake.nvmlInit()
    assert fake.calls["nvmlInit"] == 3
    assert fake.init_refcount == 2


class CtypesGpmPynvml(FakePynvml):
    """FakePynvml whose GPM request and sample buffers are nvidia-ml-py's real ctypes types."""

    c_nvmlGpmMetricsGet_t = pynvml.c_nvmlGpmMetricsGet_t  # noqa: N815 - pynvml's name

    def __init__(self) -> None:
        super().__init__()
        self.buffers: dict[int, ctypes.Array[ctypes.c_char]] = {}
        self.taken: dict[int, tuple[int, dict[int, float]]] = {}

    @staticmethod
    def address(sample: object) -> int:
        value = ctypes.cast(sample, ctypes.c_void_p).value
        assert value is not None
        return value

    def nvmlGpmSampleAlloc(self) -> ctypes._Pointer[ctypes.Structure]:  # noqa: N802
        self.calls["nvmlGpmSampleAlloc"] += 1
        buffer = ctypes.create_string_buffer(16)
        sample = ctypes.cast(buffer, pynvml.c_nvmlGpmSample_t)
        self.buffers[self.address(sample)] = buffer
        return sample

    def nvmlGpmSampleFree(self, sample):  # noqa: N802
        del self.buffers[self.address(sample)]

    def nvmlGpmSampleGet(self, handle, sample):  # noqa: N802
        assert self.address(sample) in self.buffers
        self.calls["nvmlGpmSampleGet"] += 1
        self.taken[self.address(sample)] = (self.calls["nvmlGpmSampleGet"], dict(self.gpm_values))
        return sample

    def nvmlGpmMetricsGet(self, request):  # noqa: N802
        assert isinstance(request, pynvml.c_nvmlGpmMetricsGet_t)
        assert request.version == pynvml.NVML_GPM_METRICS_GET_VERSION
        first = self.taken[self.address(request.sample1)]
        second = self.taken[self.address(request.sample2)]
        assert first[0] < second[0]
        for slot in range(request.numMetrics):
            metric = request.metrics[slot]
            metric.value = second[1][metric.metricId]
            metric.nvmlReturn = pynvml.NVML_SUCCESS
        return request


def test_gpm_with_real_pynvml_ctypes_structs(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = CtypesGpmPynvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    nvml = NvmlTelemetry()
    assert nvml.sample().sm_util_pct is None
    sample = nvml.sample()
    assert (sample.sm_util_pct, sample.sm_occupancy_pct, sample.tensor_util_pct) == pytest.approx(
        (91.6, 51.7, 17.8)
    )
    fake.gpm_values = {2: 85.7, 3: 16.4, 5: 71.8}
    assert nvml.sample().tensor_util_pct == pytest.approx(71.8)
    nvml.close()
    assert fake.buffers == {}

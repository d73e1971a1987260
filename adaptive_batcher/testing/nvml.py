"""A stand-in for nvidia-ml-py's ``pynvml`` module, so NVML telemetry is tested without a GPU.

Inject it where ``import pynvml`` will find it::

    fake = FakePynvml(gpu_util_pct=100, gpm_supported=True)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    telemetry = NvmlTelemetry()

It implements the subset of the pynvml API that :class:`~adaptive_batcher.telemetry.NvmlTelemetry`
calls, with the same names, argument shapes and return attributes (checked against
nvidia-ml-py 13.615), and it enforces what real NVML enforces: no call before ``nvmlInit`` or
after the last ``nvmlShutdown``, a valid device handle, live GPM sample buffers, and
``sample1`` taken before ``sample2``. Any function can be told to fail with :meth:`FakePynvml.fail`.

Default figures are one real reading, taken by this project on one NVIDIA H200 while resnet50
(bf16, eager) ran back to back at batch 256: NVML utilization 99 %, GPM SM 91.6 %, occupancy
51.7 %, tensor 17.8 %, 2.53 GiB used, 0.6 GiB reserved, 137.3 GiB free, memory utilization
66 %.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import ClassVar

__all__ = [
    "FakeGpmMetric",
    "FakeGpmMetricsGet",
    "FakeGpmSample",
    "FakeGpmSupport",
    "FakeMemory",
    "FakeMemoryV2",
    "FakeNVMLError",
    "FakeNvmlHandle",
    "FakePynvml",
    "FakeUtilization",
]

_GIB = 2**30

_MESSAGES = {
    1: "Uninitialized",
    2: "Invalid Argument",
    3: "Not Supported",
    12: "NVML Shared Library Not Found",
    13: "Function Not Found",
    15: "GPU is lost",
    999: "Unknown Error",
}


class FakeNVMLError(Exception):
    """Like ``pynvml.NVMLError``: carries the NVML return code in ``value``."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return _MESSAGES.get(self.value, f"NVML Error with code {self.value}")


@dataclass(frozen=True)
class FakeNvmlHandle:
    """A device handle, as returned by ``nvmlDeviceGetHandleByIndex``."""

    index: int


@dataclass(frozen=True)
class FakeUtilization:
    """Like ``c_nvmlUtilization_t``: percent of time a kernel ran / memory was accessed."""

    gpu: int
    memory: int


@dataclass(frozen=True)
class FakeMemory:
    """Like ``c_nvmlMemory_t`` (v1), in bytes; ``used`` includes the reserved memory."""

    total: int
    free: int
    used: int


@dataclass(frozen=True)
class FakeMemoryV2:
    """Like ``c_nvmlMemory_v2_t``, in bytes; ``used`` excludes ``reserved``."""

    version: int
    total: int
    reserved: int
    free: int
    used: int


@dataclass(frozen=True)
class FakeGpmSupport:
    """Like ``c_nvmlGpmSupport_t``."""

    version: int
    isSupportedDevice: int  # noqa: N815 - pynvml's field name


@dataclass(eq=False)
class FakeGpmSample:
    """A GPM sample buffer: ``nvmlGpmSampleGet`` stamps it with a sequence number and values."""

    handle: FakeNvmlHandle | None = None
    sequence: int | None = None
    values: dict[int, float] = field(default_factory=dict)
    freed: bool = False


@dataclass
class FakeGpmMetric:
    """Like ``c_nvmlGpmMetric_t``: the caller sets ``metricId``, NVML fills the rest."""

    metricId: int = 0  # noqa: N815 - pynvml's field name
    nvmlReturn: int = 0  # noqa: N815 - pynvml's field name
    value: float = 0.0


class FakeGpmMetricsGet:
    """Like ``c_nvmlGpmMetricsGet_t``: version, numMetrics, sample1, sample2, metrics[]."""

    SLOTS: ClassVar[int] = 32

    def __init__(self) -> None:
        self.version = 0
        self.numMetrics = 0
        self.sample1: FakeGpmSample | None = None
        self.sample2: FakeGpmSample | None = None
        self.metrics = [FakeGpmMetric() for _ in range(self.SLOTS)]


class FakePynvml:
    """A configurable fake of the ``pynvml`` module (one or more identical GPUs).

    The figures are plain attributes that a test may change between readings:
    ``gpu_util_pct``, ``mem_util_pct``, ``memory_total_bytes``, ``memory_used_bytes``,
    ``memory_reserved_bytes`` (free = total - used - reserved) and ``gpm_values`` (GPM metric
    id -> value). ``nvmlGpmMetricsGet`` reports the GPM values in effect when ``sample2`` was
    taken; ids in ``gpm_unsupported_metrics`` come back with ``NVML_ERROR_NOT_SUPPORTED``.

    Bookkeeping for assertions: ``calls`` (a Counter of function name -> calls, failed ones
    included), ``init_refcount``, ``shutdown_calls``, ``live_gpm_samples``.

    Args:
        device_count: number of GPUs.
        gpm_supported: what ``nvmlGpmQueryDeviceSupport`` reports; when False the GPM sample
            functions raise ``NVML_ERROR_NOT_SUPPORTED``.
        memory_v2_supported: when False, ``nvmlDeviceGetMemoryInfo(..., version=...)`` raises
            ``NVML_ERROR_FUNCTION_NOT_FOUND`` (a driver without ``nvmlDeviceGetMemoryInfo_v2``).
        gpu_util_pct: what ``nvmlDeviceGetUtilizationRates`` reports as ``gpu``, %.
        mem_util_pct: what ``nvmlDeviceGetUtilizationRates`` reports as ``memory``, %.
        gpm_values: GPM metric id -> value; defaults to the H200 reading in the module docstring.
        energy_supported: when False, ``nvmlDeviceGetTotalEnergyConsumption`` raises
            ``NVML_ERROR_NOT_SUPPORTED`` (a GPU older than Volta).

    ``energy_mj`` is the energy counter ``nvmlDeviceGetTotalEnergyConsumption`` reports,
    millijoules; a test advances it between readings.
    """

    # Return codes and constants, with pynvml's values.
    NVML_SUCCESS = 0
    NVML_ERROR_UNINITIALIZED = 1
    NVML_ERROR_INVALID_ARGUMENT = 2
    NVML_ERROR_NOT_SUPPORTED = 3
    NVML_ERROR_LIBRARY_NOT_FOUND = 12
    NVML_ERROR_FUNCTION_NOT_FOUND = 13
    NVML_ERROR_GPU_IS_LOST = 15
    NVML_ERROR_UNKNOWN = 999
    NVML_GPM_METRIC_SM_UTIL = 2
    NVML_GPM_METRIC_SM_OCCUPANCY = 3
    NVML_GPM_METRIC_ANY_TENSOR_UTIL = 5
    NVML_GPM_METRICS_GET_VERSION = 1
    NVML_GPM_SUPPORT_VERSION = 1
    nvmlMemory_v2 = 0x02000028  # noqa: N815 - pynvml's name
    NVMLError = FakeNVMLError
    c_nvmlGpmMetricsGet_t = FakeGpmMetricsGet  # noqa: N815 - pynvml's name

    def __init__(
        self,
        *,
        device_count: int = 1,
        gpm_supported: bool = True,
        memory_v2_supported: bool = True,
        gpu_util_pct: int = 99,
        mem_util_pct: int = 66,
        gpm_values: Mapping[int, float] | None = None,
        energy_supported: bool = True,
    ) -> None:
        self.device_count = device_count
        self.gpm_supported = gpm_supported
        self.memory_v2_supported = memory_v2_supported
        self.gpu_util_pct = gpu_util_pct
        self.mem_util_pct = mem_util_pct
        self.memory_used_bytes = round(2.53 * _GIB)
        self.memory_reserved_bytes = round(0.6 * _GIB)
        self.memory_total_bytes = self.memory_used_bytes + self.memory_reserved_bytes
        self.memory_total_bytes += round(137.3 * _GIB)
        self.gpm_values: dict[int, float] = (
            {2: 91.6, 3: 51.7, 5: 17.8} if gpm_values is None else dict(gpm_values)
        )
        self.gpm_unsupported_metrics: set[int] = set()
        self.energy_supported = energy_supported
        self.energy_mj = 123_456_789  # an H200 that has been up for a while
        self.calls: Counter[str] = Counter()
        self.init_refcount = 0
        self.shutdown_calls = 0
        self._samples: list[FakeGpmSample] = []
        self._sequence = 0
        self._failures: dict[str, tuple[frozenset[int] | None, int]] = {}
        self._lock = threading.Lock()

    # -- configuration -------------------------------------------------------------------------

    def fail(self, function: str, *, calls: Iterable[int] | None = None, code: int = 999) -> None:
        """Make ``function`` raise ``FakeNVMLError(code)``.

        Args:
            function: a pynvml function name, e.g. ``"nvmlDeviceGetUtilizationRates"``.
            calls: 0-based indices of that function's calls that fail (counted from the
                fake's creation); None means every call from now on.
            code: the NVML return code (default ``NVML_ERROR_UNKNOWN``).
        """
        self._failures[function] = (None if calls is None else frozenset(calls), code)

    def recover(self, function: str) -> None:
        """Undo :meth:`fail` for ``function``."""
        self._failures.pop(function, None)

    @property
    def live_gpm_samples(self) -> int:
        """GPM sample buffers allocated and not yet freed."""
        return sum(not sample.freed for sample in self._samples)

    @property
    def memory_free_bytes(self) -> int:
        """total - used - reserved, in bytes."""
        return self.memory_total_bytes - self.memory_used_bytes - self.memory_reserved_bytes

    # -- pynvml API ----------------------------------------------------------------------------

    def nvmlInit(self) -> None:  # noqa: N802 - pynvml's name
        self._enter("nvmlInit", needs_init=False)
        self.init_refcount += 1

    def nvmlShutdown(self) -> None:  # noqa: N802 - pynvml's name
        self._enter("nvmlShutdown")
        self.init_refcount -= 1
        self.shutdown_calls += 1

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802 - pynvml's name
        self._enter("nvmlDeviceGetCount")
        return self.device_count

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeNvmlHandle:  # noqa: N802
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < self.device_count:
            raise FakeNVMLError(self.NVML_ERROR_INVALID_ARGUMENT)
        return FakeNvmlHandle(index)

    def nvmlDeviceGetUtilizationRates(self, handle: FakeNvmlHandle) -> FakeUtilization:  # noqa: N802
        self._enter("nvmlDeviceGetUtilizationRates", handle)
        return FakeUtilization(gpu=self.gpu_util_pct, memory=self.mem_util_pct)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: FakeNvmlHandle) -> int:  # noqa: N802
        self._enter("nvmlDeviceGetTotalEnergyConsumption", handle)
        if not self.energy_supported:
            raise FakeNVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        return self.energy_mj

    def nvmlDeviceGetMemoryInfo(  # noqa: N802 - pynvml's name
        self, handle: FakeNvmlHandle, version: int | None = None
    ) -> FakeMemory | FakeMemoryV2:
        self._enter("nvmlDeviceGetMemoryInfo", handle)
        used, reserved = self.memory_used_bytes, self.memory_reserved_bytes
        total, free = self.memory_total_bytes, self.memory_free_bytes
        if not version:
            return FakeMemory(total=total, free=free, used=used + reserved)
        if not self.memory_v2_supported:
            raise FakeNVMLError(self.NVML_ERROR_FUNCTION_NOT_FOUND)
        if version != self.nvmlMemory_v2:
            raise FakeNVMLError(self.NVML_ERROR_INVALID_ARGUMENT)
        return FakeMemoryV2(version, total=total, reserved=reserved, free=free, used=used)

    def nvmlGpmQueryDeviceSupport(self, handle: FakeNvmlHandle) -> FakeGpmSupport:  # noqa: N802
        self._enter("nvmlGpmQueryDeviceSupport", handle)
        return FakeGpmSupport(self.NVML_GPM_SUPPORT_VERSION, int(self.gpm_supported))

    def nvmlGpmSampleAlloc(self) -> FakeGpmSample:  # noqa: N802 - pynvml's name
        self._enter("nvmlGpmSampleAlloc")
        self._require_gpm()
        sample = FakeGpmSample()
        self._samples.append(sample)
        return sample

    def nvmlGpmSampleFree(self, sample: FakeGpmSample) -> None:  # noqa: N802 - pynvml's name
        self._enter("nvmlGpmSampleFree")
        self._require_live(sample)
        sample.freed = True

    def nvmlGpmSampleGet(  # noqa: N802 - pynvml's name
        self, handle: FakeNvmlHandle, sample: FakeGpmSample
    ) -> FakeGpmSample:
        self._enter("nvmlGpmSampleGet", handle)
        self._require_gpm()
        self._require_live(sample)
        with self._lock:
            self._sequence += 1
            sample.sequence = self._sequence
        sample.handle = handle
        sample.values = dict(self.gpm_values)
        return sample

    def nvmlGpmMetricsGet(self, request: FakeGpmMetricsGet) -> FakeGpmMetricsGet:  # noqa: N802
        self._enter("nvmlGpmMetricsGet")
        self._require_gpm()
        first, second = request.sample1, request.sample2
        if request.version != self.NVML_GPM_METRICS_GET_VERSION or first is None or second is None:
            raise FakeNVMLError(self.NVML_ERROR_INVALID_ARGUMENT)
        self._require_ordered(first, second)
        if not 0 < request.numMetrics <= len(request.metrics):
            raise FakeNVMLError(self.NVML_ERROR_INVALID_ARGUMENT)
        for metric in request.metrics[: request.numMetrics]:
            self._fill(metric, second.values)
        return request

    # -- checks ----------------------------------------------------------------------------------

    def _enter(
        self, function: str, handle: FakeNvmlHandle | None = None, *, needs_init: bool = True
    ) -> None:
        """Count the call, then raise an injected failure or an NVML precondition error."""
        with self._lock:
            index = self.calls[function]
            self.calls[function] += 1
        failure = self._failures.get(function)
        if failure is not None and (failure[0] is None or index in failure[0]):
            raise FakeNVMLError(failure[1])
        if needs_init and self.init_refcount <= 0:
            raise FakeNVMLError(self.NVML_ERROR_UNINITIALIZED)
        if handle is not None and not (
            isinstance(handle, FakeNvmlHandle) and 0 <= handle.index < self.device_count
        ):
            raise FakeNVMLError(self.NVML_ERROR_INVALID_ARGUMENT)

    def _require_gpm(self) -> None:
        if not self.gpm_supported:
            raise FakeNVMLError(self.NVML_ERROR_NOT_SUPPORTED)

    def _require_live(self, sample: FakeGpmSample) -> None:
        if not isinstance(sample, FakeGpmSample) or sample.freed or sample not in self._samples:
            raise FakeNVMLError(self.NVML_ERROR_INVALID_ARGUMENT)

    def _require_ordered(self, first: FakeGpmSample, second: FakeGpmSample) -> None:
        """Both live, both taken on the same device, ``first`` strictly earlier."""
        self._require_live(first)
        self._require_live(second)
        if first.sequence is None or second.sequence is None or first.handle != second.handle:
            raise FakeNVMLError(self.NVML_ERROR_INVALID_ARGUMENT)
        if first.sequence >= second.sequence:
            raise FakeNVMLError(self.NVML_ERROR_INVALID_ARGUMENT)

    def _fill(self, metric: FakeGpmMetric, values: Mapping[int, float]) -> None:
        if metric.metricId in self.gpm_unsupported_metrics:
            metric.nvmlReturn, metric.value = self.NVML_ERROR_NOT_SUPPORTED, 0.0
        elif metric.metricId in values:
            metric.nvmlReturn, metric.value = self.NVML_SUCCESS, values[metric.metricId]
        else:
            metric.nvmlReturn, metric.value = self.NVML_ERROR_INVALID_ARGUMENT, 0.0

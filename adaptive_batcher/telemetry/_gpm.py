"""GPM (GPU Performance Monitoring, Hopper and newer) through nvidia-ml-py: private helper.

GPM metrics are computed by NVML from two samples; this reader keeps two sample buffers and
returns the metrics between the previous reading and the current one, then swaps the buffers
(the same pattern as NVIDIA's own examples for ``nvmlGpmMetricsGet``).
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

__all__ = ["GPM_FIELDS", "GpmReader", "gpm_supported"]

#: TelemetrySample field -> name of the pynvml metric-id constant.
GPM_FIELDS: dict[str, str] = {
    "sm_util_pct": "NVML_GPM_METRIC_SM_UTIL",
    "sm_occupancy_pct": "NVML_GPM_METRIC_SM_OCCUPANCY",
    "tensor_util_pct": "NVML_GPM_METRIC_ANY_TENSOR_UTIL",
}


def gpm_supported(nvml: Any, handle: Any) -> bool:
    """Whether ``handle``'s device supports GPM; False, never an error, when it cannot tell.

    An old driver raises ``NVMLError_FunctionNotFound`` / ``NotSupported`` and an old
    nvidia-ml-py lacks the function or the metric ids: all mean "unsupported".
    """
    try:
        support = nvml.nvmlGpmQueryDeviceSupport(handle)
        has_ids = all(hasattr(nvml, constant) for constant in GPM_FIELDS.values())
        return bool(support.isSupportedDevice) and has_ids
    except Exception:
        return False


class GpmReader:
    """Reads SM utilization, SM occupancy and tensor utilization between consecutive calls.

    Not thread-safe on its own: the owning telemetry source serialises calls. Every method may
    raise the NVML error of the call that failed; the owner turns that into unknown fields.
    """

    def __init__(self, nvml: Any, handle: Any) -> None:
        self._nvml = nvml
        self._handle = handle
        self._metric_ids = [int(getattr(nvml, constant)) for constant in GPM_FIELDS.values()]
        self._previous: Any = None
        self._current: Any = None
        self._previous = nvml.nvmlGpmSampleAlloc()
        try:
            self._current = nvml.nvmlGpmSampleAlloc()
        except Exception:
            self.close()
            raise
        self._primed = False

    def read(self) -> dict[str, float | None]:
        """GPM fields over the interval since the previous call; all None on the first call.

        Raises:
            Exception: the NVML error of ``nvmlGpmSampleGet`` or ``nvmlGpmMetricsGet``. After a
                failed ``nvmlGpmSampleGet`` the next call starts a new interval.
        """
        unknown: dict[str, float | None] = dict.fromkeys(GPM_FIELDS)
        try:
            self._nvml.nvmlGpmSampleGet(self._handle, self._current)
        except Exception:
            self._primed = False
            raise
        primed, self._primed = self._primed, True
        try:
            return self._metrics() if primed else unknown
        finally:
            self._previous, self._current = self._current, self._previous

    def _metrics(self) -> dict[str, float | None]:
        """Ask NVML for the metrics between ``_previous`` (sample1) and ``_current`` (sample2)."""
        nvml = self._nvml
        request = nvml.c_nvmlGpmMetricsGet_t()
        request.version = nvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(self._metric_ids)
        request.sample1 = self._previous
        request.sample2 = self._current
        for slot, metric_id in enumerate(self._metric_ids):
            request.metrics[slot].metricId = metric_id
        nvml.nvmlGpmMetricsGet(request)
        values: dict[str, float | None] = {}
        for slot, field in enumerate(GPM_FIELDS):
            metric = request.metrics[slot]
            value = float(metric.value)
            ok = metric.nvmlReturn == nvml.NVML_SUCCESS and math.isfinite(value)
            values[field] = value if ok else None
        return values

    def close(self) -> None:
        """Free both sample buffers; errors while freeing are ignored (nothing to recover)."""
        for sample in (self._previous, self._current):
            if sample is not None:
                with contextlib.suppress(Exception):
                    self._nvml.nvmlGpmSampleFree(sample)
        self._previous = self._current = None

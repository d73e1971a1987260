"""GPU readings from NVML through nvidia-ml-py (``pynvml``), with GPM on Hopper and newer.

``pynvml`` is imported when a :class:`NvmlTelemetry` is built, never when this module is
imported, so the package imports on machines without NVIDIA's library. One NVML call costs
1-9 us on an H200 (measured by this project from Python through nvidia-ml-py: utilization 1-4 us,
memory 6-9 us), so a background sampler at 10-50 Hz is cheap; the energy counter is the
exception (2.4-3.3 ms a call, measured 2026-12-04) and is read at most once a second.

Read ``gpu_util_pct`` with care: NVML utilization is the fraction of time any kernel ran and
reads 100 % on an H200 from resnet50 batch 64 on while throughput still rises (measured by this
project on one NVIDIA H200, bf16, eager, reading NVML and GPM while resnet50 ran back to back).
Never treat it as "no headroom";
prefer the GPM ``sm_util_pct`` / ``tensor_util_pct`` (see :func:`utilization_headroom`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

from adaptive_batcher._log import get_logger
from adaptive_batcher._validate import check_int, check_number
from adaptive_batcher.telemetry._gpm import GpmReader, gpm_supported
from adaptive_batcher.telemetry._util import describe_error
from adaptive_batcher.telemetry.base import TelemetrySample

__all__ = ["NvmlTelemetry"]

_log = get_logger()


class NvmlTelemetry:
    """Utilization, memory and (where supported) GPM metrics of one GPU, from NVML.

    Building one calls ``nvmlInit`` and looks the device up; :meth:`close` frees the GPM buffers
    and calls ``nvmlShutdown`` (NVML counts inits, so other NVML users in the process are not
    disturbed). Each :meth:`sample` makes 2 NVML calls, plus 2 for GPM, plus the energy counter
    at most once per ``energy_interval_s``: that call costs 2.4-3.3 ms (median; p99 16 ms) on an
    H200 where the others cost 1-9 us (measured; docs/benchmarks.md), and the counter is
    cumulative, so reading it less often loses nothing but the edges of a span.

    Failures never reach the caller: a missing ``pynvml`` or NVML library, a failed init, a bad
    device index or a call that fails mid-run all turn the affected fields into None. The first
    failure of an instance is logged once as the warning ``telemetry.unavailable`` (keys
    ``source``, ``stage``, ``device_index``, ``error``); later ones only count in
    :attr:`failure_count`. A failed call is retried at the next sample.

    Memory uses NVML's v2 struct (``nvmlMemory_v2``, which reports ``reserved`` apart from
    ``used``) and falls back to v1 for good when the driver or ``pynvml`` lacks it (then
    ``mem_reserved_bytes`` is None and ``mem_used_bytes`` includes the reserved memory).

    GPM figures (``sm_util_pct``, ``sm_occupancy_pct``, ``tensor_util_pct``) cover the interval
    since the previous :meth:`sample` call, so the first sample has them unknown. They are None
    on GPUs without GPM (``nvmlGpmQueryDeviceSupport``: Hopper and newer). MIG instances are not
    read separately (that needs ``nvmlGpmMigSampleGet``).

    ``device_index`` is NVML's index, which ignores ``CUDA_VISIBLE_DEVICES`` and follows PCI bus
    order: it matches torch's CUDA index only when no devices are hidden and
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (or the process sees one GPU).

    Args:
        device_index: NVML device index, an int >= 0 (TypeError / ValueError otherwise).
        gpm: set False to skip GPM even where it is supported.
        clock: monotonic clock stamping ``time_s``, in seconds (default ``time.monotonic``).
        energy_interval_s: the least time between two reads of the energy counter, seconds,
            a finite number >= 0 (0: every sample); the samples between have ``energy_mj``
            None.
    """

    name = "nvml"

    def __init__(
        self,
        device_index: int = 0,
        *,
        gpm: bool = True,
        clock: Callable[[], float] = time.monotonic,
        energy_interval_s: float = 1.0,
    ) -> None:
        self._device_index = check_int("device_index", device_index, 0)
        self._energy_interval_s = check_number("energy_interval_s", energy_interval_s, 0.0)
        self._energy_read_at: float | None = None
        self._clock = clock
        self._lock = threading.Lock()
        self._warned = False
        self._failures = 0
        self._nvml: Any = None
        self._handle: Any = None
        self._gpm: GpmReader | None = None
        self._memory_v2 = False
        self._energy_supported = False
        self._open(gpm)

    @property
    def device_index(self) -> int:
        """The NVML device index this source reads."""
        return self._device_index

    @property
    def available(self) -> bool:
        """True while NVML is initialised and the device was found (False after close)."""
        return self._handle is not None

    @property
    def gpm_enabled(self) -> bool:
        """True when GPM metrics are being read (supported device, ``gpm=True``, not closed)."""
        return self._gpm is not None

    @property
    def failure_count(self) -> int:
        """How many NVML failures this instance has met (only the first one is logged)."""
        return self._failures

    def _open(self, gpm: bool) -> None:
        """Import pynvml, init NVML, find the device, set up GPM; failures leave it unavailable."""
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception as exc:  # ImportError, NVMLError (no driver / library), OSError
            self._fail("init", exc)
            return
        self._nvml = pynvml
        try:
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(self._device_index)
        except Exception as exc:
            self._fail("device", exc)
            self._release()
            return
        self._memory_v2 = getattr(pynvml, "nvmlMemory_v2", None) is not None
        self._energy_supported = hasattr(pynvml, "nvmlDeviceGetTotalEnergyConsumption")
        if gpm and gpm_supported(pynvml, self._handle):
            try:
                self._gpm = GpmReader(pynvml, self._handle)
            except Exception as exc:
                self._fail("gpm", exc)

    def sample(self) -> TelemetrySample:
        """One reading now; unknown fields are None. Raises nothing (see the class docstring)."""
        with self._lock:
            now = self._clock()
            if self._handle is None:
                return TelemetrySample(time_s=now, source=self.name)
            values: dict[str, Any] = {}
            values.update(self._guarded("utilization", self._utilization))
            values.update(self._guarded("memory", self._memory))
            if self._energy_supported and self._energy_due(now):
                values.update(self._guarded("energy", self._energy))
            if self._gpm is not None:
                values.update(self._guarded("gpm", self._gpm.read))
            return TelemetrySample(time_s=now, source=self.name, **values)

    def _guarded(self, stage: str, read: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """``read()``, or no fields (unknown) after logging the failure."""
        try:
            return read()
        except Exception as exc:
            self._fail(stage, exc)
            return {}

    def _energy_due(self, now: float) -> bool:
        """True when the energy counter was never read or ``energy_interval_s`` has passed."""
        last = self._energy_read_at
        if last is not None and now - last < self._energy_interval_s:
            return False
        self._energy_read_at = now
        return True

    def _energy(self) -> dict[str, Any]:
        """The energy counter; a GPU without one (older than Volta, or not exposed) is not
        asked again, and that is not a failure: the counter is optional."""
        try:
            return {"energy_mj": int(self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle))}
        except Exception:
            self._energy_supported = False
            return {}

    def _utilization(self) -> dict[str, Any]:
        rates = self._nvml.nvmlDeviceGetUtilizationRates(self._handle)
        return {"gpu_util_pct": float(rates.gpu), "mem_util_pct": float(rates.memory)}

    def _memory(self) -> dict[str, Any]:
        """Memory from the v2 struct; on failure try v1 and, if that works, stay on v1."""
        nvml = self._nvml
        if self._memory_v2:
            try:
                info = nvml.nvmlDeviceGetMemoryInfo(self._handle, version=nvml.nvmlMemory_v2)
            except Exception as v2_error:
                fields = _memory_v1_fields(nvml.nvmlDeviceGetMemoryInfo(self._handle))
                self._memory_v2 = False
                _log.info(
                    "telemetry.memory_v1_fallback",
                    source=self.name,
                    device_index=self._device_index,
                    error=describe_error(v2_error),
                )
                return fields
            return {**_memory_v1_fields(info), "mem_reserved_bytes": int(info.reserved)}
        return _memory_v1_fields(nvml.nvmlDeviceGetMemoryInfo(self._handle))

    def _fail(self, stage: str, exc: BaseException) -> None:
        """Count a failure; log the first one of this instance as ``telemetry.unavailable``."""
        self._failures += 1
        if self._warned:
            return
        self._warned = True
        _log.warning(
            "telemetry.unavailable",
            source=self.name,
            stage=stage,
            device_index=self._device_index,
            error=describe_error(exc),
        )

    def close(self) -> None:
        """Free the GPM buffers and shut NVML down; idempotent, raises nothing.

        Later :meth:`sample` calls return all-unknown readings.
        """
        with self._lock:
            self._release()

    def _release(self) -> None:
        if self._gpm is not None:
            self._gpm.close()
            self._gpm = None
        self._handle = None
        nvml, self._nvml = self._nvml, None
        if nvml is None:
            return
        try:
            nvml.nvmlShutdown()
        except Exception as exc:
            _log.debug("telemetry.close_failed", source=self.name, error=describe_error(exc))

    def __enter__(self) -> NvmlTelemetry:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _memory_v1_fields(info: Any) -> dict[str, Any]:
    """total / used / free of an NVML memory struct (v1 or v2), in bytes."""
    return {
        "mem_total_bytes": int(info.total),
        "mem_used_bytes": int(info.used),
        "mem_free_bytes": int(info.free),
    }

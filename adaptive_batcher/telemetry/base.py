"""The telemetry sample and the interface every telemetry source implements.

A :class:`TelemetrySample` is one reading of the GPU. Every figure is optional: ``None`` means
*unknown* (no GPU, no NVML, an unsupported metric, a failed call), never zero. Consumers (the
controller, the guards) must treat unknown as "no information", not as "idle" or "full".

About NVML "utilization" (``gpu_util_pct``): it is the fraction of the last sample period during
which *any* kernel ran, not how much of the GPU the kernels used. On an H200 running resnet50 it
reads 28 % at batch 1 and 100 % from batch 64 on, while throughput still rises from 13.5k to
15.5k img/s, and a matmul chain at batch 64 reads 59 % while tensor-core utilization (GPM) is
11 % (both measured by this project on one NVIDIA H200, bf16, eager, reading NVML and GPM while
the model ran back to back). So 100 % NVML
utilization never means "no headroom"; prefer the GPM figures (``sm_util_pct``,
``sm_occupancy_pct``, ``tensor_util_pct``, Hopper and newer) where they are known.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Protocol, runtime_checkable

__all__ = ["Telemetry", "TelemetrySample", "merge"]


@dataclass(frozen=True, slots=True)
class TelemetrySample:
    """One reading of one GPU; ``None`` in any field means unknown.

    Attributes:
        time_s: when the reading was taken, in seconds on the reading side's monotonic clock
            (``time.monotonic`` unless a clock was injected); comparable only with other readings
            of the same process.
        gpu_util_pct: NVML ``utilization.gpu``, 0-100: percent of the sample period in which any
            kernel ran. Saturates at 100 long before the GPU is full (see the module docstring);
            never read it as "no headroom".
        mem_util_pct: NVML ``utilization.memory``, 0-100: percent of the sample period in which
            device memory was read or written.
        sm_util_pct: GPM ``SM_UTIL``, 0-100: percent of SMs busy, averaged between two GPM
            samples (Hopper and newer only).
        sm_occupancy_pct: GPM ``SM_OCCUPANCY``, 0-100: active warps against the theoretical
            maximum (Hopper and newer only).
        tensor_util_pct: GPM ``ANY_TENSOR_UTIL``, 0-100: percent of time the SMs ran any
            tensor-core instruction (Hopper and newer only).
        mem_total_bytes: device memory, bytes (NVML memory info).
        mem_used_bytes: memory allocated by all processes, bytes. With the NVML v2 struct this
            excludes ``mem_reserved_bytes``; with the v1 fallback it includes it.
        mem_free_bytes: memory still allocatable, bytes.
        mem_reserved_bytes: memory the driver and firmware reserve, bytes (NVML v2 only).
        torch_allocated_bytes: bytes held by live tensors in this process
            (``torch.cuda.memory_allocated``).
        torch_reserved_bytes: bytes held by this process's caching allocator, a superset of the
            allocated bytes (``torch.cuda.memory_reserved``).
        energy_mj: the GPU's energy counter, millijoules since the driver was loaded (NVML
            ``nvmlDeviceGetTotalEnergyConsumption``, Volta and newer): differences between
            two readings give the energy spent between them, by every process on the GPU.
        source: the name of the source that produced the reading (``"nvml"``,
            ``"torch_cuda"``, ``"nvml+torch_cuda"``, ``"null"``, ...).
    """

    time_s: float | None = None
    gpu_util_pct: float | None = None
    mem_util_pct: float | None = None
    sm_util_pct: float | None = None
    sm_occupancy_pct: float | None = None
    tensor_util_pct: float | None = None
    mem_total_bytes: int | None = None
    mem_used_bytes: int | None = None
    mem_free_bytes: int | None = None
    mem_reserved_bytes: int | None = None
    torch_allocated_bytes: int | None = None
    torch_reserved_bytes: int | None = None
    energy_mj: int | None = None
    source: str = "unknown"

    @property
    def free_fraction(self) -> float | None:
        """``mem_free_bytes / mem_total_bytes`` clamped to [0, 1]; None if either is unknown.

        Also None when the total is not positive (a broken reading).
        """
        if self.mem_free_bytes is None or self.mem_total_bytes is None:
            return None
        if self.mem_total_bytes <= 0:
            return None
        return min(1.0, max(0.0, self.mem_free_bytes / self.mem_total_bytes))

    @property
    def is_unknown(self) -> bool:
        """True when every measured field (all but ``time_s`` and ``source``) is unknown."""
        return all(
            getattr(self, f.name) is None for f in fields(self) if f.name not in _META_FIELDS
        )


_META_FIELDS = frozenset({"time_s", "source"})


def merge(*samples: TelemetrySample) -> TelemetrySample:
    """Combine readings field by field: the first non-None value wins.

    ``source`` is never None, so the first sample's ``source`` is kept; callers that merge
    several sources usually replace it (``dataclasses.replace(merged, source=...)``). With no
    samples the result is an all-unknown sample. Raises nothing.
    """
    if not samples:
        return TelemetrySample()
    values: dict[str, Any] = {}
    for f in fields(TelemetrySample):
        values[f.name] = next(
            (v for v in (getattr(s, f.name) for s in samples) if v is not None),
            None,
        )
    return TelemetrySample(**values)


@runtime_checkable
class Telemetry(Protocol):
    """A source of GPU readings.

    Implementations never raise from :meth:`sample` because of a missing or failing GPU stack:
    they return unknown fields instead (a failure in the caller's own code may still raise, and
    :class:`~adaptive_batcher.telemetry.TelemetrySampler` catches that too). ``sample`` may be
    called from a background thread, so implementations are thread-safe.
    """

    name: str

    def sample(self) -> TelemetrySample:
        """Take one reading now; unknown fields are None."""
        ...

    def close(self) -> None:
        """Release what the source holds (NVML handles, GPM buffers); idempotent."""
        ...

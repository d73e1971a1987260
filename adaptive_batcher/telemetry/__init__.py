"""GPU telemetry: NVML (+GPM on Hopper and newer), torch.cuda memory, null; one interface.

Typical use: build a source with :func:`auto_telemetry`, read it off the event loop with a
:class:`TelemetrySampler`, and let the controller read ``sampler.latest``::

    source = auto_telemetry()
    with TelemetrySampler(source, rate_hz=20.0) as sampler:
        ...  # sampler.latest is a TelemetrySample; None fields are unknown
    source.close()

NVML "utilization" (``gpu_util_pct``) is the fraction of time any kernel ran: on an H200 it reads
100 % from resnet50 batch 64 on while throughput still rises (measured by this project on one
NVIDIA H200, bf16, eager, reading NVML and GPM while resnet50 ran back to back). Never treat it
as "no headroom"; :func:`utilization_headroom`
uses GPM SM utilization only. Test doubles: ``adaptive_batcher.testing.FakeTelemetry`` and
``adaptive_batcher.testing.FakePynvml``.
"""

from adaptive_batcher.telemetry.auto import auto_telemetry
from adaptive_batcher.telemetry.base import Telemetry, TelemetrySample, merge
from adaptive_batcher.telemetry.combined import CombinedTelemetry
from adaptive_batcher.telemetry.headroom import utilization_headroom
from adaptive_batcher.telemetry.null import NullTelemetry
from adaptive_batcher.telemetry.nvml import NvmlTelemetry
from adaptive_batcher.telemetry.sampler import MAX_RATE_HZ, TelemetrySampler, TelemetryUsage
from adaptive_batcher.telemetry.torch_cuda import TorchCudaMemory

__all__ = [
    "MAX_RATE_HZ",
    "CombinedTelemetry",
    "NullTelemetry",
    "NvmlTelemetry",
    "Telemetry",
    "TelemetrySample",
    "TelemetrySampler",
    "TelemetryUsage",
    "TorchCudaMemory",
    "auto_telemetry",
    "merge",
    "utilization_headroom",
]

"""How much compute is left, estimated from GPM SM utilization only."""

from __future__ import annotations

import math

from adaptive_batcher.telemetry.base import TelemetrySample

__all__ = ["utilization_headroom"]


def utilization_headroom(sample: TelemetrySample) -> float | None:
    """Remaining compute headroom in [0, 1], ``1 - sm_util_pct / 100``; None when unknown.

    Only GPM ``SM_UTIL`` (``sm_util_pct``, Hopper and newer) is used. NVML ``utilization.gpu``
    (``gpu_util_pct``) is deliberately ignored, even when it is the only figure known: it is the
    fraction of time *any* kernel ran, so it saturates long before the GPU does. On an H200,
    resnet50 reads 100 % NVML utilization from batch 64 on while throughput still grows from
    13.5k to 15.5k img/s at batch 256; in the same load GPM SM utilization goes 78 % -> 92 %,
    and a matmul chain reads 59 % NVML utilization at 38 % SM utilization (all measured by this
    project on one NVIDIA H200, bf16, eager, reading NVML and GPM while the load ran). Treating
    NVML 100 % as "no headroom" would stop the batch cap from growing exactly where larger
    batches still pay.

    Returns None (unknown, not "zero headroom") when GPM is unsupported or not yet measured;
    callers then fall back to latency and throughput signals. Values outside 0-100 are clamped;
    a non-finite value counts as unknown.
    Raises nothing.
    """
    if sample.sm_util_pct is None or not math.isfinite(sample.sm_util_pct):
        return None
    return min(1.0, max(0.0, 1.0 - sample.sm_util_pct / 100.0))

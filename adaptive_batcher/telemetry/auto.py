"""Pick the best telemetry this machine offers, without raising."""

from __future__ import annotations

from adaptive_batcher._log import get_logger
from adaptive_batcher.telemetry._util import describe_error
from adaptive_batcher.telemetry.base import Telemetry
from adaptive_batcher.telemetry.combined import CombinedTelemetry
from adaptive_batcher.telemetry.null import NullTelemetry
from adaptive_batcher.telemetry.nvml import NvmlTelemetry
from adaptive_batcher.telemetry.torch_cuda import TorchCudaMemory

__all__ = ["auto_telemetry"]

_log = get_logger()


def auto_telemetry(device_index: int = 0) -> Telemetry:
    """NVML (with GPM where supported) combined with torch.cuda memory, or what is available.

    Returns :class:`CombinedTelemetry` of :class:`NvmlTelemetry` and :class:`TorchCudaMemory`
    when both work, the one that works when only one does, else :class:`NullTelemetry`. On a
    machine without NVML, building the NVML source logs one ``telemetry.unavailable`` warning.

    ``device_index`` is passed to both sources; NVML numbers devices in PCI bus order and
    ignores ``CUDA_VISIBLE_DEVICES`` while torch honours it, so the two agree only when no
    devices are hidden and ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (or one GPU is visible). Otherwise
    build the sources yourself with the right index for each.

    Never raises, not even for a bad ``device_index`` (that gives NullTelemetry and a
    ``telemetry.unavailable`` warning). The caller owns the result and should ``close()`` it.
    """
    sources: list[Telemetry] = []
    try:
        nvml = NvmlTelemetry(device_index)
        if nvml.available:
            sources.append(nvml)
        torch_memory = TorchCudaMemory(device_index)
        if torch_memory.available:
            sources.append(torch_memory)
    except Exception as exc:
        for source in sources:
            source.close()
        _log.warning(
            "telemetry.unavailable", source="auto", stage="init", error=describe_error(exc)
        )
        return NullTelemetry()
    if not sources:
        return NullTelemetry()
    if len(sources) == 1:
        return sources[0]
    return CombinedTelemetry(*sources)

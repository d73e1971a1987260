"""This process's view of GPU memory, from ``torch.cuda``.

``torch`` is imported when a :class:`TorchCudaMemory` is built, never when this module is
imported; without torch or without CUDA every figure is unknown.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from adaptive_batcher._log import get_logger
from adaptive_batcher._validate import check_int
from adaptive_batcher.telemetry._util import describe_error
from adaptive_batcher.telemetry.base import TelemetrySample

__all__ = ["TorchCudaMemory"]

_log = get_logger()


class TorchCudaMemory:
    """Allocator and device memory of one CUDA device as torch sees it.

    Fields set: ``torch_allocated_bytes`` (``torch.cuda.memory_allocated``: live tensors),
    ``torch_reserved_bytes`` (``torch.cuda.memory_reserved``: the caching allocator's pool) and
    ``mem_free_bytes`` / ``mem_total_bytes`` (``torch.cuda.mem_get_info``, i.e.
    ``cudaMemGetInfo``: the whole device, all processes). The last two are read only once this
    process has initialised CUDA: reading them earlier would create a CUDA context as a side
    effect of telemetry, so until then they are None.

    Unknown (None) everywhere when torch is missing, CUDA is unavailable or ``device`` is not a
    visible CUDA device; that is expected on CPU machines and logged only at debug level. A call
    that fails at sample time gives unknowns and is logged once per instance as the warning
    ``telemetry.unavailable`` (keys ``source``, ``stage``, ``device``, ``error``).

    Args:
        device: torch's CUDA device index (after ``CUDA_VISIBLE_DEVICES``), an int >= 0
            (TypeError / ValueError otherwise).
        clock: monotonic clock stamping ``time_s``, in seconds (default ``time.monotonic``).
    """

    name = "torch_cuda"

    def __init__(self, device: int = 0, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._device = check_int("device", device, 0)
        self._clock = clock
        self._lock = threading.Lock()
        self._warned = False
        self._torch: Any = _cuda_torch(self._device)

    @property
    def available(self) -> bool:
        """True when torch has CUDA and ``device`` is one of its devices (False after close)."""
        return self._torch is not None

    def sample(self) -> TelemetrySample:
        """One reading now; unknown fields are None. Raises nothing."""
        now = self._clock()
        torch = self._torch
        if torch is None:
            return TelemetrySample(time_s=now, source=self.name)
        try:
            values = _read(torch.cuda, self._device)
        except Exception as exc:
            self._warn_once(exc)
            return TelemetrySample(time_s=now, source=self.name)
        return TelemetrySample(time_s=now, source=self.name, **values)

    def _warn_once(self, exc: BaseException) -> None:
        with self._lock:
            if self._warned:
                return
            self._warned = True
        _log.warning(
            "telemetry.unavailable",
            source=self.name,
            stage="memory",
            device=self._device,
            error=describe_error(exc),
        )

    def close(self) -> None:
        """Stop reading (later samples are all unknown); torch keeps its own state. Idempotent."""
        self._torch = None


def _read(cuda: Any, device: int) -> dict[str, Any]:
    """Allocator figures always; device free/total only once CUDA is initialised."""
    values: dict[str, Any] = {
        "torch_allocated_bytes": int(cuda.memory_allocated(device)),
        "torch_reserved_bytes": int(cuda.memory_reserved(device)),
    }
    if cuda.is_initialized():
        free_bytes, total_bytes = cuda.mem_get_info(device)
        values["mem_free_bytes"] = int(free_bytes)
        values["mem_total_bytes"] = int(total_bytes)
    return values


def _cuda_torch(device: int) -> Any:
    """The torch module when it has CUDA and ``device`` exists, else None (logged at debug)."""
    try:
        import torch

        if torch.cuda.is_available() and device < torch.cuda.device_count():
            return torch
        reason = f"CUDA unavailable or no device {device}"
    except Exception as exc:  # ImportError, or a broken install raising OSError and the like
        reason = describe_error(exc)
    _log.debug("telemetry.unavailable", source="torch_cuda", stage="init", error=reason)
    return None

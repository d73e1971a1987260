"""How the sweep synchronises, and reads peak memory, on each kind of device.

Two backends with the same three-method shape:

- :class:`CpuBackend`: nothing to synchronise; memory is the growth of the process's peak resident
  set size (``resource.getrusage(RUSAGE_SELF).ru_maxrss``, stdlib; psutil is not used) since the
  backend was made, i.e. since the start of the sweep.
- :class:`CudaBackend`: ``torch.cuda.synchronize`` around each timed call, and the caching
  allocator's peak (``torch.cuda.reset_peak_memory_stats`` before the timed calls,
  ``torch.cuda.max_memory_allocated`` after them).

torch is imported lazily, so the package imports (and the CPU path runs) without it. Every torch
call goes through the ``torch.cuda`` module attributes at call time, so tests can replace them with
fakes (``monkeypatch.setattr(torch.cuda, "synchronize", fake)``) and run the CUDA path on a CPU.
"""

from __future__ import annotations

import gc
import re
import sys
from typing import Any, Protocol

from adaptive_batcher._oom import is_out_of_memory
from adaptive_batcher._validate import check_str

__all__ = [
    "CpuBackend",
    "CudaBackend",
    "DeviceBackend",
    "cuda_available",
    "is_out_of_memory",
    "make_backend",
    "resolve_device",
]

_CUDA_DEVICE = re.compile(r"cuda(:\d+)?")


class DeviceBackend(Protocol):
    """What the sweep needs from a device: a description, a barrier, a memory high-water mark."""

    @property
    def description(self) -> str:
        """Human-readable device, stored as ``ProfileResult.device`` (e.g. ``"cpu"``)."""
        ...

    def synchronize(self) -> None:
        """Block until all work queued on the device is done (no-op on CPU)."""
        ...

    def start_memory_window(self) -> None:
        """Start measuring the peak memory of the calls that follow."""
        ...

    def peak_memory_bytes(self) -> int | None:
        """Peak memory since :meth:`start_memory_window`, bytes; None where it cannot be read."""
        ...

    def release_memory(self) -> None:
        """Give cached memory back after an out-of-memory error."""
        ...


def _import_torch() -> Any:
    """``torch``, or None if it is not installed."""
    try:
        import torch
    except ImportError:
        return None
    return torch


def cuda_available() -> bool:
    """True if torch is installed and ``torch.cuda.is_available()`` says so."""
    torch = _import_torch()
    return torch is not None and bool(torch.cuda.is_available())


def resolve_device(device: object) -> str:
    """Turn a ``device`` argument into ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.

    ``"auto"`` means CUDA when :func:`cuda_available`, else CPU.

    Raises:
        TypeError: ``device`` is not a str.
        ValueError: ``device`` is not ``"auto"``, ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
        RuntimeError: a CUDA device was asked for but torch is missing or sees no GPU.
    """
    device = check_str("device", device)
    if device == "auto":
        return "cuda" if cuda_available() else "cpu"
    if device == "cpu":
        return device
    if _CUDA_DEVICE.fullmatch(device):
        if not cuda_available():
            raise RuntimeError(
                f"device={device!r} but CUDA is not available "
                "(torch is not installed or torch.cuda.is_available() is False)"
            )
        return device
    raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}")


def _ru_maxrss_bytes() -> int | None:
    """The process's peak RSS, bytes (Linux reports KiB, macOS bytes); None without ``resource``."""
    try:
        import resource
    except ImportError:  # Windows
        return None
    peak = int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    return peak if sys.platform == "darwin" else peak * 1024


class CpuBackend:
    """CPU: no barrier; memory = growth of the process peak RSS since this backend was made.

    ``ru_maxrss`` is a high-water mark for the whole process life, so the value for a batch size is
    how far the sweep (run in ascending batch sizes) has pushed the peak above where it stood at
    the start: an estimate of the extra memory the largest batch so far needs, 0 when the peak was
    already higher before the sweep. None on platforms without the ``resource`` module.
    """

    description = "cpu"

    def __init__(self) -> None:
        self._baseline_bytes = _ru_maxrss_bytes()

    def synchronize(self) -> None:
        """Nothing to wait for on the CPU."""

    def start_memory_window(self) -> None:
        """The window starts at the sweep's start (see the class docstring)."""

    def peak_memory_bytes(self) -> int | None:
        """``ru_maxrss`` now minus at the start of the sweep, bytes (>= 0), or None."""
        now = _ru_maxrss_bytes()
        if now is None or self._baseline_bytes is None:
            return None
        return max(now - self._baseline_bytes, 0)

    def release_memory(self) -> None:
        """Collect garbage so the next sweep does not start with the failed batch's leftovers."""
        gc.collect()


class CudaBackend:
    """One CUDA device through ``torch.cuda``: synchronize, reset/read the allocator's peak.

    The peak is ``torch.cuda.max_memory_allocated`` after a ``reset_peak_memory_stats``: the most
    memory held by tensors at any point of the timed calls, *including* the weights and the input
    batch that were already allocated (as in the H200 tables shipped in
    ``adaptive_batcher/data/h200/``, whose ``peak_mib`` includes the weights).

    Args:
        device: ``"cuda"`` (the current device) or ``"cuda:N"``.
    """

    def __init__(self, device: str) -> None:
        import torch

        self._torch = torch
        dev = torch.device(device)
        index: int | None = dev.index  # None for a bare "cuda" (torch's stub says int)
        if index is None:
            dev = torch.device("cuda", int(torch.cuda.current_device()))
        self._device = dev
        self._description = f"{dev} ({torch.cuda.get_device_name(dev)})"

    @property
    def description(self) -> str:
        """``"cuda:N (device name)"``."""
        return self._description

    def synchronize(self) -> None:
        """``torch.cuda.synchronize(device)``."""
        self._torch.cuda.synchronize(self._device)

    def start_memory_window(self) -> None:
        """``torch.cuda.reset_peak_memory_stats(device)``."""
        self._torch.cuda.reset_peak_memory_stats(self._device)

    def peak_memory_bytes(self) -> int | None:
        """``torch.cuda.max_memory_allocated(device)``, bytes."""
        return int(self._torch.cuda.max_memory_allocated(self._device))

    def release_memory(self) -> None:
        """``gc.collect()`` then ``torch.cuda.empty_cache()``."""
        gc.collect()
        self._torch.cuda.empty_cache()


def make_backend(device: str) -> DeviceBackend:
    """The backend for a device already passed through :func:`resolve_device`."""
    if device == "cpu":
        return CpuBackend()
    return CudaBackend(device)

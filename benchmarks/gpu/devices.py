"""Where the script runs: a real CUDA device with NVML, or the CPU with the project's fakes.

Both platforms offer the same few operations the phases need: the torch device and dtype, the
completion events of the CUDA executor, the ``pynvml`` module for the raw NVML calls (driver,
name, power), free memory, a background load on the device, and a memory squeeze (most of the
free memory taken by an allocation of "another tenant").

:class:`DryRunPlatform` is the CPU stand-in of the test suite: ``pynvml`` is
:class:`FakeH200Nvml` (the public :class:`~adaptive_batcher.testing.FakePynvml` with the power
reading, the names and an energy counter that advances with time), the CUDA events are
:class:`~adaptive_batcher.testing.FakeCudaEvent`, and the squeeze makes the model raise
``torch.OutOfMemoryError`` for batches that would not fit the memory left.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import torch

from adaptive_batcher.testing import EagerGraphCapture, FakeCudaEvent, FakePynvml

__all__ = ["CudaPlatform", "DryRunPlatform", "FakeH200Nvml", "Platform"]

GIB = 2**30
MIB = 2**20

Model = Callable[[list[Any]], Sequence[Any]]


class Platform(Protocol):
    """What the phases need from the machine."""

    name: str
    device: torch.device
    dtype: torch.dtype

    def activate(self) -> contextlib.AbstractContextManager[None]:
        """Install what the platform needs for the run's duration (the dry run's fakes)."""
        ...

    def event_factory(self) -> Callable[[], Any] | None:
        """The CUDA executor's completion events; None: ``torch.cuda.Event``."""
        ...

    def graph_capture(self) -> Any:
        """How ``CudaGraphs`` captures a graph here; None: the real CUDA capture."""
        ...

    def nvml(self) -> Any:
        """The ``pynvml`` module (real or fake)."""
        ...

    def synchronize(self) -> None:
        """Wait for the device's queued work."""
        ...

    def mem_get_info(self) -> tuple[int, int]:
        """(free, total) device memory, bytes."""
        ...

    def reset_peak_memory(self) -> None: ...

    def peak_memory_mib(self) -> float:
        """Peak memory allocated by this process since the last reset, MiB (NaN: unknown)."""
        ...

    def load(self) -> contextlib.AbstractContextManager[None]:
        """Keep the device busy while inside."""
        ...

    def squeeze(self, leave_bytes: int) -> int:
        """Take the free memory but ``leave_bytes``; returns the bytes taken."""
        ...

    def release(self) -> None:
        """Give the squeezed memory back."""
        ...

    def wrap_model(self, fn: Model) -> Model:
        """The model as the batcher should call it on this platform."""
        ...

    def environment(self) -> list[tuple[str, str]]:
        """Facts about the device for the environment table."""
        ...


class CudaPlatform:
    """A CUDA device (torch) with NVML (nvidia-ml-py)."""

    name = "cuda"

    def __init__(self, index: int = 0) -> None:
        if not torch.cuda.is_available():
            raise RuntimeError("no CUDA device: torch.cuda.is_available() is False")
        self.device = torch.device("cuda", index)
        self.dtype = torch.bfloat16
        self._block: torch.Tensor | None = None
        torch.cuda.set_device(self.device)
        torch.cuda.init()  # type: ignore[no-untyped-call]

    def activate(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def event_factory(self) -> Callable[[], Any] | None:
        return None

    def graph_capture(self) -> Any:
        return None

    def nvml(self) -> Any:
        import pynvml

        return pynvml

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)

    def mem_get_info(self) -> tuple[int, int]:
        free, total = torch.cuda.mem_get_info(self.device)
        return int(free), int(total)

    def reset_peak_memory(self) -> None:
        torch.cuda.reset_peak_memory_stats(self.device)

    def peak_memory_mib(self) -> float:
        return torch.cuda.max_memory_allocated(self.device) / MIB

    @contextlib.contextmanager
    def load(self) -> Iterator[None]:
        """bf16 8192^3 matrix products back to back in a thread (it waits on the device
        between products, so it holds the GIL little)."""
        stop = threading.Event()
        operands = [torch.randn(8192, 8192, device=self.device, dtype=self.dtype) for _ in "ab"]

        def spin() -> None:
            a, b = operands
            while not stop.is_set():
                for _ in range(4):
                    torch.mm(a, b)
                torch.cuda.synchronize(self.device)

        thread = threading.Thread(target=spin, name="gpu-load", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()
            operands.clear()
            torch.cuda.empty_cache()

    def squeeze(self, leave_bytes: int) -> int:
        """One plain allocation (cudaMalloc through torch's allocator) of the free memory but
        ``leave_bytes``, after the allocator's unused cache is released; 256 MiB less per
        retry if it does not fit."""
        torch.cuda.empty_cache()
        free, _ = self.mem_get_info()
        size = free - leave_bytes
        for _ in range(8):
            if size <= 0:
                return 0
            try:
                self._block = torch.empty(size, dtype=torch.uint8, device=self.device)
                return size
            except torch.OutOfMemoryError:
                size -= 256 * MIB
        return 0

    def release(self) -> None:
        self._block = None
        torch.cuda.empty_cache()

    def wrap_model(self, fn: Model) -> Model:
        return fn

    def environment(self) -> list[tuple[str, str]]:
        props = torch.cuda.get_device_properties(self.device)
        return [
            ("torch_device_name", torch.cuda.get_device_name(self.device)),
            ("compute_capability", f"{props.major}.{props.minor}"),
            ("multiprocessors", str(props.multi_processor_count)),
            ("torch_total_memory_gib", f"{props.total_memory / GIB:.2f}"),
            ("cudnn_version", str(torch.backends.cudnn.version())),  # type: ignore[no-untyped-call]
            ("cudnn_benchmark", str(torch.backends.cudnn.benchmark)),
            ("cuda_module_loading", os.environ.get("CUDA_MODULE_LOADING", "")),
        ]


class FakeH200Nvml(FakePynvml):
    """:class:`~adaptive_batcher.testing.FakePynvml` with what the script reads beyond the
    library: the power draw (``nvmlDeviceGetPowerUsage``, mW), the device name, the driver
    version, and an energy counter that advances at the power draw as time passes.

    ``idle()`` and ``busy()`` set the figures of an idle and a loaded H200 (roughly: 75 W and
    GPM near 0; 600 W, NVML 100 %, GPM SM 92 %).
    """

    def __init__(self) -> None:
        super().__init__()
        self.power_w = 75.0
        self._energy_lock = threading.Lock()
        self._energy_at = time.monotonic()
        self._energy_j = float(self.energy_mj) / 1e3
        self.idle()

    def idle(self) -> None:
        self._advance()
        self.power_w = 75.0
        self.gpu_util_pct, self.mem_util_pct = 0, 0
        self.gpm_values = {2: 0.1, 3: 0.1, 5: 0.0}

    def busy(self) -> None:
        self._advance()
        self.power_w = 600.0
        self.gpu_util_pct, self.mem_util_pct = 100, 40
        self.gpm_values = {2: 91.6, 3: 51.7, 5: 60.0}

    def _advance(self) -> None:
        with self._energy_lock:
            now = time.monotonic()
            self._energy_j += self.power_w * (now - self._energy_at)
            self._energy_at = now
            self.energy_mj = int(self._energy_j * 1e3)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:  # noqa: N802
        self._advance()
        return super().nvmlDeviceGetTotalEnergyConsumption(handle)

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:  # noqa: N802 - pynvml's name
        self.nvmlDeviceGetUtilizationRates(handle)  # the same checks (init, handle)
        return int(self.power_w * 1e3)

    def nvmlDeviceGetName(self, handle: Any) -> str:  # noqa: N802 - pynvml's name
        self.nvmlDeviceGetUtilizationRates(handle)
        return "NVIDIA H200 (FakeH200Nvml, dry run)"

    def nvmlSystemGetDriverVersion(self) -> str:  # noqa: N802 - pynvml's name
        self.nvmlDeviceGetCount()
        return "dry-run"


class DryRunPlatform:
    """The CPU with fakes: FakeH200Nvml as ``pynvml``, FakeCudaEvent for the CUDA executor,
    and a memory squeeze under which a batch of more than ``leave_bytes / bytes_per_item``
    items raises ``torch.OutOfMemoryError``.

    Args:
        bytes_per_item: the fake activation memory of one item (default 0.5 GiB: with the
            1 GiB the squeeze leaves, every batch of more than two items fails while squeezed,
            so a burst splits in a few steps and a cap of 4 or more meets an OOM).
    """

    name = "dry-run"

    def __init__(self, bytes_per_item: int = GIB // 2) -> None:
        self.device = torch.device("cpu")
        self.dtype = torch.float32
        self.fake = FakeH200Nvml()
        self.bytes_per_item = bytes_per_item
        self._left: int | None = None
        self._used_before = self.fake.memory_used_bytes

    @contextlib.contextmanager
    def activate(self) -> Iterator[None]:
        """``pynvml`` is the fake and torch runs one CPU thread while inside (two threads
        spinning on a shared machine made the tiny models 100x slower); both, and
        FakeCudaEvent's class-wide log, are put back after."""
        previous, threads = sys.modules.get("pynvml"), torch.get_num_threads()
        events = (FakeCudaEvent.created, FakeCudaEvent.synchronized_threads)
        sys.modules["pynvml"] = self.fake  # type: ignore[assignment]
        torch.set_num_threads(1)
        FakeCudaEvent.synchronized_threads = []
        try:
            yield
        finally:
            FakeCudaEvent.created, FakeCudaEvent.synchronized_threads = events
            torch.set_num_threads(threads)
            if previous is None:
                sys.modules.pop("pynvml", None)
            else:
                sys.modules["pynvml"] = previous

    def event_factory(self) -> Callable[[], Any] | None:
        return FakeCudaEvent

    def graph_capture(self) -> Any:
        return EagerGraphCapture()

    def nvml(self) -> Any:
        return self.fake

    def synchronize(self) -> None:
        """Nothing queued on a CPU."""

    def mem_get_info(self) -> tuple[int, int]:
        return self.fake.memory_free_bytes, self.fake.memory_total_bytes

    def reset_peak_memory(self) -> None:
        """Not tracked on the CPU."""

    def peak_memory_mib(self) -> float:
        return float("nan")

    @contextlib.contextmanager
    def load(self) -> Iterator[None]:
        self.fake.busy()
        try:
            yield
        finally:
            self.fake.idle()

    def squeeze(self, leave_bytes: int) -> int:
        taken = self.fake.memory_free_bytes - leave_bytes
        self.fake.memory_used_bytes += taken
        self._left = leave_bytes
        return taken

    def release(self) -> None:
        self.fake.memory_used_bytes = self._used_before
        self._left = None

    def wrap_model(self, fn: Model) -> Model:
        def model(items: list[Any]) -> Sequence[Any]:
            left = self._left
            if left is not None and len(items) * self.bytes_per_item > left:
                raise torch.OutOfMemoryError(
                    f"CUDA out of memory (dry run): {len(items)} items need "
                    f"{len(items) * self.bytes_per_item} bytes, {left} free"
                )
            return fn(items)

        return model

    def environment(self) -> list[tuple[str, str]]:
        return [
            ("torch_device_name", "cpu (dry run: FakeH200Nvml, FakeCudaEvent)"),
            ("torch_threads", str(torch.get_num_threads())),
        ]

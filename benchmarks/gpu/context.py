"""What the phases share: the run's settings, the platform, the telemetry source, the event
counter, the time budget, and the ResNet (built once, by the first phase that needs it)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from adaptive_batcher.telemetry import Telemetry, auto_telemetry
from benchmarks.gpu.config import RunConfig
from benchmarks.gpu.devices import Platform
from benchmarks.gpu.models import build_resnet, graphed_forward, resnet_forward
from benchmarks.gpu.results import EventCounter

__all__ = ["Context", "Resnet", "nvml_handle"]


@dataclass(frozen=True)
class Resnet:
    """The served model: the batch function as the batcher calls it, and its provenance."""

    forward: Callable[[list[Any]], Any]
    source: str
    build_s: float
    model: Any
    inputs: Any


@dataclass
class Context:
    """Shared by the phases of one run.

    ``deadline_s`` is the end of the run's budget (``time.monotonic``); ``reserve_s`` the time
    the phases after the current one need, which the current one leaves them.
    """

    config: RunConfig
    platform: Platform
    events: EventCounter
    deadline_s: float
    reserve_s: float = 0.0
    _telemetry: Telemetry | None = None
    _resnet: Resnet | None = None
    _graphed: tuple[Callable[[list[Any]], Any], float] | None = None
    notes: list[str] = field(default_factory=list)

    def remaining_s(self) -> float:
        """Seconds left of the run's budget."""
        return self.deadline_s - time.monotonic()

    @property
    def telemetry(self) -> Telemetry:
        """The run's telemetry source (``auto_telemetry()``: NVML with GPM, and torch.cuda
        memory), made on first use; :meth:`close` closes it."""
        if self._telemetry is None:
            self._telemetry = auto_telemetry()
        return self._telemetry

    def resnet(self) -> Resnet:
        """The ResNet behind every batcher, its images already on the device (one per slot
        of the largest batch)."""
        if self._resnet is None:
            config, platform = self.config, self.platform
            start = time.perf_counter()
            model, source = build_resnet(
                config.resnet_layers,
                config.resnet_width,
                platform.device,
                platform.dtype,
                prefer_torchvision=config.prefer_torchvision,
                channels_last=config.channels_last,
            )
            rows = max(config.cap, config.naive_cap)
            size = config.image_size
            inputs = torch.randn(rows, 3, size, size, device=platform.device, dtype=platform.dtype)
            if config.channels_last:
                inputs = inputs.contiguous(memory_format=torch.channels_last)
            forward = platform.wrap_model(resnet_forward(model, inputs))
            platform.synchronize()
            self._resnet = Resnet(forward, source, time.perf_counter() - start, model, inputs)
        return self._resnet

    @property
    def graph_capture_s(self) -> float | None:
        """Seconds the CUDA graphs' capture took; None: not captured."""
        return None if self._graphed is None else self._graphed[1]

    def graphed_resnet(self) -> tuple[Callable[[list[Any]], Any], float]:
        """The ResNet's batch function over one CUDA graph per bucket, and the seconds the
        capture took (made on first use)."""
        if self._graphed is None:
            resnet, platform = self.resnet(), self.platform
            start = time.perf_counter()
            capture = platform.graph_capture()
            graphed = graphed_forward(resnet.model, resnet.inputs, self.config.buckets, capture)
            platform.synchronize()
            self._graphed = (platform.wrap_model(graphed), time.perf_counter() - start)
        return self._graphed

    def close(self) -> None:
        if self._telemetry is not None:
            self._telemetry.close()
            self._telemetry = None


@contextlib.contextmanager
def nvml_handle(ctx: Context) -> Iterator[tuple[Any, Any]]:
    """``(pynvml, handle of device 0)`` between ``nvmlInit`` and ``nvmlShutdown``."""
    nvml = ctx.platform.nvml()
    nvml.nvmlInit()
    try:
        yield nvml, nvml.nvmlDeviceGetHandleByIndex(0)
    finally:
        nvml.nvmlShutdown()

"""Small helpers shared by the telemetry tests."""

from __future__ import annotations

import time
from collections.abc import Callable, MutableMapping
from typing import Any

import pytest

GIB = 2**30


def warnings_named(logs: list[MutableMapping[str, Any]], event: str) -> list[dict[str, Any]]:
    """The captured warning-level events called ``event``."""
    return [dict(e) for e in logs if e["event"] == event and e["log_level"] == "warning"]


def wait_until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    """Poll ``condition`` every millisecond; fail the test if it is not true by the deadline."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"condition not met within {timeout_s} s")
        time.sleep(0.001)


class ScriptedCuda:
    """The part of ``torch.cuda`` that TorchCudaMemory uses."""

    def __init__(self, *, device_count: int = 1, initialized: bool = True) -> None:
        self._device_count = device_count
        self.initialized = initialized
        self.fail_mem_get_info = False
        self.calls: list[tuple[str, int]] = []

    def is_available(self) -> bool:
        return self._device_count > 0

    def device_count(self) -> int:
        return self._device_count

    def is_initialized(self) -> bool:
        return self.initialized

    def memory_allocated(self, device: int) -> int:
        self.calls.append(("memory_allocated", device))
        return 3 * GIB + device

    def memory_reserved(self, device: int) -> int:
        self.calls.append(("memory_reserved", device))
        return 4 * GIB + device

    def mem_get_info(self, device: int) -> tuple[int, int]:
        self.calls.append(("mem_get_info", device))
        if self.fail_mem_get_info:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return 100 * GIB, 140 * GIB

"""Stand-ins for ``torch.cuda.Event`` and CUDA graph capture, so the CUDA executor and
:class:`~adaptive_batcher.runtime.cuda_graphs.CudaGraphs` run and are tested without a GPU."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

__all__ = ["EagerGraphCapture", "FakeCudaEvent"]


class FakeCudaEvent:
    """Records the calls the CUDA executor makes; ``synchronize`` can block until released.

    Class attributes count events across instances, so a test can check that every batch
    recorded one event and waited on it from a thread other than the event loop's.

    Args:
        gate: if given, ``synchronize`` blocks until this event is set (simulates a busy GPU).
    """

    created = 0
    synchronized_threads: list[str] = []  # noqa: RUF012 - shared log, reset by tests

    def __init__(self, gate: threading.Event | None = None) -> None:
        type(self).created += 1
        self.recorded = False
        self.synchronized = False
        self._gate = gate

    @classmethod
    def reset(cls) -> None:
        """Forget the calls seen so far."""
        cls.created = 0
        cls.synchronized_threads = []

    def record(self) -> None:
        """Mark the point in the (imaginary) stream after the model's kernels."""
        self.recorded = True

    def synchronize(self) -> None:
        """Wait for the (imaginary) GPU; raises if ``record`` was never called."""
        if not self.recorded:
            raise RuntimeError("synchronize() before record()")
        if self._gate is not None:
            self._gate.wait()
        self.synchronized = True
        type(self).synchronized_threads.append(threading.current_thread().name)


class EagerGraphCapture:
    """A stand-in for :func:`adaptive_batcher.runtime.cuda_graphs.capture_cuda_graph` on a CPU.

    Called as ``capture(forward, warmup_calls)``: calls ``forward`` ``warmup_calls`` times, then
    once for the output, and returns a replay that reruns it and writes the result into that
    output, as a graph's replay would. ``captures`` and ``replays`` count the calls.
    """

    def __init__(self) -> None:
        self.captures = 0
        self.replays = 0

    def __call__(self, forward: Callable[[], Any], warmup_calls: int) -> tuple[Any, Any]:
        for _ in range(warmup_calls):
            forward()
        output = forward()
        self.captures += 1

        def replay() -> None:
            self.replays += 1
            output.copy_(forward())

        return replay, output

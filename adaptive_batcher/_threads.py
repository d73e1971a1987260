"""CPU cores and torch's thread pools: how many there are, and setting torch's for a while.

torch is never imported here unless a caller asks to set its thread count: a process that has
not imported torch is not running a torch model, so there are no torch threads to report.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from adaptive_batcher._validate import check_int

__all__ = ["TorchThreads", "available_cores", "current_torch_threads", "use_torch_threads"]


def available_cores() -> int | None:
    """CPU cores this process may run on: ``len(os.sched_getaffinity(0))`` where the platform
    has it (Linux; it honours ``taskset`` and container CPU sets), else ``os.cpu_count()``.

    Returns None when neither is known.
    """
    getaffinity = getattr(os, "sched_getaffinity", None)
    if getaffinity is not None:
        return len(getaffinity(0))
    return os.cpu_count()


@dataclass(frozen=True, slots=True)
class TorchThreads:
    """torch's two CPU thread pools, as ``torch.get_num_threads()`` and
    ``torch.get_num_interop_threads()`` report them.

    Attributes:
        intra_op: threads one operator (a matmul) is split across.
        inter_op: threads independent operators run on in parallel (TorchScript, ``fork``).
    """

    intra_op: int
    inter_op: int


def current_torch_threads() -> TorchThreads | None:
    """torch's thread counts now, or None when torch has not been imported by this process."""
    torch: Any = sys.modules.get("torch")
    if torch is None:
        return None
    return TorchThreads(int(torch.get_num_threads()), int(torch.get_num_interop_threads()))


@contextmanager
def use_torch_threads(threads: int | None, *, option: str = "threads") -> Iterator[None]:
    """Within the block, ``torch.set_num_threads(threads)``; the previous count is restored after.

    ``threads=None`` changes nothing (and needs no torch). Only the intra-op pool is set: torch
    allows the inter-op pool to be sized once per process, before any parallel work.

    torch keeps the count per thread once a thread has run a parallel operator; threads that
    start using torch inside the block take the new count.

    Raises:
        TypeError, ValueError: ``threads`` is not an int >= 1 (the message names ``option``).
        RuntimeError: ``threads`` is given but torch is not installed.
    """
    if threads is None:
        yield
        return
    check_int(option, threads, 1)
    try:
        import torch
    except ImportError:
        raise RuntimeError(
            f"{option}={threads} sets torch's thread count, but torch is not installed"
        ) from None
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)

"""An asyncio event loop on a virtual clock: sleeps and timers take no real time.

With :class:`VirtualClockLoop`, ``loop.time()`` starts at ``start_s`` and only moves when the
loop has nothing ready to run: it then jumps straight to the next timer (an ``asyncio.sleep``,
a ``call_at``, a batcher's window or deadline). A test of an hour of traffic against an
``async def`` model that sleeps for its service time runs in the time the Python code takes,
and gives the same answer on every run (the idea of trio's ``MockClock(autojump_threshold=0)``).

Only what runs on the loop is virtual: work in threads (a sync model in ``executor="thread"``)
takes real time while the virtual clock stands still, so use ``async def`` models that
``await asyncio.sleep(service_s)`` for deterministic tests.

Example::

    from adaptive_batcher.testing import run_in_virtual_time

    async def main() -> float:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(3600.0)      # returns at once
        return loop.time()               # 3600.0

    assert run_in_virtual_time(main()) == 3600.0
"""

from __future__ import annotations

import asyncio
import math
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["VirtualClockLoop", "run_in_virtual_time"]

T = TypeVar("T")


class _JumpingSelector(selectors.DefaultSelector):
    """Polls file descriptors without blocking; where the loop would sleep, moves its clock."""

    def __init__(self, loop: VirtualClockLoop) -> None:
        super().__init__()
        self._loop = loop

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = super().select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:  # nothing scheduled: only another thread can wake the loop
            return super().select(None)
        self._loop.jump(timeout)
        return []


class VirtualClockLoop(asyncio.SelectorEventLoop):
    """An event loop whose ``time()`` jumps to the next timer instead of sleeping.

    Args:
        start_s: the clock's starting value, seconds.
    """

    def __init__(self, start_s: float = 0.0) -> None:
        self._virtual_now = float(start_s)
        super().__init__(_JumpingSelector(self))
        # timers fire when due to the exact instant (asyncio allows for a clock's resolution)
        self._clock_resolution = 1e-12

    def time(self) -> float:
        """The virtual clock, seconds."""
        return self._virtual_now

    def stall(self, seconds: float) -> None:
        """Move the clock ``seconds`` ahead at once, as if the loop had been blocked that long
        by the code running now (a garbage-collector pause, a blocking call): the timers due
        meanwhile fire late, in order, as on a real loop.

        Raises:
            ValueError: a negative or non-finite ``seconds``.
        """
        if not 0.0 <= seconds < math.inf:
            raise ValueError(f"seconds must be finite and >= 0, got {seconds!r}")
        self._virtual_now += seconds

    def jump(self, timeout_s: float) -> None:
        """Move the clock to the next timer (exactly its time), at most ``timeout_s`` ahead."""
        target = self._virtual_now + timeout_s
        scheduled: list[Any] = getattr(self, "_scheduled", [])
        if scheduled:  # the due time itself, not now + (due - now), which may round
            target = min(target, max(self._virtual_now, scheduled[0].when()))
        self._virtual_now = target


def run_in_virtual_time(main: Coroutine[Any, Any, T], *, start_s: float = 0.0) -> T:
    """Run ``main`` to completion on a new :class:`VirtualClockLoop` and close it.

    Raises:
        Exception: whatever ``main`` raises.
    """
    loop = VirtualClockLoop(start_s)
    try:
        return loop.run_until_complete(main)
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()

"""The virtual-clock event loop: sleeps take no real time, timers fire at their exact time."""

from __future__ import annotations

import asyncio
import time

import pytest

from adaptive_batcher.testing import VirtualClockLoop, run_in_virtual_time


def test_an_hour_of_sleep_takes_no_real_time() -> None:
    async def main() -> float:
        await asyncio.sleep(3600.0)
        return asyncio.get_running_loop().time()

    started = time.monotonic()
    assert run_in_virtual_time(main()) == 3600.0
    assert time.monotonic() - started < 5.0  # generous: only Python's own work counts


def test_timers_fire_in_order_at_their_exact_times() -> None:
    fired: list[tuple[str, float]] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for name, at in (("b", 0.3), ("a", 0.1), ("c", 0.35)):
            loop.call_at(at, lambda n=name: fired.append((n, loop.time())))
        await asyncio.sleep(1.0)

    run_in_virtual_time(main(), start_s=0.0)
    assert fired == [("a", 0.1), ("b", 0.3), ("c", 0.35)]


def test_work_on_the_loop_does_not_move_the_clock() -> None:
    async def main() -> tuple[float, float]:
        loop = asyncio.get_running_loop()
        before = loop.time()
        sum(range(200_000))  # real work, no await
        await asyncio.sleep(0)
        return before, loop.time()

    before, after = run_in_virtual_time(main(), start_s=12.5)
    assert before == after == 12.5


def test_a_thread_still_wakes_the_loop() -> None:
    loop = VirtualClockLoop()
    try:
        result = loop.run_until_complete(asyncio.to_thread(lambda: 41 + 1))
    finally:
        loop.close()
    assert result == 42


def test_a_stall_makes_the_timers_due_meanwhile_fire_late_in_order() -> None:
    fired: list[tuple[str, float]] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, VirtualClockLoop)
        for name, at in (("b", 0.3), ("a", 0.1), ("c", 0.5)):
            loop.call_at(at, lambda n=name: fired.append((n, loop.time())))
        loop.call_at(0.05, loop.stall, 0.3)  # blocked from 0.05 s to 0.35 s
        await asyncio.sleep(1.0)
        with pytest.raises(ValueError, match="seconds"):
            loop.stall(-1.0)

    run_in_virtual_time(main(), start_s=0.0)
    assert [name for name, _ in fired] == ["a", "b", "c"]
    assert fired[0][1] == fired[1][1] == pytest.approx(0.35)  # late, both at the stall's end
    assert fired[2][1] == 0.5

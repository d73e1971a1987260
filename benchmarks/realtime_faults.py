"""Real-time faults in process: the controller against static settings, run by run.

What only real time has (the simulator replays the same faults on its clock, see
``adaptive_batcher.sim.faults``): the event loop standing still, a thread holding the GIL,
other processes on the cores, torch threads above the cores, a model that turns slow, a load
step. Each run is a fresh event loop in this process: Poisson arrivals from a task on the same
loop (as a handler's would be), latency timed from each request's *scheduled* arrival, so a
stall of the loop counts in full; the fault starts at ``FAULT_AT_S``. Every contender meets the
same arrivals (the same seed) and the same fault, one run after the other.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from adaptive_batcher import SLO, AdaptiveBatcher, BatcherError, stacked

FAULT_AT_S = 4.0
AFTER_S = 6.0  # measured after the fault ends
SLO_MS = 60.0
CAP = 128
SAMPLE_S = 0.1  # how often the window and cap are read


@dataclass
class Model:
    """The model under test: ``slow`` multiplies its work, ``threads`` (if set) is the torch
    intra-op thread count its worker thread computes with."""

    kind: str  # "sleep": 3 ms + 0.2 ms per item on the loop; "torch": an MLP in a thread
    slow: float = 1.0
    threads: int | None = None
    _forward: Any = None

    def batch_fn(self) -> Callable[[list[Any]], Any]:
        if self.kind == "sleep":

            async def sleep_model(batch: list[Any]) -> list[Any]:
                await asyncio.sleep((0.003 + 0.0002 * len(batch)) * self.slow)
                return batch

            return sleep_model
        import torch

        from adaptive_batcher.examples.mlp import mlp_batch_fn

        forward = self._forward = self._forward or mlp_batch_fn()
        state = {"threads": torch.get_num_threads()}

        def torch_model(rows: Any) -> Any:
            wanted = self.threads or 1
            if state["threads"] != wanted:  # torch's count is per thread: set it in this one
                torch.set_num_threads(wanted)
                state["threads"] = wanted
            out = forward(rows)
            for _ in range(round(self.slow) - 1):
                out = forward(rows)
            return out

        return stacked(torch_model)

    def item(self) -> Any:
        if self.kind == "sleep":
            return 0
        from adaptive_batcher.examples.mlp import make_input

        return make_input(seed=0)


@dataclass(frozen=True)
class FaultCase:
    """A fault and the load it meets."""

    name: str
    description: str
    model: str
    rate_rps: float
    duration_s: float
    inject: Callable[[Model, Callable[[float], None]], Awaitable[None]]
    rate_during: float = 1.0  # the load's factor while the fault lasts (a step)


async def _stalls(seconds: float, every_s: float, count: int) -> None:
    for _ in range(count):
        time.sleep(seconds)  # noqa: ASYNC251 - the fault: a blocking call stalls the loop
        await asyncio.sleep(every_s)


def _stall(seconds: float, count: int = 1, every_s: float = 1.0) -> Any:
    async def inject(model: Model, note: Callable[[float], None]) -> None:
        del model, note
        await _stalls(seconds, every_s, count)

    return inject


def _slow(factor: float, seconds: float) -> Any:
    async def inject(model: Model, note: Callable[[float], None]) -> None:
        del note
        model.slow = factor
        try:
            await asyncio.sleep(seconds)
        finally:
            model.slow = 1.0

    return inject


def _gil(seconds: float) -> Any:
    async def inject(model: Model, note: Callable[[float], None]) -> None:
        del model, note
        stop = threading.Event()

        def spin() -> None:  # pure Python: holds the GIL for its switch interval at a time
            while not stop.is_set():
                sum(range(10_000))

        thread = threading.Thread(target=spin, daemon=True)
        thread.start()
        try:
            await asyncio.sleep(seconds)
        finally:
            stop.set()
            thread.join()

    return inject


def _busy(processes: int, seconds: float) -> Any:
    async def inject(model: Model, note: Callable[[float], None]) -> None:
        del model, note
        with busy_loops(processes):
            await asyncio.sleep(seconds)

    return inject


def _threads(threads: int, seconds: float) -> Any:
    async def inject(model: Model, note: Callable[[float], None]) -> None:
        del note
        model.threads = threads
        try:
            await asyncio.sleep(seconds)
        finally:
            model.threads = None

    return inject


def _step(seconds: float) -> Any:
    async def inject(model: Model, note: Callable[[float], None]) -> None:
        del model
        note(1.0)  # the generator reads the factor: the step is the case's rate_during
        await asyncio.sleep(seconds)
        note(0.0)

    return inject


CASES: dict[str, FaultCase] = {
    case.name: case
    for case in (
        FaultCase("stalls_0.1s", "5 loop stalls of 0.1 s, 1 s apart", "sleep", 800.0, 5.0,
                  _stall(0.1, count=5)),
        FaultCase("stall_1s", "one loop stall of 1 s", "sleep", 800.0, 1.0, _stall(1.0)),
        FaultCase("stall_10s", "one loop stall of 10 s", "sleep", 800.0, 10.0, _stall(10.0)),
        FaultCase("slow_10x", "the model 10x slower for 5 s", "sleep", 800.0, 5.0,
                  _slow(10.0, 5.0)),
        FaultCase("step_3x", "the load 3x for 5 s", "sleep", 500.0, 5.0, _step(5.0),
                  rate_during=3.0),
        FaultCase("gil_thread", "a thread holding the GIL for 5 s", "torch", 400.0, 5.0,
                  _gil(5.0)),
        FaultCase("busy_cores", "2 busy-loop processes for 5 s", "torch", 400.0, 5.0,
                  _busy(2, 5.0)),
        FaultCase("torch_threads", "the model's torch threads at 4 (2 cores) for 5 s", "torch",
                  400.0, 5.0, _threads(4, 5.0)),
    )
}  # fmt: skip


@contextlib.contextmanager
def busy_loops(count: int) -> Iterator[None]:
    """``count`` processes spinning on the CPU for the duration of the block."""
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()


@dataclass(frozen=True)
class Contender:
    """How the batcher is configured: ours (SLO, shedding, as the README's FastAPI example)
    or a static window with the same cap."""

    name: str
    window_ms: float
    adaptive: bool

    def batcher(self, model: Callable[[list[Any]], Any]) -> AdaptiveBatcher[Any, Any]:
        if self.adaptive:
            return AdaptiveBatcher(
                model,
                max_batch_size=CAP,
                window_ms=self.window_ms,
                slo=SLO(latency_ms=SLO_MS),
                shed_late=True,
            )
        return AdaptiveBatcher(model, max_batch_size=CAP, window_ms=self.window_ms)


CONTENDERS = (
    Contender("ours", 5.0, adaptive=True),
    Contender("static_0", 0.0, adaptive=False),
    Contender("static_5", 5.0, adaptive=False),
    Contender("static_20", 20.0, adaptive=False),
)


@dataclass
class RunResult:
    """One run: what the clients saw, and the batcher's own counts and settings over time."""

    case: str
    contender: str
    round: int
    submitted: int = 0
    within_slo: int = 0
    answered: int = 0
    errors: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    mean_batch: float = math.nan
    device_ms_per_request: float = math.nan
    timeline: list[tuple[float, float, int]] = field(default_factory=list)  # (t, window, cap)
    fault_end_s: float = math.nan
    load_average: float = math.nan

    @property
    def p99_ms(self) -> float:
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else math.nan

    def cap_recovery_s(self) -> float:
        """Seconds after the fault ends until the cap is back at its pre-fault median (NaN:
        never; 0: it never fell)."""
        before = [cap for t, _, cap in self.timeline if 1.0 <= t < FAULT_AT_S]
        if not before:
            return math.nan
        usual = sorted(before)[len(before) // 2]
        low = [t for t, _, cap in self.timeline if t >= self.fault_end_s and cap < usual]
        if not low:
            return 0.0
        back = [t for t, _, cap in self.timeline if t > low[-1] and cap >= usual]
        return back[0] - self.fault_end_s if back else math.nan


async def one_run(case: FaultCase, contender: Contender, model: Model, seed: int) -> RunResult:
    """``contender`` under ``case``'s load and fault, one run; returns what it measured."""
    loop = asyncio.get_running_loop()
    result = RunResult(case.name, contender.name, seed)
    rng = random.Random(seed)
    factor = {"now": 1.0}

    def note(value: float) -> None:
        factor["now"] = case.rate_during if value else 1.0

    slo_s = SLO_MS / 1e3
    pending: set[asyncio.Task[None]] = set()
    batcher = contender.batcher(model.batch_fn())
    item = model.item()

    async def request(scheduled: float) -> None:
        try:
            await batcher.submit(item)
        except BatcherError:
            result.errors += 1
            return
        latency = loop.time() - scheduled
        result.answered += 1
        result.latencies_ms.append(latency * 1e3)
        result.within_slo += latency <= slo_s

    async def sample(origin: float) -> None:
        while True:
            stats = batcher.stats()
            result.timeline.append((loop.time() - origin, stats.window_ms, stats.max_batch_size))
            await asyncio.sleep(SAMPLE_S)

    async def timed_fault(origin: float) -> None:
        await case.inject(model, note)
        result.fault_end_s = loop.time() - origin

    async with batcher:
        await batcher.warmup(lambda: item)
        origin = loop.time()
        sampler = loop.create_task(sample(origin))
        fault: asyncio.Task[None] | None = None
        end = FAULT_AT_S + case.duration_s + AFTER_S
        t = origin
        while t - origin < end:
            if fault is None and loop.time() - origin >= FAULT_AT_S:
                fault = loop.create_task(timed_fault(origin))
            while t <= loop.time() and t - origin < end:
                task = loop.create_task(request(t))
                pending.add(task)
                task.add_done_callback(pending.discard)
                result.submitted += 1
                t += rng.expovariate(case.rate_rps * factor["now"])
            await asyncio.sleep(max(0.0, t - loop.time()))
        if fault is not None:
            await fault
        await asyncio.gather(*pending)
        sampler.cancel()
        counts = batcher.stats().counts
    result.mean_batch = counts.batch_items / counts.batches if counts.batches else math.nan
    if counts.completed:
        result.device_ms_per_request = counts.device_busy_s * 1e3 / counts.completed
    return result


def run_case(case: FaultCase, contender: Contender, model: Model, seed: int) -> RunResult:
    """One run in a fresh event loop, with the machine's 1-minute load average beside it."""
    result = asyncio.run(one_run(case, contender, model, seed))
    result.load_average = load_average()
    return result


def load_average() -> float:
    """The machine's 1-minute load average (NaN where /proc/loadavg is not there)."""
    try:
        with open("/proc/loadavg") as file:
            return float(file.read().split()[0])
    except OSError:
        return math.nan

"""A tight SLO on a fast model, in real time: the event loop's own latency and the controller's
tick are a large share of the SLO.

The README's model (``torch.nn.Linear(256, 10)`` under ``stacked``, on the event loop with
``executor="adaptive"``) under Poisson arrivals from a task on the same loop, each request timed
from its scheduled arrival, the warm heap frozen out of the garbage collector's way as in the
README's app (else a full collection of 90 ms fell in the first run of a process). Ours (an SLO
at p99, shedding as in the README) against static windows 0 and 1 ms, cap 64 for all. The first
``WARM_S`` of each run are not counted. The controller's ticks are timed by wrapping
:meth:`Controller.tick` (a probe of this benchmark, not part of the library).
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

RATE_RPS = 3000.0
RUN_S = 8.0
WARM_S = 1.0
CAP = 64
CONTENDERS: tuple[tuple[str, float | None], ...] = (
    ("ours", None),
    ("static_0", 0.0),
    ("static_1", 1.0),
)


@dataclass
class TightRun:
    """What one contender's requests got in one run at one SLO."""

    contender: str
    slo_ms: float
    round: int
    latencies_ms: list[float] = field(default_factory=list)  # answered, after WARM_S
    counted: int = 0  # requests scheduled after WARM_S
    ticks_ms: list[float] = field(default_factory=list)

    @property
    def within_share(self) -> float:
        within = sum(latency <= self.slo_ms for latency in self.latencies_ms)
        return within / self.counted if self.counted else math.nan

    @property
    def p99_ms(self) -> float:
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else math.nan


@contextmanager
def timed_ticks(into: list[float]) -> Iterator[None]:
    """Time every :meth:`Controller.tick` while inside, ms, into ``into``."""
    from adaptive_batcher.control.controller import Controller

    original = Controller.tick

    def tick(self: Controller, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return original(self, *args, **kwargs)
        finally:
            into.append((time.perf_counter() - start) * 1e3)

    Controller.tick = tick  # type: ignore[method-assign]
    try:
        yield
    finally:
        Controller.tick = original  # type: ignore[method-assign]


@dataclass(frozen=True)
class Pauses:
    """The model sleeps ``pause_ms`` on every ``every``-th call (a lock, a page fault, a
    collector of another runtime), run in a thread (``executor="thread"``) at ``rate_rps``."""

    pause_ms: float = 8.0
    every: int = 20
    rate_rps: float = 1500.0


def tight_run(
    contender: str,
    window_ms: float | None,
    slo_ms: float,
    round_: int,
    preprocess_ms: float = 0.0,
    pauses: Pauses | None = None,
) -> TightRun:
    """One run of ``RUN_S`` seconds; ``window_ms`` None: ours (SLO at p99 ``slo_ms``, with
    ``preprocess_ms`` of it spent before submission, shedding; a shed request counts as no
    answer); ``pauses``: the model pauses so (None: it does not, on the loop)."""
    run = TightRun(contender, slo_ms, round_)
    with timed_ticks(run.ticks_ms):
        asyncio.run(_run(run, window_ms, preprocess_ms, pauses))
    return run


def rotated_runs(
    slo_ms: float,
    rounds: int,
    pauses: Pauses | None = None,
    contenders: tuple[tuple[str, float | None], ...] = CONTENDERS,
) -> list[TightRun]:
    """``rounds`` rounds of every contender of ``contenders`` at ``slo_ms``, the order rotating
    a step each round (see :func:`tight_run`)."""
    runs = []
    for index in range(rounds):
        shift = index % len(contenders)
        for name, window_ms in contenders[shift:] + contenders[:shift]:
            runs.append(tight_run(name, window_ms, slo_ms, index, pauses=pauses))
    return runs


def _model(pauses: Pauses | None) -> Any:
    import torch

    from adaptive_batcher import stacked

    forward = torch.inference_mode()(torch.nn.Linear(256, 10).eval())
    if pauses is None:
        return stacked(forward)
    calls = [0]

    def pausing(rows: Any) -> Any:
        calls[0] += 1
        if calls[0] % pauses.every == 0:
            time.sleep(pauses.pause_ms / 1e3)
        return forward(rows)

    return stacked(pausing)


async def _run(
    run: TightRun, window_ms: float | None, preprocess_ms: float, pauses: Pauses | None
) -> None:
    import torch

    from adaptive_batcher import SLO, AdaptiveBatcher, BatcherError

    settings: dict[str, Any] = (
        {"slo": SLO(run.slo_ms, preprocess_ms=preprocess_ms), "shed_late": True}
        if window_ms is None
        else {"window_ms": window_ms}
    )
    executor = "adaptive" if pauses is None else "thread"
    rate_rps = RATE_RPS if pauses is None else pauses.rate_rps
    batcher = AdaptiveBatcher(_model(pauses), executor=executor, max_batch_size=CAP, **settings)
    item = torch.zeros(256)
    await batcher.warmup(lambda: item, freeze_gc=True)  # as the README's app does
    loop = asyncio.get_running_loop()
    rng = random.Random(run.round)
    pending: set[asyncio.Task[None]] = set()

    async def request(scheduled: float, counted: bool) -> None:
        try:
            await batcher.submit(item)
        except BatcherError:
            return
        if counted:
            run.latencies_ms.append((loop.time() - scheduled) * 1e3)

    origin = next_at = loop.time()
    while next_at - origin < RUN_S:
        while next_at <= loop.time() and next_at - origin < RUN_S:
            counted = next_at - origin >= WARM_S
            run.counted += counted
            task = loop.create_task(request(next_at, counted))
            pending.add(task)
            task.add_done_callback(pending.discard)
            next_at += rng.expovariate(rate_rps)
        await asyncio.sleep(max(0.0, next_at - loop.time()))
    await asyncio.gather(*pending)
    await batcher.aclose()

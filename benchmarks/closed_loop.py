"""Closed-loop clients in process: a fixed set of clients, each sending its next request when
the last is answered, after a spread of time outside the batcher (as HTTP parsing on a busy
event loop spreads requests out).

Each client waits a uniform ``OUTSIDE_MS`` before each request, then submits it to the batcher
(the README's model: ``torch.nn.Linear(256, 10)`` under ``stacked``). With the spread as wide
as the window, every batch holds all the clients and the window waits little after the last,
so only the arrival rate shows that the window throttles the clients instead of batching them
(docs/policies.md, "UnusedWindowGuard").
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass

CLIENTS = 16
OUTSIDE_MS = (2.0, 40.0)
SLO_MS = 50.0
RUN_S = 15.0


@dataclass
class ClosedLoopRun:
    """What one contender's clients got in one run."""

    contender: str
    round: int
    answers: int
    inside_p50_ms: float  # the batcher's latency, median
    mean_batch: float
    reasons: dict[str, int]


def closed_loop_run(contender: str, window_ms: float | None, round_: int) -> ClosedLoopRun:
    """One run of ``RUN_S`` seconds; ``window_ms`` None: ours (SLO p99 50 ms with shedding;
    a request it sheds counts as no answer)."""
    return asyncio.run(_run(contender, window_ms, round_))


async def _run(contender: str, window_ms: float | None, round_: int) -> ClosedLoopRun:
    import torch

    from adaptive_batcher import SLO, AdaptiveBatcher, DeadlineExceededError, stacked

    forward = torch.inference_mode()(torch.nn.Linear(256, 10).eval())
    model = stacked(forward)
    batcher = (
        AdaptiveBatcher(model, slo=SLO(latency_ms=SLO_MS), shed_late=True, max_batch_size=64)
        if window_ms is None
        else AdaptiveBatcher(model, window_ms=window_ms, max_batch_size=64)
    )
    await batcher.warmup(lambda: torch.zeros(256))
    rng = random.Random(round_)
    inside_s: list[float] = []
    stop_at = time.monotonic() + RUN_S

    async def client() -> None:
        while time.monotonic() < stop_at:
            await asyncio.sleep(rng.uniform(*OUTSIDE_MS) / 1e3)
            sent = time.monotonic()
            try:
                await batcher.submit(torch.zeros(256))
            except DeadlineExceededError:  # shed (ours): no answer, the client goes on
                continue
            inside_s.append(time.monotonic() - sent)

    await asyncio.gather(*(client() for _ in range(CLIENTS)))
    stats = batcher.stats()
    await batcher.aclose()
    batches = sum(stats.batch_sizes.values())
    return ClosedLoopRun(
        contender=contender,
        round=round_,
        answers=len(inside_s),
        inside_p50_ms=sorted(inside_s)[len(inside_s) // 2] * 1e3,
        mean_batch=sum(k * v for k, v in stats.batch_sizes.items()) / max(batches, 1),
        reasons=dict(stats.decision_reasons),
    )

"""The memory squeeze: another tenant takes all but ~1 GiB of the device mid-run.

Our first configuration (CUDA executor, warmed buckets, the first SLO) serves Poisson load;
after ``squeeze_before_s`` one allocation takes the free memory but ``squeeze_leave_bytes`` and a
burst of a full cap of requests arrives at once (so the next batch is a large one, which no
longer fits); ``squeeze_hold_s`` later the memory is given back. The timeline (every
``timeline_s``) shows the cap the controller chose, the free memory, the outcomes and the
out-of-memory errors; ``MemoryGuard`` should shrink the cap, the out-of-memory batches be
split and re-run, and no request be lost.
"""

from __future__ import annotations

import asyncio
import traceback
from typing import Any

from adaptive_batcher import AdaptiveBatcher
from benchmarks.gpu.context import Context
from benchmarks.gpu.load import LoadRun, poisson_times
from benchmarks.gpu.results import PhaseOutcome, Table
from benchmarks.gpu.serving import Contender, contenders, make_batcher, warm

__all__ = ["run_squeeze"]

GIB = 2**30


class _Timeline:
    """Rows of the ``squeeze`` table, one per ``period_s`` and one per stage change."""

    def __init__(self, ctx: Context, batcher: AdaptiveBatcher[int, Any], run: LoadRun) -> None:
        self.ctx, self.batcher, self.run = ctx, batcher, run
        self.table = Table("squeeze")
        self.stage = "before"
        self.start_s = asyncio.get_running_loop().time()
        self.guard_events_at_start = ctx.events.count("controller.memory_guard")

    def record(self, lost: int | str = "") -> dict[str, Any]:
        stats = self.batcher.stats()
        outcomes = self.run.outcomes
        free, _ = self.ctx.platform.mem_get_info()
        guard = self.ctx.events.count("controller.memory_guard") - self.guard_events_at_start
        self.table.add(
            t_s=asyncio.get_running_loop().time() - self.start_s,
            stage=self.stage,
            cap=stats.max_batch_size,
            window_ms=stats.window_ms,
            queue_depth=stats.queue_depth,
            free_gib=free / GIB,
            submitted=self.run.spawned,
            completed=outcomes["completed"],
            failed=outcomes["failed"],
            rejected=outcomes["rejected"],
            expired=outcomes["expired"],
            lost=lost,
            oom_errors=stats.counts.oom_errors,
            memory_guard_events=guard,
        )
        return self.table.rows[-1]

    async def every(self, period_s: float) -> None:
        while True:
            self.record()
            await asyncio.sleep(period_s)


async def squeeze_once(ctx: Context, outcome: PhaseOutcome) -> None:
    """One squeezed run; its timeline goes into ``outcome``, its summary into the detail."""
    config = ctx.config
    contender = next(c for c in contenders(config.slos_ms) if c.slo_ms is not None)
    batcher = make_batcher(ctx, contender)
    try:
        await _squeezed_run(ctx, batcher, contender, outcome)
    finally:  # a run that failed must not leave its sampler thread behind
        await batcher.aclose(drain=False, timeout_s=config.drain_s)


async def _squeezed_run(
    ctx: Context,
    batcher: AdaptiveBatcher[int, Any],
    contender: Contender,
    outcome: PhaseOutcome,
) -> None:
    config, platform = ctx.config, ctx.platform
    await warm(ctx, batcher, contender)
    run = LoadRun(batcher)
    timeline = _Timeline(ctx, batcher, run)
    outcome.tables.append(timeline.table)  # kept, as far as it got, if the run fails
    taken: list[int] = []

    def squeeze() -> None:
        timeline.record()
        taken.append(platform.squeeze(config.squeeze_leave_bytes))
        timeline.stage = "squeezed"
        run.spawn(config.cap)  # a full cap at once: the next batch is a large one
        timeline.record()

    def release() -> None:
        platform.release()
        timeline.stage = "after"
        timeline.record()

    total_s = config.squeeze_before_s + config.squeeze_hold_s + config.squeeze_after_s
    times = poisson_times(config.squeeze_rate_rps, total_s, seed=1000)
    marks = [(config.squeeze_before_s, squeeze), (total_s - config.squeeze_after_s, release)]
    ticker = asyncio.ensure_future(timeline.every(config.timeline_s))
    try:
        await run.drive(times, marks)
        await run.settle(config.drain_s)
    finally:
        ticker.cancel()
        platform.release()
    lost = await run.finish(config.drain_s)
    timeline.stage = "end"
    end = timeline.record(lost=lost)
    rows = timeline.table.rows
    caps = [row["cap"] for row in rows if row["stage"] == "squeezed"]
    before = [row["cap"] for row in rows if row["stage"] == "before"]
    outcome.detail = (
        f"lost={lost} failed={end['failed']} rejected={end['rejected']} "
        f"oom_errors={end['oom_errors']} memory_guard_events={end['memory_guard_events']} "
        f"cap_before={before[-1] if before else ''} cap_min={min(caps) if caps else ''} "
        f"cap_end={end['cap']} taken_gib={(taken[0] if taken else 0) / GIB:.2f} "
        f"burst={config.cap}"
    )
    if run.errors:
        outcome.notes.append(f"errors the callers got: {dict(run.errors)}")


def run_squeeze(ctx: Context) -> PhaseOutcome:
    outcome = PhaseOutcome("squeeze")
    try:
        asyncio.run(squeeze_once(ctx, outcome))
    except Exception:
        outcome.status = "failed"
        outcome.traceback = traceback.format_exc()
    return outcome

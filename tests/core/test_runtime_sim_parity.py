"""The runtime and the simulator are two shells over one BatcherCore: the same event script
through both gives the same batches, the same controller decisions and the same latencies.

The runtime runs on a virtual clock (``VirtualClockLoop``) with an ``async def`` model that
sleeps for the simulator's service time, so both see identical times.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from adaptive_batcher import SLO, AdaptiveBatcher
from adaptive_batcher.control import Decision, Observation, Policy, default_guards
from adaptive_batcher.control.guards import Guard
from adaptive_batcher.policies import PID, DiscountedUCB
from adaptive_batcher.sim.service import LinearService
from adaptive_batcher.sim.simulator import SimConfig, Simulator
from adaptive_batcher.sim.workloads import Arrivals, Steps
from adaptive_batcher.testing import run_in_virtual_time

SERVICE = LinearService(fixed_s=0.002, per_unit_s=0.0002)
RNG = np.random.default_rng(0)  # LinearService draws nothing: any generator will do


def recording(log: list[tuple[float, float, int, str]]) -> Callable[[Policy], Policy]:
    """A guard factory that records every decision of the chain it wraps (outermost)."""

    class Recorded(Guard):
        def correct(self, observation: Observation, decision: Decision) -> Decision:
            log.append(
                (observation.now_s, decision.window_ms, decision.max_batch_size, decision.reason)
            )
            return decision

    return Recorded


def settings(policy: Callable[[], Policy], log: list[Any], shed: bool) -> dict[str, Any]:
    return {
        "max_batch_size": 64,
        "window_ms": 2.0,
        "max_queue_size": 400,
        "slo": SLO(latency_ms=25.0),
        "policy": policy(),
        "guards": [*default_guards(shed_late=shed), recording(log)],
        "control_interval_ms": 100.0,
        "shed_late": shed,
    }


def run_simulator(arrivals: Arrivals, policy: Callable[[], Policy], shed: bool) -> Any:
    log: list[Any] = []
    result = Simulator(SERVICE, SimConfig(**settings(policy, log, shed))).run(arrivals)
    calls = [(start, end, int(items)) for start, end, items, _ in result.calls]
    latencies = sorted(np.round(result.latency_ms, 9).tolist())
    return calls, log, latencies, (result.completed, result.expired, result.rejected)


def run_runtime(arrivals: Arrivals, policy: Callable[[], Policy], shed: bool) -> Any:
    log: list[Any] = []
    calls: list[tuple[float, float, int]] = []
    latencies: list[float] = []
    outcomes = {"completed": 0, "expired": 0, "rejected": 0}

    async def model(batch: list[int]) -> list[int]:
        loop = asyncio.get_running_loop()
        start = loop.time()
        await asyncio.sleep(SERVICE.service_s(len(batch), RNG))
        calls.append((start, loop.time(), len(batch)))
        return batch

    async def one(batcher: AdaptiveBatcher[int, int], item: int) -> None:
        loop = asyncio.get_running_loop()
        arrived = loop.time()
        try:
            await batcher.submit(item)
        except Exception as exc:
            key = "expired" if type(exc).__name__ == "DeadlineExceededError" else "rejected"
            outcomes[key] += 1
            return
        outcomes["completed"] += 1
        latencies.append(round((loop.time() - arrived) * 1e3, 9))

    async def main() -> None:
        loop = asyncio.get_running_loop()
        batcher = AdaptiveBatcher(model, executor="async", **settings(policy, log, shed))
        tasks = []
        async with batcher:
            for item, at in enumerate(arrivals.times_s.tolist()):
                if at > loop.time():
                    await asyncio.sleep(at - loop.time())
                tasks.append(asyncio.create_task(one(batcher, item)))
            await asyncio.gather(*tasks)

    run_in_virtual_time(main())
    counts = (outcomes["completed"], outcomes["expired"], outcomes["rejected"])
    return calls, log, sorted(latencies), counts


@pytest.mark.parametrize(
    ("policy", "shed"),
    [(PID, False), (PID, True), (DiscountedUCB, True)],
    ids=["pid", "pid_shed", "ucb_shed"],
)
def test_one_event_script_gives_identical_batches_and_decisions(
    policy: Callable[[], Policy], shed: bool
) -> None:
    # 2000 req/s, then an overload step to 6000 req/s (the cap must rise; shedding starts)
    arrivals = Steps((2000.0, 6000.0), 1.5).generate(3.0, np.random.default_rng(7))
    sim_calls, sim_log, sim_latencies, sim_counts = run_simulator(arrivals, policy, shed)
    rt_calls, rt_log, rt_latencies, rt_counts = run_runtime(arrivals, policy, shed)
    assert len(sim_log) > 20  # the controller really acted (a tick each 100 ms)
    assert len({(round(w, 3), cap) for _, w, cap, _ in sim_log}) > 1  # and changed settings
    assert rt_calls == sim_calls
    assert rt_log == sim_log
    assert rt_counts == sim_counts
    # arrival times reach the runtime through asyncio.sleep(at - now): equal up to an ulp
    np.testing.assert_allclose(rt_latencies, sim_latencies, rtol=0, atol=1e-6)

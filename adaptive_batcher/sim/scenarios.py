"""Named replay scenarios and the batcher configurations compared on them.

A :class:`Scenario` is a device (service-time model, memory), an SLO and a workload; a
*contender* is a function from a scenario to a :class:`SimConfig`: our policies, and the
baselines as users configure them today (Triton-like, Ray Serve defaults, TorchServe-like,
BentoML-like cork, Clipper AIMD, and a static grid searched in hindsight). The benchmarks and
``adaptive-batcher replay`` use the same definitions.

Loads are given as fractions of the device's capacity under the SLO: the throughput of the
largest batch whose two-batch latency fits the SLO target (resnet50 on an H200, SLO p99 50 ms:
batch 256, 15.4k img/s; measured on one NVIDIA H200, resnet50, bf16, eager: the table shipped
in ``adaptive_batcher/data/h200/batch_profile.csv``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from adaptive_batcher.control.controller import default_guards
from adaptive_batcher.control.policy import Policy, declares_shedding
from adaptive_batcher.control.types import Bounds
from adaptive_batcher.policies import AIMD, PID, DiscountedThompson, DiscountedUCB
from adaptive_batcher.policies.cork import BentoCork
from adaptive_batcher.sim.faults import Fault, Faults, LongBatch, LoopStall, Slowdown
from adaptive_batcher.sim.result import SimResult
from adaptive_batcher.sim.service import MemoryLimit, Noisy, ServiceModel, Stalls, TableService
from adaptive_batcher.sim.simulator import SimConfig, Simulator
from adaptive_batcher.sim.traces import default_trace_dir, find_trace, load_trace
from adaptive_batcher.sim.workloads import (
    Arrivals,
    Diurnal,
    MMPPBursts,
    Poisson,
    Steps,
)
from adaptive_batcher.slo import SLO

__all__ = [
    "CONTENDERS",
    "SCENARIOS",
    "STATIC_CAPS",
    "STATIC_WINDOWS_MS",
    "Scenario",
    "StaticRun",
    "best_static",
    "capacity_rps",
    "cost_oracle",
    "make_scenarios",
    "run",
    "share_scenarios",
    "sheds",
    "static_grid",
    "warmup_seed",
]

MAX_CAP = 512
STATIC_WINDOWS_MS = (0.0, 5.0, 10.0, 15.0, 20.0, 25.0, 30.0)
STATIC_CAPS = (16, 64, 128, 256, 512)


_NO_WARMUP: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class Scenario:
    """A device, an SLO and a workload.

    Attributes:
        name: identifier (``steps``, ``poisson_60``, ...).
        description: one line for reports.
        slo: the latency objective.
        arrivals: builds the arrivals from a seed.
        service: builds the (stateful) service model, fresh per run.
        memory: device memory over time (None: unlimited).
        step_at_s: for load steps, when the step happens (for the recovery metric).
        stationary: whether the target is "within 5 % of the best static setting".
        warmup: ``(batch_size, ms)`` that a warm-up of power-of-two buckets measures on this
            device; adaptive contenders (and the baselines that learn a service model) start
            from it, as a user who warms up or profiles before serving does.
        light_from_s: for an overload followed by light load, when the light phase starts (its
            shed fraction and SLO attainment are judged on their own).
        rate_rps: the mean arrival rate of a stationary workload, req/s (None otherwise): what
            the stability cap is judged against.
        faults: event-loop stalls, slowdowns and long batches replayed on every contender
            (None: none).
    """

    name: str
    description: str
    slo: SLO
    arrivals: Callable[[int], Arrivals]
    service: Callable[[], ServiceModel] = field(default=lambda: Noisy(_resnet(), cv=0.05))
    memory: MemoryLimit | None = None
    step_at_s: float | None = None
    stationary: bool = False
    warmup: tuple[tuple[int, float], ...] = _NO_WARMUP
    light_from_s: float | None = None
    rate_rps: float | None = None
    faults: Faults | None = None


def _resnet() -> TableService:
    return TableService.from_h200("resnet50")


def capacity_rps(table: TableService, slo: SLO) -> float:
    """Items/s of the largest measured batch size whose ``2 * service`` fits the SLO target."""
    fitting = [
        int(n) for n in table.sizes if 2 * table.service_s(int(n), _RNG) * 1e3 <= slo.target_ms
    ]
    best = max(fitting) if fitting else int(table.sizes[0])
    return best / table.service_s(best, _RNG)


def warmup_seed(table: TableService) -> tuple[tuple[int, float], ...]:
    """The noiseless service time of each power-of-two bucket up to the cap, ms."""
    sizes = [1 << k for k in range(10) if 1 << k <= MAX_CAP]
    return tuple((n, table.service_s(n, _RNG) * 1e3) for n in sizes)


_RNG = np.random.default_rng(0)
SLO_50 = SLO(latency_ms=50.0)


def _poisson(rate_rps: float, duration_s: float) -> Callable[[int], Arrivals]:
    return lambda seed: Poisson(rate_rps).generate(duration_s, np.random.default_rng(seed))


def _workload(make: Callable[[], object], duration_s: float) -> Callable[[int], Arrivals]:
    def build(seed: int) -> Arrivals:
        workload = make()
        arrivals: Arrivals = workload.generate(duration_s, np.random.default_rng(seed))  # type: ignore[attr-defined]
        return arrivals

    return build


def _trace(name: str, compress: float, folder: Path | None) -> Callable[[int], Arrivals]:
    def build(seed: int) -> Arrivals:
        del seed  # a trace is what it is
        path = find_trace(name, folder)
        if path is None:
            raise FileNotFoundError(
                f"trace {name!r} not found in {folder or default_trace_dir()} (the traces "
                "folder: ADAPTIVE_BATCHER_TRACES, else ../shared/traces next to the repository)"
            )
        return load_trace(path, compress=compress)

    return build


def _trace_at(name: str, rate_rps: float, folder: Path | None) -> Callable[[int], Arrivals]:
    """A trace time-compressed to a mean of ``rate_rps`` (the burst structure kept)."""
    at_own_pace = _trace(name, 1.0, folder)

    def build(seed: int) -> Arrivals:
        trace = at_own_pace(seed)
        compress = rate_rps / trace.rate_rps
        return Arrivals(
            np.asarray(trace.times_s) / compress,
            np.asarray(trace.sizes),
            f"{Path(name).stem} x{compress:.0f}",
            trace.duration_s / compress,
        )

    return build


def _memory_squeeze() -> MemoryLimit:
    mib = 2**20
    # resnet50 peak memory: 1646.6 MiB at 256, 2994.6 MiB at 512 (batch_profile.csv); another
    # tenant leaves 1200 MiB from 10 s to 20 s, then 4000 MiB again
    return MemoryLimit(4000 * mib, squeezes=[(10.0, 1200 * mib), (20.0, 4000 * mib)])


def make_scenarios(
    table: TableService, slo: SLO, traces_dir: str | os.PathLike[str] | None = None
) -> dict[str, Scenario]:
    """The named scenarios on a device described by ``table`` (service time, memory), with
    loads as fractions of its capacity under ``slo`` (see :func:`capacity_rps`); the trace
    scenarios read their files from ``traces_dir`` (default
    :func:`~adaptive_batcher.sim.traces.default_trace_dir`) when they are replayed."""
    folder = None if traces_dir is None else Path(traces_dir)
    capacity = capacity_rps(table, slo)
    measured = Noisy(table, cv=0.05)  # the spread the H200 tables show at large batches
    scenarios = [
        Scenario(
            "poisson_30",
            "Poisson at 30 % of capacity",
            slo,
            _poisson(0.3 * capacity, 20.0),
            stationary=True,
            rate_rps=0.3 * capacity,
        ),
        Scenario(
            "poisson_60",
            "Poisson at 60 % of capacity",
            slo,
            _poisson(0.6 * capacity, 20.0),
            stationary=True,
            rate_rps=0.6 * capacity,
        ),
        Scenario(
            "poisson_90",
            "Poisson at 90 % of capacity",
            slo,
            _poisson(0.9 * capacity, 20.0),
            stationary=True,
            rate_rps=0.9 * capacity,
        ),
        Scenario(
            "step_3x",
            "load step 30 % -> 90 % of capacity at 10 s",
            slo,
            _workload(lambda: Steps((0.3 * capacity, 0.9 * capacity), 10.0), 20.0),
            step_at_s=10.0,
        ),
        Scenario(
            "steps",
            "steps 30 / 90 / 150 / 30 % of capacity, 10 s each",
            slo,
            _workload(lambda: Steps(tuple(f * capacity for f in (0.3, 0.9, 1.5, 0.3)), 10.0), 40.0),
        ),
        Scenario(
            "diurnal",
            "sinusoid, mean 70 % of capacity, +-60 %, period 20 s",
            slo,
            _workload(lambda: Diurnal(0.7 * capacity, 0.6, 20.0), 40.0),
        ),
        Scenario(
            "bursts",
            "on/off bursts: 40 % base, 200 % bursts, on 1 s / off 4 s",
            slo,
            _workload(lambda: MMPPBursts(0.4 * capacity, 2.0 * capacity, 1.0, 4.0), 40.0),
        ),
        Scenario(
            "azure_code",
            "Azure LLM code trace (CV 13), time compressed x1000",
            slo,
            _trace("azure_llm_2023_code.csv", 1000.0, folder),
        ),
        Scenario(
            "azure_conv",
            "Azure LLM conversation trace (near Poisson), time compressed x1000",
            slo,
            _trace("azure_llm_2023_conv.csv", 1000.0, folder),
            stationary=True,
        ),
        Scenario(
            "memory_squeeze",
            "60 % of capacity; free memory drops to 1.2 GiB from 10 s to 20 s",
            slo,
            _poisson(0.6 * capacity, 30.0),
            memory=_memory_squeeze(),
        ),
        Scenario(
            "overload_then_light",
            "4 s at 150 % of capacity, then 2 % and 50 % alternating every 0.25 s for 16 s",
            slo,
            _workload(lambda: Steps(_overload_then_light(capacity), 0.25), 20.0),
            light_from_s=4.0,
        ),
        Scenario(
            "noise_30",
            "Poisson at 60 % of capacity, service times with 30 % lognormal noise",
            slo,
            _poisson(0.6 * capacity, 20.0),
            service=lambda: Noisy(table, cv=0.3),
            rate_rps=0.6 * capacity,
        ),
        Scenario(
            "stalls",
            "Poisson at 60 % of capacity, heavy-tailed stalls on 5 % of batches",
            slo,
            _poisson(0.6 * capacity, 20.0),
            service=lambda: Stalls(measured, probability=0.05, scale_s=0.005, alpha=1.5),
            rate_rps=0.6 * capacity,
        ),
        Scenario(
            "poisson_30_long",
            "Poisson at 30 % of capacity for 60 s (the bandits' learning)",
            slo,
            _poisson(0.3 * capacity, 60.0),
            stationary=True,
            rate_rps=0.3 * capacity,
        ),
        Scenario(
            "bursts_stalls",
            "on/off bursts (40 % base, 200 % for 1 s every 5 s) and stalls on 5 % of batches",
            slo,
            _workload(lambda: MMPPBursts(0.4 * capacity, 2.0 * capacity, 1.0, 4.0), 40.0),
            service=lambda: Stalls(measured, probability=0.05, scale_s=0.005, alpha=1.5),
        ),
        *_fault_scenarios(slo, capacity),
    ]
    defaults = {"service": lambda: measured, "warmup": warmup_seed(table)}
    return {s.name: _with_defaults(s, defaults) for s in scenarios}


def _fault_scenarios(slo: SLO, capacity: float) -> list[Scenario]:
    """Faults only real time has, replayed at 60 % of capacity for 30 s (see
    :mod:`adaptive_batcher.sim.faults`)."""
    rate = 0.6 * capacity
    stalls: list[Fault] = [LoopStall(6.0 + 2.0 * i, 0.1) for i in range(5)]
    stalls.append(LoopStall(20.0, 2.0))
    cases: list[tuple[str, str, list[Fault]]] = [
        ("loop_stalls", "event-loop stalls: 0.1 s every 2 s from 6 s, then 2 s at 20 s", stalls),
        ("slowdown_10x", "the model 10x slower for 5 s from 10 s", [Slowdown(10.0, 5.0, 10.0)]),
        (
            "contention",
            "CPU contention for 10 s from 10 s: batches 1.5x slower and 2 ms longer",
            [Slowdown(10.0, 10.0, 1.5, 0.002)],
        ),
        ("long_batch", "one batch 500 ms longer at 10 s", [LongBatch(10.0, 0.5)]),
    ]
    return [
        Scenario(
            name,
            f"Poisson at 60 % of capacity; {description}",
            slo,
            _poisson(rate, 30.0),
            rate_rps=rate,
            faults=Faults(tuple(faults)),
        )
        for name, description, faults in cases
    ]


def _with_defaults(scenario: Scenario, defaults: dict[str, Any]) -> Scenario:
    """``scenario`` with the fields it left at their class defaults set from ``defaults``."""
    fields = Scenario.__dataclass_fields__
    unset = {k: v for k, v in defaults.items() if getattr(scenario, k) is fields[k].default}
    return replace(scenario, **unset)


def _overload_then_light(capacity: float) -> tuple[float, ...]:
    """Step rates of 0.25 s: 4 s at 150 % of capacity, then 2 % / 50 % alternating for 16 s."""
    return (1.5 * capacity,) * 16 + (0.02 * capacity, 0.5 * capacity) * 32


SCENARIOS: dict[str, Scenario] = make_scenarios(_resnet(), SLO_50)
"""The scenarios on resnet50 / H200 (:meth:`TableService.from_h200`, the table shipped in
``adaptive_batcher/data/h200/``), SLO p99 50 ms."""
CAPACITY = capacity_rps(_resnet(), SLO_50)


def share_scenarios(traces_dir: str | os.PathLike[str] | None = None) -> dict[str, Scenario]:
    """Scenarios where one batch takes a large share of the SLO (issue 27): the shipped
    llama_1b decode-step table (about 50 ms, flat in the batch) under an SLO of 200 ms and its
    prefill table (61 ms at 2 prompts, 361 ms at 128) under 1000 ms, each at 30 / 60 / 90 %
    of capacity and on the Azure conversation trace; resnet50 under 20 ms at 30 and 90 %;
    resnet50 under 50 ms at 30 % with 30 % lognormal noise and with heavy-tailed stalls."""
    folder = None if traces_dir is None else Path(traces_dir)
    out: dict[str, Scenario] = {}
    for model, slo_ms in (("llama_1b_decode", 200.0), ("llama_1b_prefill", 1000.0)):
        table, slo = TableService.from_h200(model), SLO(latency_ms=slo_ms)
        named = make_scenarios(table, slo, traces_dir)
        for name in ("poisson_30", "poisson_60", "poisson_90"):
            out[f"{model}_slo{slo_ms:g}_{name}"] = named[name]
        rate = 0.6 * capacity_rps(table, slo)
        out[f"{model}_slo{slo_ms:g}_azure_conv_60"] = replace(
            named["azure_conv"],
            description=f"Azure LLM conversation trace, time compressed to {rate:.0f} req/s",
            arrivals=_trace_at("azure_llm_2023_conv.csv", rate, folder),
        )
    tight = make_scenarios(_resnet(), SLO(latency_ms=20.0), traces_dir)
    for name in ("poisson_30", "poisson_90"):
        out[f"resnet50_slo20_{name}"] = tight[name]
    rate = 0.3 * CAPACITY
    for name in ("noise_30", "stalls"):
        light = replace(SCENARIOS[name], arrivals=_poisson(rate, 20.0), rate_rps=rate)
        out[f"resnet50_slo50_{name}_at_30"] = light
    return out


def _bounds(scenario: Scenario) -> Bounds:
    """The adaptive contenders' range: windows up to the SLO's latency (at least 50 ms; a
    longer window can never meet the SLO), caps up to ``MAX_CAP``."""
    return Bounds(0.0, max(50.0, scenario.slo.latency_ms), 1, MAX_CAP)


def _adaptive(policy: Callable[[], Policy], *, shed: bool) -> Callable[[Scenario], SimConfig]:
    def make(scenario: Scenario) -> SimConfig:
        return SimConfig(
            MAX_CAP,
            0.0,
            slo=scenario.slo,
            policy=policy(),
            bounds=_bounds(scenario),
            guards=default_guards(shed_late=shed),
            service_profile=scenario.warmup,
        )

    return make


def _static(window_ms: float, cap: int) -> Callable[[Scenario], SimConfig]:
    return lambda scenario: SimConfig(cap, window_ms)


CONTENDERS: dict[str, Callable[[Scenario], SimConfig]] = {
    "adaptive_pid_shed": _adaptive(PID, shed=True),
    "adaptive_pid": _adaptive(PID, shed=False),
    "bandit_ucb_shed": _adaptive(DiscountedUCB, shed=True),
    "bandit_thompson_shed": _adaptive(DiscountedThompson, shed=True),
    "triton_like": _static(0.0, MAX_CAP),
    "ray_serve_defaults": _static(10.0, 10),
    "torchserve_like": lambda s: SimConfig(MAX_CAP, 10.0, window_origin="slot_free"),
    # baselines that learn a service-time model start from the same warm-up as ours
    "bentoml_cork": lambda s: SimConfig(
        MAX_CAP,
        1.0,
        slo=s.slo,
        policy=BentoCork(s.slo.latency_ms),
        bounds=_bounds(s),
        guards=[],
        service_profile=s.warmup,
    ),
    "clipper_aimd": lambda s: SimConfig(
        MAX_CAP,
        0.0,
        slo=s.slo,
        policy=AIMD(step=8, start_batch_size=32),
        bounds=_bounds(s),
        guards=[],
        service_profile=s.warmup,
    ),
}


def sheds(config: SimConfig) -> bool:
    """Whether ``config`` fails requests that are late rather than serve them: SLO-aware
    shedding (``shed_late``, or a guard among its guards that declares ``sheds = True``, as
    :class:`~adaptive_batcher.control.guards.ShedGuard` does), a policy that sheds by itself
    (one that declares ``sheds = True``, as the BentoML-like cork does; see
    :func:`~adaptive_batcher.control.policy.declares_shedding`) or a per-request deadline.
    Such a contender is compared with the best static setting with shedding
    (``static_grid(..., shed=True)``), not the one without."""
    return (
        config.shed_late
        or config.deadline_ms is not None
        or declares_shedding(config.policy)
        or any(declares_shedding(g) for g in config.guards or ())
    )


def run(scenario: Scenario, config: SimConfig, seed: int = 0) -> SimResult:
    """Replay ``scenario`` against ``config`` (fresh service model; same seed, same result)."""
    simulator = Simulator(
        scenario.service(),
        config,
        memory=scenario.memory,
        seed=seed,
        judge_slo=scenario.slo,
        faults=scenario.faults,
    )
    return simulator.run(scenario.arrivals(seed))


@dataclass(frozen=True)
class StaticRun:
    """One static (window, cap) replayed on a scenario, in hindsight.

    Attributes:
        window_ms, cap: the setting.
        shed: whether requests still queued ``p99 - 1.1 * service(cap)`` after arrival were shed.
        result: what the replay measured.
    """

    window_ms: float
    cap: int
    shed: bool
    result: SimResult

    @property
    def label(self) -> str:
        """``window <w> ms, cap <c>`` (and ``, shed``)."""
        return f"window {self.window_ms:g} ms, cap {self.cap}" + (", shed" if self.shed else "")


def static_grid(
    scenario: Scenario,
    *,
    shed: bool = False,
    windows_ms: tuple[float, ...] = STATIC_WINDOWS_MS,
    caps: tuple[int, ...] = STATIC_CAPS,
    seed: int = 0,
) -> list[StaticRun]:
    """Replay every static (window, cap) of the grid on ``scenario`` (same seed, same trace).

    With ``shed``, each setting also fails requests still queued ``p99 - 1.1 * service(cap)``
    after arrival (``service`` from the scenario's warm-up figures): the same idea as our
    SLO-aware shedding, given to a fixed setting (an ablation: how much of a gain is shedding).
    A cap whose ``1.1 * service`` leaves no time at all is left out with ``shed`` (it would shed
    every request on arrival).
    """
    measured = dict(scenario.warmup)
    runs: list[StaticRun] = []
    for cap in caps:
        deadline = None
        if shed:
            service = measured.get(cap, max(measured.values()) if measured else 0.0)
            deadline = scenario.slo.latency_ms - 1.1 * service
            if deadline <= 0:
                continue
        for window in windows_ms:
            config = replace(_static(window, cap)(scenario), deadline_ms=deadline)
            runs.append(StaticRun(window, cap, shed, run(scenario, config, seed)))
    return runs


def best_static(runs: Sequence[StaticRun]) -> StaticRun:
    """The run with the highest goodput (the best any fixed setting could do, known only in
    hindsight); ties go to the lower device cost per answer within the SLO."""
    return max(runs, key=lambda r: (r.result.goodput_rps, -r.result.device_ms_per_good))


def cost_oracle(runs: Sequence[StaticRun], attainment: float = 0.99) -> StaticRun | None:
    """The cheapest run (device time per request) that answers at least ``attainment`` of the
    requests within the SLO: the least a fixed setting that meets the SLO can spend, in
    hindsight. None when no run meets it (an overload no fixed setting survives)."""
    meeting = [r for r in runs if r.result.slo_attainment >= attainment]
    return min(meeting, key=lambda r: r.result.device_ms_per_request) if meeting else None

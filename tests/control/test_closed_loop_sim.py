"""Closed loop on the simulator: the real engine and controller against a modelled device.

A load step, a memory squeeze, an SLO change: p99 settles under the SLO, the cap shrinks under
memory pressure, and no request is lost.
"""

from __future__ import annotations

import numpy as np
import pytest
from structlog.testing import capture_logs

from adaptive_batcher.control.controller import default_guards
from adaptive_batcher.control.types import Bounds
from adaptive_batcher.policies import PID
from adaptive_batcher.sim.result import Outcome, SimResult
from adaptive_batcher.sim.scenarios import CAPACITY, SLO_50, make_scenarios, run, warmup_seed
from adaptive_batcher.sim.service import LinearService, MemoryLimit, Noisy, Stalls, TableService
from adaptive_batcher.sim.simulator import SimConfig, Simulator
from adaptive_batcher.sim.workloads import Arrivals, ClosedLoop, Poisson, Steps
from adaptive_batcher.slo import SLO

RESNET = TableService.from_h200("resnet50")  # ../shared/profiles/h200/batch_profile.csv


def late_p99(result: SimResult, after_s: float) -> float:
    series = result.series
    keep = (series.start_s >= after_s) & ~np.isnan(series.p99_ms)
    return float(np.max(series.p99_ms[keep]))


def test_three_fold_load_step_recovers_within_two_seconds() -> None:
    slo = SLO(latency_ms=40.0)
    arrivals = Steps((4000.0, 12000.0), 20.0).generate(40.0, np.random.default_rng(11))
    config = SimConfig(max_batch_size=256, window_ms=0.0, slo=slo, policy=PID())
    result = Simulator(RESNET, config).run(arrivals)
    assert result.lost == 0
    assert result.recovery_time_s(20.0, slo.latency_ms, hold_s=10.0) <= 2.0
    assert late_p99(result, 25.0) <= slo.latency_ms


def test_memory_squeeze_shrinks_the_cap_without_losing_requests() -> None:
    # 64 MiB + 1 MiB per item; 512 MiB fits 448 items, then another tenant leaves 160 MiB (96)
    mib = 2**20
    service = LinearService(
        0.003, 0.00005, memory_fixed_bytes=64 * mib, memory_per_unit_bytes=1 * mib
    )
    memory = MemoryLimit(512 * mib, squeezes=[(10.0, 160 * mib)])
    arrivals = Poisson(6000.0).generate(30.0, np.random.default_rng(2))
    config = SimConfig(max_batch_size=256, window_ms=2.0, slo=SLO(latency_ms=60), policy=PID())
    result = Simulator(service, config, memory=memory).run(arrivals)
    static = Simulator(service, SimConfig(256, 20.0), memory=memory).run(arrivals)
    assert result.lost == 0
    assert result.failed == 0
    assert static.lost == 0
    caps = result.series.decisions  # rows: time_s, window_ms, max_batch_size
    squeezed = caps[(caps[:, 0] > 11.0) & (caps[:, 0] < 20.0), 2]  # before the cooldown ends
    before = caps[caps[:, 0] < 10.0, 2]
    assert squeezed.size > 0
    assert squeezed.max() < before.max()  # the cap shrank when memory did
    assert squeezed[-1] <= 96  # and settled below what the squeezed memory holds
    # it learned, rather than failing batch after batch as a static cap does
    assert result.oom_errors < 0.2 * static.oom_errors


def test_slo_change_is_followed() -> None:
    loose, tight = SLO(latency_ms=100.0), SLO(latency_ms=25.0)
    arrivals = Poisson(8000.0).generate(40.0, np.random.default_rng(4))
    config = SimConfig(
        max_batch_size=512, window_ms=10.0, slo=loose, policy=PID(), slo_changes=((20.0, tight),)
    )
    result = Simulator(RESNET, config).run(arrivals)
    assert result.lost == 0
    assert late_p99(result, 25.0) <= tight.latency_ms


def test_window_goes_to_zero_for_a_lone_closed_loop_client() -> None:
    config = SimConfig(max_batch_size=64, window_ms=20.0, slo=SLO(latency_ms=100), policy=PID())
    result = Simulator(LinearService(0.004, 0.0), config).run(ClosedLoop(1, 0.0, duration_s=20.0))
    windows = result.series.decisions[:, 1]
    assert windows[-1] == 0.0
    assert result.p50_ms < 5.0  # latency is the model's, not the window's


def test_shedding_keeps_goodput_through_overload() -> None:
    slo = SLO(latency_ms=30.0)
    arrivals = Steps((6000.0, 25000.0, 6000.0), 10.0).generate(30.0, np.random.default_rng(5))
    plain = SimConfig(512, 0.0, slo=slo, policy=PID())
    shed = SimConfig(512, 0.0, slo=slo, policy=PID(), guards=default_guards(shed_late=True))
    without = Simulator(RESNET, plain).run(arrivals)
    with_shed = Simulator(RESNET, shed).run(arrivals)
    assert with_shed.lost == 0
    assert with_shed.goodput_rps > 1.2 * without.goodput_rps
    assert with_shed.p99_ms <= slo.latency_ms


def test_shedding_reaches_the_requests_queued_before_it_began() -> None:
    """A cold burst at twice resnet50's capacity: until the first tick (0.25 s) nothing is
    shed, and ~8,000 requests queue without a deadline. When shedding begins they get one too,
    so every batch that starts after it answers within the SLO (they used to be served, late,
    for a second more)."""
    slo = SLO(latency_ms=50.0)
    arrivals = Poisson(30000.0).generate(3.0, np.random.default_rng(3))
    config = SimConfig(
        512,
        0.0,
        slo=slo,
        policy=PID(),
        guards=default_guards(shed_late=True),
        service_profile=warmup_seed(RESNET),
    )
    result = Simulator(RESNET, config).run(arrivals)
    answered = result.outcome == Outcome.OK
    latency_ms = (result.done_s - result.arrival_s) * 1e3
    started_after_tick = answered & (result.done_s > 0.25 + 0.04)  # batches take <= 36 ms
    assert result.lost == 0
    assert np.count_nonzero(started_after_tick) > 30000
    # (a request may start at its deadline and end a few microseconds past the SLO; before,
    # the backlog was answered hundreds of ms late)
    assert np.max(latency_ms[started_after_tick]) <= slo.latency_ms + 0.1


def test_window_closes_for_closed_loop_clients_fewer_than_the_cap() -> None:
    """8 clients, no think time, 2 ms batches, cap 64: all 8 wait in the queue and nobody else
    can come, so any window is pure latency; the controller must close it."""
    config = SimConfig(max_batch_size=64, window_ms=5.0, slo=SLO(latency_ms=50), policy=PID())
    adaptive = Simulator(LinearService(0.002, 0.0), config).run(ClosedLoop(8, 0.0, duration_s=20.0))
    natural = Simulator(LinearService(0.002, 0.0), SimConfig(64, 0.0)).run(
        ClosedLoop(8, 0.0, duration_s=20.0)
    )
    assert adaptive.series.decisions[-1, 1] == 0.0
    assert adaptive.throughput_rps > 0.8 * natural.throughput_rps


def cold_burst_warnings(slo: SLO) -> list[dict[str, object]]:
    """The ``controller.slo_unreachable`` warnings of a cold start (no warm-up, no profile)
    on resnet50 hit by 10,000 requests at once, then 200 req/s for 3 s."""
    light = Poisson(200.0).generate(3.0, np.random.default_rng(0))
    times = np.sort(np.concatenate([np.zeros(10_000), light.times_s]))
    arrivals = Arrivals(times, np.ones(times.size, dtype=np.int64), "cold burst", 3.0)
    config = SimConfig(512, 0.0, slo=slo, policy=PID(), bounds=Bounds(0.0, 50.0, 1, 512))
    with capture_logs() as logs:
        result = Simulator(RESNET, config).run(arrivals)
    assert result.lost == 0
    return [e for e in logs if e["event"] == "controller.slo_unreachable"]


def test_a_cold_burst_of_full_batches_is_no_sign_of_an_unreachable_slo() -> None:
    """Before: the burst's batches of 512 (32 ms) were the only sizes the service-time fit had
    seen at the first tick; flat below them, it put a batch of one at 32 ms, and the controller
    warned that SLO p99 50 ms was out of reach (two batches 64 ms > 40 ms) on a device that
    answers a batch of one in 3.7 ms."""
    assert cold_burst_warnings(SLO(latency_ms=50.0)) == []
    # a 9 ms SLO (budget 7.2 ms) is out of reach for the 3.7 ms floor: still said, once
    [warning] = cold_burst_warnings(SLO(latency_ms=9.0))
    assert warning["service_ms_at_smallest"] > 3.6


def test_with_buckets_the_pid_fills_a_bucket_instead_of_padding_a_wider_batch() -> None:
    """resnet50, buckets 1, 2, 4, ... 512, Poisson at 60 % of capacity, SLO 50 ms: the widest
    window's batches (about 186) ran padded to 256 at 1.33x the cheapest static setting's device
    time; filling 128s instead comes within 1.15x (docs/policies.md, "The plan")."""
    scenario = make_scenarios(RESNET, SLO_50, None)["poisson_60"]
    assert scenario.rate_rps == pytest.approx(0.6 * CAPACITY)
    powers = tuple(1 << k for k in range(10))

    def buckets(cap: int) -> tuple[int, ...]:
        return tuple(b for b in powers if b <= cap)

    ours_config = SimConfig(
        512,
        0.0,
        slo=SLO_50,
        policy=PID(),
        bounds=Bounds(0.0, 50.0, 1, 512),
        guards=default_guards(shed_late=True),
        service_profile=scenario.warmup,
        batch_sizes=powers,
    )
    ours = run(scenario, ours_config)
    statics = [
        run(scenario, SimConfig(cap, window, batch_sizes=buckets(cap)))
        for cap in (128, 256)
        for window in (20.0, 30.0)
    ]
    cheapest = min(r.device_ms_per_request for r in statics if r.slo_attainment >= 0.99)
    assert ours.slo_attainment >= 0.99
    assert ours.device_ms_per_request <= 1.15 * cheapest


def test_with_buckets_a_large_padded_batch_does_not_sustain_itself() -> None:
    """2 ms + 0.1 ms per item, powers of two, 7,500 req/s, SLO 50 ms, no shedding: ~207
    requests arrive during a 256-bucket batch (27.6 ms) and fill the next one again, p99 55 ms,
    while the 128 bucket (14.8 ms, 8.6k/s) keeps up; the plan sees the cycle from the batches
    that really form and the cap steps down to 128 (found by a fresh user: attainment 0.82)."""
    slo = SLO(latency_ms=50.0)
    arrivals = Poisson(7500.0).generate(20.0, np.random.default_rng(0))
    powers = tuple(1 << k for k in range(10))
    config = SimConfig(512, 0.0, slo=slo, batch_sizes=powers)
    result = Simulator(LinearService(0.002, 0.0001), config).run(arrivals)
    assert result.lost == 0
    assert result.slo_attainment >= 0.99


def test_with_every_size_a_bucket_the_floor_keeps_its_headroom() -> None:
    """Every size 1-64 a bucket (nothing is padded), SLO 10 ms at 5,000 req/s on 2 ms + 0.1 ms
    per item: the cycle is the load's, not padding's, so the cap keeps the stability headroom
    (a floor without it put the cap at 22-23, 1.05x the arrivals: attainment 0.89; a fresh
    user's trial)."""
    slo = SLO(latency_ms=10.0)
    arrivals = Poisson(5000.0).generate(20.0, np.random.default_rng(0))
    config = SimConfig(64, 0.0, slo=slo, batch_sizes=range(1, 65))
    result = Simulator(LinearService(0.002, 0.0001), config).run(arrivals)
    assert result.lost == 0
    assert result.slo_attainment >= 0.99


def test_a_batch_a_large_share_of_the_slo_still_gets_a_window() -> None:
    """A llama-1B decode step (about 50 ms, flat in the batch) under a 140 ms SLO: window 0's
    own tail (a step waited out, then the request's own, 10 % noise: about 114 ms) leaves
    little of the 112 ms that the margin of the whole SLO aims at, yet the SLO has room. Two
    batches of one are 70 % of the room, so the margin exempts half of its reserve: the aim
    is 125.7 ms, a window opens and saves device time (the old law held window 0: 0.996x)."""
    decode = Noisy(TableService.from_h200("llama_1b_decode"), cv=0.10)
    slo = SLO(latency_ms=140.0)
    arrivals = Poisson(2700.0).generate(10.0, np.random.default_rng(0))
    warm = tuple((n, 1e3 * decode.inner.service_s(n, np.random.default_rng(0))) for n in (1, 256))
    ours = Simulator(
        decode,
        SimConfig(256, 0.0, slo=slo, policy=PID(), service_profile=warm),
        judge_slo=slo,
    ).run(arrivals)
    window_0 = Simulator(decode, SimConfig(256, 0.0), judge_slo=slo).run(arrivals)
    assert ours.lost == 0 and ours.slo_attainment >= 0.995
    assert ours.device_ms_per_request <= 0.93 * window_0.device_ms_per_request
    windows = ours.series.decisions[ours.series.decisions[:, 0] > 2.0, 1]
    assert np.median(windows) > 20.0


def test_a_noisy_batch_plans_for_a_requests_tail_not_a_sum_of_worst_cases() -> None:
    """The decode step under 200 ms with 30 % noise, 45 % load (a fresh user's case): the plan
    charged a window with a slow batch waited out plus a slow batch ridden, each at its error
    bars, and the isotonic fit spiked at the sizes the window rarely forms (73 ms for a 51 ms
    step): 1.34x the device time of a static 100 ms window at cap 256, the cheapest setting
    with 99 % of answers within the SLO. Planning a request's p99 from the fitted noise, on a
    fit without the spike, gives 1.19x, at the same attainment."""
    decode = Noisy(TableService.from_h200("llama_1b_decode"), cv=0.30)
    ours, static = _ours_and_static(decode, 200.0, 2112.0, 10.0, 256, SimConfig(256, 100.0))
    assert static.slo_attainment >= 0.99
    assert ours.lost == 0 and ours.slo_attainment >= 0.995
    assert ours.device_ms_per_request <= 1.25 * static.device_ms_per_request


def _ours_and_static(
    service: Noisy, slo_ms: float, rate_rps: float, seconds: float, cap: int, static: SimConfig
) -> tuple[SimResult, SimResult]:
    """Ours (the PID from window 0 at ``cap``, a power of two, warmed with the noiseless times
    at the powers of two up to it) and ``static`` on the same Poisson arrivals, both judged
    against the SLO."""
    slo = SLO(latency_ms=slo_ms)
    arrivals = Poisson(rate_rps).generate(seconds, np.random.default_rng(0))
    rng = np.random.default_rng(0)
    sizes = [1 << k for k in range(cap.bit_length())]
    warm = tuple((n, 1e3 * service.inner.service_s(n, rng)) for n in sizes)
    config = SimConfig(cap, 0.0, slo=slo, policy=PID(), service_profile=warm)
    ours = Simulator(service, config, judge_slo=slo).run(arrivals)
    return ours, Simulator(service, static, judge_slo=slo).run(arrivals)


def _paused_every_twentieth(window_ms: float | None) -> SimResult:
    """A small model (0.1 ms + 3 us an item) that pauses 15 ms on 5 % of its calls, Poisson
    1,500 req/s for 12 s under an SLO of 10 ms: ours (the PID with the default guards) for
    ``None``, else a static window at cap 64."""
    service = Stalls(LinearService(0.0001, 0.000003), probability=0.05, scale_s=0.015, alpha=200)
    slo = SLO(latency_ms=10.0)
    if window_ms is None:
        config = SimConfig(
            512,
            0.0,
            slo=slo,
            policy=PID(),
            bounds=Bounds(0.0, 50.0, 1, 512),
            guards=default_guards(shed_late=False),
            service_profile=tuple((2**k, 0.1 + 0.003 * 2**k) for k in range(10)),
        )
    else:
        config = SimConfig(64, window_ms)
    arrivals = Poisson(1500.0).generate(12.0, np.random.default_rng(5))
    return Simulator(service, config, seed=5, judge_slo=slo).run(arrivals)


def test_pauses_longer_than_the_slo_are_met_less_often_with_a_wider_window() -> None:
    """Each pause overruns the SLO by itself: its batch and the arrivals of its last 5 ms are
    late whatever the window, and the more calls, the more pauses. Window 0 calls the model
    for about every two requests (a quarter of the answers late); a window of a few ms calls
    it a seventh as often. Once the pauses are known (from 4 s), ours answers as many within
    the SLO as the best of those static windows. Before, the batch a p99 request rides, out of
    reach, kept the window at 0 (0.774 within the SLO from 4 s; now 0.923, window 8 ms 0.907)."""
    ours = _paused_every_twentieth(None)
    window_0, window_8 = _paused_every_twentieth(0.0), _paused_every_twentieth(8.0)
    slo = SLO(latency_ms=10.0)
    assert ours.lost == 0
    assert window_0.slo_attainment < 0.8 < window_8.slo_attainment
    learnt = ours.phase(4.0, 12.0, slo).slo_attainment
    assert learnt >= window_8.phase(4.0, 12.0, slo).slo_attainment - 0.01
    assert ours.slo_attainment > window_0.slo_attainment + 0.1

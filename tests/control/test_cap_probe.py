"""The cap probe: a cap that binds with a backlog is raised to the next candidate, briefly."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from adaptive_batcher.control.guards.cap_probe import CAP_PROBE, CapProbeGuard
from adaptive_batcher.control.types import Bounds, Decision, Observation
from adaptive_batcher.sim.scenarios import CONTENDERS, Scenario, run
from adaptive_batcher.sim.service import LinearService
from adaptive_batcher.sim.workloads import Poisson
from adaptive_batcher.slo import SLO
from tests.control.factories import Fixed, observe

BOUNDS = Bounds(0.0, 50.0, 1, 512, (64, 128, 256, 512))


def fixed(cap: int) -> Fixed:
    """A policy proposing ``cap`` at window 0 (``.decision`` moves it)."""
    return Fixed(Decision(0.0, cap, "policy"))


def stale_ms(n: int) -> float:
    """A fit right up to 256 (4 ms + 0.05 ms an item) with a figure too slow at 512: 45 ms,
    fewer items a second than 256 gives."""
    return 4.0 + 0.05 * n if n <= 256 else 45.0


def bound_tick(now_s: float, cap: int = 256, **changes: Any) -> Observation:
    """A tick whose batches fill ``cap`` with two batches' worth waiting behind them, planned on
    :func:`stale_ms`."""
    values: dict[str, Any] = {
        "service_median_ms": stale_ms,
        "now_s": now_s,
        "current": Decision(0.0, cap, "policy"),
        "bounds": BOUNDS,
        "fill_ratio": 1.0,
        "mean_batch_size": float(cap),
        "queue_depth": 2 * cap,
        "queued_units": 2 * cap,
    }
    values.update(changes)
    return observe(**values)


def test_a_cap_bound_with_a_backlog_is_probed_then_given_back() -> None:
    policy = fixed(256)
    guard = CapProbeGuard(policy, after_s=1.0, probe_ticks=2, first_every_s=5.0)
    assert guard.decide(bound_tick(10.0)).max_batch_size == 256  # binding starts
    assert guard.decide(bound_tick(10.5)).max_batch_size == 256  # not for after_s yet
    probe = guard.decide(bound_tick(11.0))
    assert (probe.max_batch_size, probe.reason) == (512, CAP_PROBE)
    assert guard.chosen(probe).max_batch_size == 256  # what the probe displaced
    held = guard.decide(bound_tick(11.25, cap=512))
    assert (held.max_batch_size, held.reason) == (512, CAP_PROBE)
    after = guard.decide(bound_tick(11.5, cap=512))
    assert (after.max_batch_size, after.reason) == (256, "policy")  # the policy decides again
    assert (guard.probes, guard.kept) == (1, 0)


def test_probes_back_off_while_the_policy_goes_back_and_reset_once_it_keeps() -> None:
    policy = fixed(256)
    guard = CapProbeGuard(policy, after_s=0.5, probe_ticks=1, first_every_s=2.0, max_every_s=5.0)
    starts = []
    for step in range(120):
        now = 10.0 + 0.25 * step
        if guard.decide(bound_tick(now)).reason == CAP_PROBE:
            starts.append(now)
    assert starts[:4] == [10.5, 14.5, 19.5, 24.5]  # 2 s doubled after each not kept, up to 5
    assert np.diff(starts).tolist()[2:] == [5.0] * (len(starts) - 3)

    kept = CapProbeGuard(policy, after_s=0.5, probe_ticks=1, first_every_s=2.0, max_every_s=5.0)
    now = 10.0
    while kept.decide(bound_tick(now)).reason != CAP_PROBE:
        now += 0.25
    first = now
    # the probe's batches taught the fit: the policy keeps 512 at its end
    policy.decision = Decision(0.0, 512, "policy")
    assert kept.decide(bound_tick(now + 0.25, cap=512)).max_batch_size == 512
    assert kept.kept == 1
    policy.decision, now = Decision(0.0, 256, "policy"), now + 0.5  # binding at 256 again
    while kept.decide(bound_tick(now)).reason != CAP_PROBE:
        now += 0.25
    assert now - first == 2.0  # first_every_s, not doubled


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"fill_ratio": 0.5}, "batches do not fill the cap"),
        ({"fill_ratio": float("nan")}, "no batch finished"),
        ({"queued_units": 200}, "no backlog beyond one batch"),
        ({"current": Decision(0.0, 512, "policy")}, "already the largest candidate"),
        ({"slo": None}, "no SLO"),
        ({"service_median_ms": lambda n: 0.2 * n}, "a batch of 512 alone overruns the room"),
        ({"service_samples_at": lambda n: 8}, "the next size's figure rests on 8 batches"),
        (
            {"service_median_ms": lambda n: 4.0 + 0.05 * n},
            "the fit gives 512 more items a second: the tail bound, not the fit, holds the cap",
        ),
    ],
)
def test_no_probe(changes: dict[str, Any], why: str) -> None:
    cap = changes["current"].max_batch_size if "current" in changes else 256
    guard = CapProbeGuard(fixed(cap), after_s=0.5)
    decisions = [guard.decide(bound_tick(10.0 + 0.25 * k, cap=cap, **changes)) for k in range(8)]
    assert all(d.reason != CAP_PROBE for d in decisions), why


def test_no_probe_while_the_policy_moves_the_cap_or_memory_forbids_it() -> None:
    moving = CapProbeGuard(fixed(128), after_s=0.5)
    assert all(moving.decide(bound_tick(10.0 + 0.25 * k)).reason != CAP_PROBE for k in range(8))

    ceiled = CapProbeGuard(Fixed(Decision(0.0, 256, "policy", max_batch_size_ceiling=256)))
    assert all(ceiled.decide(bound_tick(10.0 + 0.25 * k)).reason != CAP_PROBE for k in range(8))


def test_a_binding_broken_by_a_tick_without_backlog_starts_over() -> None:
    guard = CapProbeGuard(fixed(256), after_s=1.0)
    guard.decide(bound_tick(10.0))
    guard.decide(bound_tick(10.5, queued_units=0))  # the backlog drained
    assert guard.decide(bound_tick(11.0)).reason != CAP_PROBE  # bound since 11.0 only
    assert guard.decide(bound_tick(12.0)).reason == CAP_PROBE


def test_no_probe_while_the_cap_drains_its_backlog() -> None:
    guard = CapProbeGuard(fixed(256), after_s=1.0)
    backlogs = [2048, 1800, 1500, 1200, 900, 700]  # binding all along, the queue shrinking
    ticks = [bound_tick(10.0 + 0.25 * k, queued_units=q) for k, q in enumerate(backlogs)]
    assert all(guard.decide(tick).reason != CAP_PROBE for tick in ticks)


def test_a_reset_drops_a_probe_in_force() -> None:
    guard = CapProbeGuard(fixed(256), after_s=0.5, probe_ticks=3)
    guard.decide(bound_tick(10.0))
    assert guard.decide(bound_tick(10.5)).reason == CAP_PROBE
    guard.reset(Decision(0.0, 256))
    assert guard.decide(bound_tick(10.75, cap=512)).max_batch_size == 256


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"after_s": 0.0}, "CapProbeGuard.after_s must be a finite number > 0"),
        ({"probe_ticks": 0}, "CapProbeGuard.probe_ticks must be >= 1"),
        ({"first_every_s": -1.0}, "CapProbeGuard.first_every_s must be a finite number > 0"),
        ({"max_every_s": 1.0}, "CapProbeGuard.max_every_s must be a finite number >= 5"),
    ],
)
def test_arguments_are_checked(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CapProbeGuard(fixed(64), **kwargs)


def test_a_cap_cut_by_a_wrong_figure_above_it_is_probed_back_up() -> None:
    """A warm-up that measured 512 at 150 ms (10 ms + 0.2 ms an item takes 112 ms): at 4,400
    req/s, 256 (4,183 a second) cannot keep up and 512 (4,555) can, but the plan reads 512 at
    3,413 a second and keeps 256 under overload; no batch of 512 ever runs to correct it, and
    without the probe the queue grows for good (a quarter of the answers within the SLO)."""
    warmup = (*((1 << k, 10.0 + 0.2 * (1 << k)) for k in range(9)), (512, 150.0))
    scenario = Scenario(
        "wrong_warmup",
        "a warm-up figure too slow at 512",
        SLO(latency_ms=400.0),
        arrivals=lambda seed: Poisson(4400.0).generate(10.0, np.random.default_rng(seed)),
        service=lambda: LinearService(0.010, 0.0002),
        warmup=warmup,
    )
    result = run(scenario, CONTENDERS["adaptive_pid"](scenario))
    assert result.slo_attainment > 0.99
    assert result.series.decisions[-1][2] == 512

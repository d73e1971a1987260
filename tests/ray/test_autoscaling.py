"""Scale-out without a cluster: a replica's report of its batcher, and the replica count the
policy derives from the reports. Plain Python (no Ray); the Ray policy's own test, which needs
Ray, is in test_autoscaling_policy.py."""

from __future__ import annotations

import asyncio
import math

import pytest

from adaptive_batcher import SLO, AdaptiveBatcher
from adaptive_batcher.ray import replica_report as r
from adaptive_batcher.ray.autoscaling import (
    MAX_GROWTH,
    ScalingDecision,
    autoscaling_config,
    plan_replicas,
)
from adaptive_batcher.ray.replica_report import ReplicaReport
from adaptive_batcher.testing import run_in_virtual_time

SERVICE_S = 0.010  # a batch of any size takes 10 ms


async def sleepy_model(items: list[int]) -> list[int]:
    await asyncio.sleep(SERVICE_S)
    return items


def test_the_report_gives_rates_over_the_interval_since_the_last_reading() -> None:
    async def main() -> tuple[dict[str, float], dict[str, float]]:
        loop = asyncio.get_running_loop()
        report = ReplicaReport(clock=loop.time)
        async with AdaptiveBatcher(
            sleepy_model, max_batch_size=4, window_ms=0.0, slo=SLO(latency_ms=100)
        ) as batcher:
            first = report(batcher.stats())
            # 2 s: 40 requests in 10 waves of 4, one wave every 200 ms -> 10 batches of 4
            for _ in range(10):
                await asyncio.gather(*(batcher.submit(i) for i in range(4)))
                await asyncio.sleep(0.2 - SERVICE_S)
            return first, report(batcher.stats())

    first, second = run_in_virtual_time(main())
    assert first == {
        r.QUEUE_DEPTH: 0.0,
        r.MAX_BATCH_SIZE: 4.0,
        r.WINDOW_MS: 0.0,
        r.SLO_UNREACHABLE: 0.0,
        r.SLO_QUANTILE: 0.99,
    }
    assert second[r.ARRIVAL_RPS] == pytest.approx(20.0)  # 40 requests in 2 s
    assert second[r.ANSWERED_RPS] == pytest.approx(20.0)
    assert second[r.WITHIN_SLO_RPS] == pytest.approx(20.0)
    assert second[r.ENDED_RPS] == pytest.approx(20.0)
    assert second[r.BUSY_FRACTION] == pytest.approx(0.05)  # 10 batches x 10 ms in 2 s
    assert second[r.MEAN_BATCH_SIZE] == pytest.approx(4.0)
    assert second[r.DEVICE_MS_PER_REQUEST] == pytest.approx(2.5)  # 10 ms shared by 4
    assert all(isinstance(v, float) and math.isfinite(v) for v in second.values())


def test_refusals_count_as_ended_but_not_answered() -> None:
    async def main() -> dict[str, float]:
        loop = asyncio.get_running_loop()
        report = ReplicaReport(clock=loop.time)
        async with AdaptiveBatcher(
            sleepy_model, max_batch_size=1, window_ms=0.0, max_queue_size=2
        ) as batcher:
            report(batcher.stats())
            # the idle model takes one, two queue (all run one after the other), two are
            # refused at once (queue full)
            results = await asyncio.gather(
                *(batcher.submit(i) for i in range(5)), return_exceptions=True
            )
            assert sum(isinstance(x, Exception) for x in results) == 2
            await asyncio.sleep(1.0 - 3 * SERVICE_S)
            return report(batcher.stats())

    readings = run_in_virtual_time(main())
    assert readings[r.ARRIVAL_RPS] == pytest.approx(5.0)
    assert readings[r.ANSWERED_RPS] == pytest.approx(3.0)
    assert readings[r.ENDED_RPS] == pytest.approx(5.0)
    assert r.SLO_QUANTILE not in readings  # no SLO
    assert readings[r.WITHIN_SLO_RPS] == pytest.approx(3.0)  # without an SLO every answer


def replica(
    busy: float,
    *,
    arrivals: float = 100.0,
    answered: float | None = None,
    within: float | None = None,
    queue: float = 0.0,
    cap: float = 32.0,
    unreachable: float = 0.0,
    quantile: float | None = 0.99,
) -> dict[str, float]:
    """One replica's readings (means over the window)."""
    answered = arrivals if answered is None else answered
    readings = {
        r.BUSY_FRACTION: busy,
        r.ARRIVAL_RPS: arrivals,
        r.ANSWERED_RPS: answered,
        r.WITHIN_SLO_RPS: answered if within is None else within,
        r.ENDED_RPS: arrivals,
        r.QUEUE_DEPTH: queue,
        r.MAX_BATCH_SIZE: cap,
        r.SLO_UNREACHABLE: unreachable,
    }
    if quantile is not None:
        readings[r.SLO_QUANTILE] = quantile
    return readings


def plan(current: int, *reports: dict[str, float], window_s: float = 10.0) -> ScalingDecision:
    return plan_replicas(current, list(reports), window_s=window_s)


def test_saturated_replicas_are_joined_by_as_many_as_the_busy_time_needs() -> None:
    decision = plan(2, replica(0.95), replica(0.9))
    assert decision.reason == "saturated"
    assert decision.busy_replicas == pytest.approx(1.85)
    assert decision.needed == 4  # 1.85 / 0.6 -> 3.08 -> 4
    assert decision.replicas == 4


def test_a_queue_longer_than_a_full_batch_adds_a_replica() -> None:
    decision = plan(2, replica(0.5, queue=40.0, cap=32.0), replica(0.5))
    assert (decision.replicas, decision.reason) == (3, "backlog")


def test_a_missed_slo_adds_a_replica() -> None:
    # 5 % late with a p99 SLO, replicas not saturated
    decision = plan(2, replica(0.5, within=95.0), replica(0.5, within=95.0))
    assert decision.attainment == pytest.approx(0.95)
    assert (decision.replicas, decision.reason) == (3, "slo_missed")


def test_attainment_is_judged_only_over_enough_requests_for_the_percentile() -> None:
    # 99 requests in the window cannot show a p99 miss; 100 can
    few = plan(1, replica(0.3, arrivals=9.9, within=5.0), window_s=10.0)
    assert math.isnan(few.attainment)
    assert (few.replicas, few.reason) == (1, "steady")
    enough = plan(1, replica(0.3, arrivals=10.0, within=5.0), window_s=10.0)
    assert (enough.replicas, enough.reason) == (2, "slo_missed")


def test_an_slo_out_of_reach_for_a_batch_of_one_holds_the_count() -> None:
    # the device is too slow for the SLO: replicas would not help, so none are added
    decision = plan(2, replica(0.5, within=50.0, unreachable=1.0), replica(0.5, within=50.0))
    assert (decision.replicas, decision.reason) == (2, "slo_unreachable")
    # but saturation still scales out
    busy = plan(2, replica(0.95, within=50.0, unreachable=1.0), replica(0.95, within=50.0))
    assert busy.reason == "saturated" and busy.replicas > 2


def test_load_that_fits_on_fewer_replicas_removes_some() -> None:
    decision = plan(4, replica(0.2), replica(0.2), replica(0.25), replica(0.15))
    assert decision.busy_replicas == pytest.approx(0.8)
    assert (decision.replicas, decision.reason) == (2, "fits_fewer")  # 0.8 / 0.6 -> 2
    idle = plan(
        3, replica(0.0, arrivals=0.0), replica(0.0, arrivals=0.0), replica(0.0, arrivals=0.0)
    )
    assert (idle.replicas, idle.reason) == (1, "fits_fewer")


def test_between_the_thresholds_the_count_holds() -> None:
    # 0.7 busy each: above the 0.6 sizing target, below the 0.85 saturation
    decision = plan(2, replica(0.7), replica(0.7))
    assert decision.needed == 3
    assert (decision.replicas, decision.reason) == (2, "steady")


def test_refused_requests_raise_the_need_in_proportion() -> None:
    # half the arrivals refused: the served half kept 1.8 replicas busy, all would need 3.6
    decision = plan(2, replica(0.9, arrivals=200.0, answered=100.0))
    assert decision.needed == math.ceil(0.9 * 2 / 0.6)
    assert decision.reason == "saturated"


def test_one_decision_at_most_doubles_the_replicas() -> None:
    decision = plan(2, replica(1.0, arrivals=1000.0, answered=10.0), replica(1.0))
    assert decision.needed > 4
    assert decision.replicas == int(MAX_GROWTH * 2)


def test_replicas_that_have_not_reported_rates_are_left_out() -> None:
    starting = {r.QUEUE_DEPTH: 0.0, r.MAX_BATCH_SIZE: 32.0}  # first reading: no rates
    alone = plan(1, starting)
    assert (alone.replicas, alone.reason) == (1, "no_reports")
    decision = plan(2, replica(0.95), starting)
    # the new replica has not taken load yet: saturation is judged on the one that reported
    assert decision.reason == "saturated"


def test_without_an_slo_only_load_decides() -> None:
    decision = plan(1, replica(0.5, within=0.0, quantile=None))
    assert math.isnan(decision.attainment) and math.isnan(decision.quantile)
    assert (decision.replicas, decision.reason) == (1, "steady")


@pytest.mark.parametrize(
    ("kwargs", "error", "named"),
    [
        ({"current": -1}, ValueError, "current"),
        ({"current": 1.5}, TypeError, "current"),
        ({"window_s": 0.0}, ValueError, "window_s"),
        ({"target_busy_fraction": 0.0}, ValueError, "target_busy_fraction"),
        ({"target_busy_fraction": 1.5}, ValueError, "target_busy_fraction must be at most 1"),
        ({"scale_out_busy_fraction": 1.5}, ValueError, "scale_out_busy_fraction must be at most"),
        ({"scale_out_busy_fraction": 0.5}, ValueError, "scale_out_busy_fraction"),
    ],
)
def test_bad_arguments_are_named(
    kwargs: dict[str, object], error: type[Exception], named: str
) -> None:
    arguments: dict[str, object] = {"current": 1, "reports": [], "window_s": 1.0, **kwargs}
    with pytest.raises(error, match=named):
        plan_replicas(**arguments)  # type: ignore[arg-type]


def test_the_config_names_the_policy_and_checks_its_arguments() -> None:
    config = autoscaling_config(1, 3, target_busy_fraction=0.5, metrics_interval_s=1.0)
    assert config["min_replicas"] == 1 and config["max_replicas"] == 3
    assert config["metrics_interval_s"] == 1.0
    assert config["policy"]["policy_kwargs"] == {
        "target_busy_fraction": 0.5,
        "scale_out_busy_fraction": 0.85,
    }
    assert "metrics_interval_s" not in autoscaling_config()  # Ray's default, not set
    with pytest.raises(ValueError, match="max_replicas"):
        autoscaling_config(3, 2)
    with pytest.raises(ValueError, match="scale_out_busy_fraction"):
        autoscaling_config(scale_out_busy_fraction=0.1)
    with pytest.raises(ValueError, match="metrics_interval_s"):
        autoscaling_config(metrics_interval_s=0.0)

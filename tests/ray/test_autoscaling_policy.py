"""The scale-out policy as Ray Serve sees it, without a cluster: Ray's own config model takes our
``autoscaling_config``, its policy survives Ray's serialisation, and called with Ray's
``AutoscalingContext`` it sizes the deployment from the replicas' readings.

These need the ``ray`` extra; CI installs it (README's set-up), so they run there. Without Ray
they are skipped, except under CI, where a missing Ray fails them.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

if not os.environ.get("CI"):  # CI installs the ray extra: a missing Ray fails the imports below
    pytest.importorskip("ray.serve")

from ray.serve._private.common import DeploymentID, ReplicaID
from ray.serve.config import AutoscalingConfig, AutoscalingContext

from adaptive_batcher.ray import replica_report as r
from adaptive_batcher.ray.autoscaling import SLOAutoscaler, autoscaling_config

pytestmark = pytest.mark.ray

DEPLOYMENT = DeploymentID(name="ScaleOut", app_name="default")


def context(
    config: AutoscalingConfig, readings: dict[str, dict[str, float]], current: int
) -> AutoscalingContext:
    """Ray's context for one tick, with ``readings`` as the replicas' aggregated metrics."""
    replicas = {name: ReplicaID(unique_id=name, deployment_id=DEPLOYMENT) for name in readings}
    metrics: dict[str, dict[ReplicaID, float]] = {}
    for name, values in readings.items():
        for metric, value in values.items():
            metrics.setdefault(metric, {})[replicas[name]] = value
    return AutoscalingContext(
        deployment_id=DEPLOYMENT,
        deployment_name=DEPLOYMENT.name,
        app_name=DEPLOYMENT.app_name,
        current_num_replicas=current,
        target_num_replicas=current,
        running_replicas=list(replicas.values()),
        total_num_requests=0.0,
        total_queued_requests=0.0,
        aggregated_metrics=metrics,
        raw_metrics=None,
        capacity_adjusted_min_replicas=config.min_replicas,
        capacity_adjusted_max_replicas=config.max_replicas,
        policy_state={"kept": 1},
        last_scale_up_time=None,
        last_scale_down_time=None,
        current_time=0.0,
        config=config,
    )


def busy(fraction: float) -> dict[str, float]:
    return {
        r.BUSY_FRACTION: fraction,
        r.ARRIVAL_RPS: 50.0,
        r.ANSWERED_RPS: 50.0,
        r.WITHIN_SLO_RPS: 50.0,
        r.ENDED_RPS: 50.0,
        r.SLO_QUANTILE: 0.99,
        r.QUEUE_DEPTH: 1.0,
        r.MAX_BATCH_SIZE: 16.0,
    }


def ray_policy(config: AutoscalingConfig) -> Any:
    """The policy as Ray's controller makes it: deserialised, then the class instantiated with
    the config's ``policy_kwargs``."""
    policy_class = config.policy.get_policy()
    assert policy_class.__name__ == SLOAutoscaler.__name__
    return policy_class(**config.policy.policy_kwargs)


def test_ray_accepts_the_config_and_the_policy_scales_out_when_saturated() -> None:
    config = AutoscalingConfig(**autoscaling_config(1, 4, look_back_period_s=15.0))
    assert not config.policy.is_default_policy_function()
    policy = ray_policy(config)
    replicas, state = policy(context(config, {"a": busy(0.95), "b": busy(0.9)}, current=2))
    assert replicas == 4  # 1.85 busy replicas / 0.6 -> 4
    assert state["kept"] == 1  # Ray's own state is kept
    assert state["adaptive_batcher"]["reason"] == "saturated"


def test_the_policy_scales_in_when_the_load_fits_on_fewer() -> None:
    config = AutoscalingConfig(**autoscaling_config(1, 4, target_busy_fraction=0.5))
    policy = ray_policy(config)
    readings = {"a": busy(0.1), "b": busy(0.1), "c": busy(0.15)}
    replicas, state = policy(context(config, readings, current=3))
    assert replicas == 1
    assert state["adaptive_batcher"]["reason"] == "fits_fewer"


def test_before_any_reading_the_count_holds() -> None:
    config = AutoscalingConfig(**autoscaling_config(2, 4))
    replicas, state = ray_policy(config)(context(config, {}, current=2))
    assert replicas == 2
    assert state["adaptive_batcher"]["reason"] == "no_reports"


def test_bad_policy_arguments_fail_when_ray_makes_the_policy() -> None:
    config = AutoscalingConfig(**autoscaling_config())
    with pytest.raises(ValueError, match="target_busy_fraction"):
        config.policy.get_policy()(target_busy_fraction=2.0)


def test_the_example_builds_from_command_line_arguments() -> None:
    from ray.serve import Application

    from adaptive_batcher.examples.ray_scaleout import app

    # `serve run adaptive_batcher.examples.ray_scaleout:app max_replicas=3 slo_p99_ms=80`
    assert isinstance(app({"max_replicas": "3", "slo_p99_ms": "80"}), Application)
    with pytest.raises(TypeError, match="bogus"):
        app({"bogus": "1"})
    with pytest.raises(ValueError, match="max_replicas"):
        app({"min_replicas": "3", "max_replicas": "2"})

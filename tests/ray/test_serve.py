"""``adaptive_batcher.ray`` with Ray Serve installed: Ray's exception type, the replica's
``max_ongoing_requests`` warning, and the script that runs Ray's own tests against ours.

These need the ``ray`` extra; CI installs it (README's set-up), so they run there. Without Ray
they are skipped, except under CI, where a missing Ray fails them.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

if os.environ.get("CI"):
    import ray.serve  # CI installs the ray extra: a missing Ray is a failure there
else:
    ray = pytest.importorskip("ray")
    pytest.importorskip("ray.serve")

from ray.serve._private.common import DeploymentID, ReplicaID
from ray.serve._private.config import DeploymentConfig
from ray.serve.exceptions import RayServeException

from adaptive_batcher.ray import BatchSizeMismatchError, batch

pytestmark = pytest.mark.ray

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def replica(request: pytest.FixtureRequest) -> Iterator[DeploymentConfig]:
    """A Ray Serve replica context, set the way Ray's own unit tests set it, then removed."""
    config = DeploymentConfig(max_ongoing_requests=request.param)
    ray.serve.context._set_internal_replica_context(
        replica_id=ReplicaID(unique_id="test", deployment_id=DeploymentID(name="test")),
        servable_object=None,
        _deployment_config=config,
        rank=0,
        world_size=1,
        code_version="test",
    )
    yield config
    ray.serve.context._INTERNAL_REPLICA_CONTEXT = None


async def test_a_wrong_number_of_results_is_a_ray_serve_exception() -> None:
    @batch(max_batch_size=1)
    async def handler(requests: list[int]) -> list[int]:
        return []

    with pytest.raises(RayServeException) as raised:
        await handler(1)
    assert isinstance(raised.value, BatchSizeMismatchError)


def cap_warnings(events: list[dict[str, Any]]) -> list[tuple[int, int]]:
    return [
        (e["max_batch_size"], e["max_ongoing_requests"])
        for e in events
        if e["event"] == "ray.batch.cap_unreachable"
    ]


@pytest.mark.parametrize("replica", [8], indirect=True)
async def test_a_replica_that_cannot_fill_a_batch_is_warned_about(
    replica: DeploymentConfig,
) -> None:
    class Model:
        def __init__(self, cap: int) -> None:
            self.cap = cap

        @batch(max_batch_size=9, batch_wait_timeout_s=0)
        async def over(self, requests: list[int]) -> list[int]:
            return requests

        @batch(max_batch_size=8, batch_wait_timeout_s=0)
        async def at_bound(self, requests: list[int]) -> list[int]:
            return requests

    model = Model(1)
    with capture_logs() as events:  # the check runs when the instance's batcher is made
        assert await model.over(1) == 1
        assert await model.at_bound(2) == 2
    assert cap_warnings(events) == [(9, 8)]

    with capture_logs() as events:  # and on every change of the cap or the slots
        Model.at_bound.set_max_batch_size(7)  # type: ignore[attr-defined]
        Model.at_bound.set_max_batch_size(8)  # type: ignore[attr-defined]
        Model.at_bound.set_max_batch_size(9)  # type: ignore[attr-defined]
        Model.at_bound.set_max_batch_size(4)  # type: ignore[attr-defined]
        Model.at_bound.set_max_concurrent_batches(3)  # type: ignore[attr-defined]
    assert cap_warnings(events) == [(9, 8), (4, 8)]
    await asyncio.sleep(0)


async def test_outside_a_replica_nothing_is_warned() -> None:
    @batch(max_batch_size=10_000)
    async def handler(requests: list[int]) -> list[int]:
        return requests

    with capture_logs() as events:
        assert await handler(3) == 3
    assert cap_warnings(events) == []


OUR_UPSTREAM_STYLE_TEST = """
import asyncio

import pytest
from ray import serve


@pytest.mark.asyncio
async def test_serve_batch_is_ours():
    import adaptive_batcher.ray

    assert serve.batch is adaptive_batcher.ray.batch

    @serve.batch(max_batch_size=2, batch_wait_timeout_s=1000)
    async def double(values):
        return [2 * v for v in values]

    assert await asyncio.gather(double(1), double(2)) == [2, 4]


@pytest.mark.asyncio
async def test_that_fails():
    assert False
"""


def test_the_upstream_script_runs_a_test_file_against_our_batch(tmp_path: Path) -> None:
    source = tmp_path / "test_batching.py"
    source.write_text(OUR_UPSTREAM_STYLE_TEST, encoding="utf-8")
    script = ROOT / "scripts" / "ray_upstream_tests.py"
    done = subprocess.run(
        [sys.executable, str(script), "--source", str(source), "--min-passed", "1"],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert "1 of 2 cases passed against adaptive_batcher.ray.batch" in done.stdout, done.stdout
    assert "failed:  test_that_fails" in done.stdout
    assert "not run" not in done.stdout  # the case left out is not in this file
    assert done.returncode == 0


def test_the_upstream_script_says_where_to_get_the_file(tmp_path: Path) -> None:
    script = ROOT / "scripts" / "ray_upstream_tests.py"
    done = subprocess.run(
        [sys.executable, str(script), "--source", str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 2
    assert "do not ship their tests" in done.stderr


@pytest.mark.parametrize("replica", [64], indirect=True)
async def test_the_example_answers_408_when_a_request_body_never_arrives(
    replica: DeploymentConfig,
) -> None:
    """Ray Serve re-sends a request whose replica died right after accepting it; the body may
    have been read by the dead one, and the replica it is re-sent to waited for it until the
    client's timeout (the flaky replica-kill test: 60 s, then httpx.ReadTimeout)."""
    from starlette.requests import Request

    from adaptive_batcher.examples.ray_scaleout import ScaleOut

    async def body_that_never_comes() -> dict[str, Any]:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async def body(x: float) -> dict[str, Any]:
        return {"type": "http.request", "body": f'{{"x": {x}}}'.encode(), "more_body": False}

    scope = {"type": "http", "method": "POST", "path": "/", "headers": [], "query_string": b""}
    model = ScaleOut(base_ms=1.0, per_item_ms=0.0, body_timeout_s=0.05)
    stuck = await model(Request(scope, body_that_never_comes))
    assert stuck.status_code == 408
    assert stuck.body == b'{"error":"the request body did not arrive within 0.05 s"}'
    answered = await model(Request(scope, lambda: body(1.5)))
    assert answered.status_code == 200
    await model.predict.aclose(model)  # type: ignore[attr-defined]

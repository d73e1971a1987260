"""Fixtures for the profiler tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import structlog

from adaptive_batcher.profile import ProfileResult
from tests.profile.fakes import RESNET50_H200, FakeClock, table_result


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def resnet50() -> ProfileResult:
    return table_result(RESNET50_H200)


@pytest.fixture(autouse=True)
def pristine_structlog() -> Iterator[None]:
    """structlog as an application that never configured it; restored afterwards.

    Autouse: the ``adaptive-batcher`` entry point configures structlog (``--log-level``), and a
    configuration left behind by any test must not change what another test sees.
    """
    was_configured = structlog.is_configured()
    config = structlog.get_config()
    structlog.reset_defaults()
    yield
    if was_configured:
        structlog.configure(**config)
    else:
        structlog.reset_defaults()

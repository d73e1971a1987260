"""Fixtures for the profiler tests."""

from __future__ import annotations

import pytest

from adaptive_batcher.profile import ProfileResult
from tests.profile.fakes import RESNET50_H200, FakeClock, table_result


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def resnet50() -> ProfileResult:
    return table_result(RESNET50_H200)


@pytest.fixture(autouse=True)
def _pristine_structlog(pristine_structlog: None) -> None:
    """Every profiler test sees structlog as an application that never configured it."""

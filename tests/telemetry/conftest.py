"""Fixtures for the telemetry tests: a fake ``pynvml`` and helpers to read captured logs."""

from __future__ import annotations

import sys
from collections.abc import Iterator, MutableMapping
from typing import Any

import pytest
from structlog.testing import capture_logs

from adaptive_batcher.testing import FakePynvml


@pytest.fixture
def fake_nvml(monkeypatch: pytest.MonkeyPatch) -> FakePynvml:
    """A FakePynvml installed as ``pynvml`` for the duration of the test."""
    fake = FakePynvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    return fake


@pytest.fixture
def logs() -> Iterator[list[MutableMapping[str, Any]]]:
    """Every structlog event emitted during the test (all levels)."""
    with capture_logs() as captured:
        yield captured

"""Suite-wide fixtures."""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from typing import Any

import pytest
import structlog


def _drop_debug(_: Any, method_name: str, event_dict: MutableMapping[str, Any]) -> Any:
    """Keep the per-batch and per-tick debug events out of test output (capture_logs, which
    replaces the processors, still sees them)."""
    if method_name == "debug":
        raise structlog.DropEvent
    return event_dict


def _configure() -> None:
    structlog.reset_defaults()
    processors = [_drop_debug, *structlog.get_config()["processors"]]
    structlog.configure(processors=processors)


@pytest.fixture(autouse=True)
def _structlog_defaults() -> Iterator[None]:
    """Quiet debug events, and undo any configuration a test (e.g. a CLI run) made."""
    _configure()
    yield
    _configure()


@pytest.fixture
def pristine_structlog() -> Iterator[None]:
    """structlog as an application that never configured it; restored afterwards.

    For the profiler's tests (tests/profile/, tests/cli/test_profile_cmd.py): the
    ``adaptive-batcher`` entry point configures structlog (``--log-level``), and a configuration
    left behind by any test must not change what another test sees.
    """
    was_configured = structlog.is_configured()
    config = structlog.get_config()
    structlog.reset_defaults()
    yield
    if was_configured:
        structlog.configure(**config)
    else:
        structlog.reset_defaults()

"""Suite-wide fixtures."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import structlog


@pytest.fixture(autouse=True)
def _structlog_defaults() -> Iterator[None]:
    """Undo any structlog configuration a test (e.g. a CLI run in-process) made."""
    yield
    structlog.reset_defaults()

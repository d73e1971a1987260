"""The gateway package's names: the HTTP parts load on first use, and without the gateway extra
the package still imports and reading one of them names the extra."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

import adaptive_batcher.gateway as gateway
from adaptive_batcher.gateway.app import gateway_app, gateway_lifespan
from adaptive_batcher.gateway.openai import OpenAIEngine
from adaptive_batcher.gateway.telemetry import PrometheusEngineTelemetry


def test_the_http_parts_are_the_modules_own() -> None:
    assert gateway.OpenAIEngine is OpenAIEngine
    assert gateway.PrometheusEngineTelemetry is PrometheusEngineTelemetry
    assert gateway.gateway_app is gateway_app and gateway.gateway_lifespan is gateway_lifespan
    assert {"OpenAIEngine", "gateway_app"} <= set(gateway.__all__)


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'OpenAIEngin'"):
        _ = gateway.OpenAIEngin  # type: ignore[attr-defined]


def test_without_httpx_the_package_imports_and_the_http_parts_name_the_extra() -> None:
    code = """
        import sys
        sys.modules["httpx"] = None  # as if it were not installed
        import adaptive_batcher.gateway as gateway
        print(gateway.LLMGate.__name__)
        try:
            gateway.OpenAIEngine
        except ImportError as exc:
            print(exc)
    """
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "LLMGate"
    assert lines[1] == (
        "adaptive_batcher.gateway.openai needs httpx (the gateway extra): "
        'pip install "adaptive-batcher[gateway]"'
    )

"""The admission gate in front of a real LLM engine: an asyncio shell over
:class:`~adaptive_batcher.llm.core.GateCore`, engine adapters (OpenAI-compatible HTTP, in
process), engine telemetry, and an OpenAI-compatible gateway (ASGI app and command line).

* :mod:`~adaptive_batcher.gateway.shell`: :class:`LLMGate` (``submit`` -> :class:`GateStream`,
  ``stats``, ``aclose``);
* :mod:`~adaptive_batcher.gateway.types` and :mod:`~adaptive_batcher.gateway.errors`: what an
  engine adapter takes, yields and raises;
* :mod:`~adaptive_batcher.gateway.in_process`: :class:`InProcessEngine`, any async generator as
  an engine;
* :mod:`~adaptive_batcher.gateway.prometheus` and :mod:`~adaptive_batcher.gateway.otel`: the
  gate's exporters (imported on their own: they need their metrics library).

The HTTP parts, ``OpenAIEngine``, ``PrometheusEngineTelemetry``, ``gateway_app``,
``gateway_lifespan`` and ``DrainingServer`` (uvicorn's server, draining the gate first), need
the ``gateway`` extra; they are importable from here too, loaded on first use, so
``import adaptive_batcher.gateway`` works without the extra and reading one of those names
without it raises an ``ImportError`` naming the extra.

The guide is docs/llm.md.
"""

from typing import TYPE_CHECKING, Any

from adaptive_batcher.gateway.errors import (
    UpstreamError,
    UpstreamEventError,
    UpstreamHTTPError,
    UpstreamProtocolError,
    UpstreamTimeoutError,
    UpstreamUnavailableError,
)
from adaptive_batcher.gateway.in_process import InProcessEngine
from adaptive_batcher.gateway.shell import LLMGate
from adaptive_batcher.gateway.stats import LLMGateStats, TimeQuantiles
from adaptive_batcher.gateway.stream import GateStream
from adaptive_batcher.gateway.types import Chunk, Engine, EngineTelemetry, LLMRequest, Usage

if TYPE_CHECKING:
    from adaptive_batcher.gateway.app import gateway_app, gateway_lifespan
    from adaptive_batcher.gateway.openai import OpenAIEngine
    from adaptive_batcher.gateway.server import DrainingServer
    from adaptive_batcher.gateway.telemetry import PrometheusEngineTelemetry

_HTTP_PARTS = {
    "DrainingServer": "adaptive_batcher.gateway.server",
    "OpenAIEngine": "adaptive_batcher.gateway.openai",
    "PrometheusEngineTelemetry": "adaptive_batcher.gateway.telemetry",
    "gateway_app": "adaptive_batcher.gateway.app",
    "gateway_lifespan": "adaptive_batcher.gateway.app",
}


def __getattr__(name: str) -> Any:
    """The HTTP parts, imported on first use (they need the gateway extra)."""
    module = _HTTP_PARTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "Chunk",
    "DrainingServer",
    "Engine",
    "EngineTelemetry",
    "GateStream",
    "InProcessEngine",
    "LLMGate",
    "LLMGateStats",
    "LLMRequest",
    "OpenAIEngine",
    "PrometheusEngineTelemetry",
    "TimeQuantiles",
    "UpstreamError",
    "UpstreamEventError",
    "UpstreamHTTPError",
    "UpstreamProtocolError",
    "UpstreamTimeoutError",
    "UpstreamUnavailableError",
    "Usage",
    "gateway_app",
    "gateway_lifespan",
]

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

The guide is docs/llm.md.
"""

from adaptive_batcher.gateway.errors import (
    UpstreamError,
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

__all__ = [
    "Chunk",
    "Engine",
    "EngineTelemetry",
    "GateStream",
    "InProcessEngine",
    "LLMGate",
    "LLMGateStats",
    "LLMRequest",
    "TimeQuantiles",
    "UpstreamError",
    "UpstreamHTTPError",
    "UpstreamProtocolError",
    "UpstreamTimeoutError",
    "UpstreamUnavailableError",
    "Usage",
]

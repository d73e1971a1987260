"""SLO-driven admission in front of a continuous-batching LLM engine (vLLM, SGLang, TGI, ...).

A continuous-batching engine forms its own batches every step, so a batching window in front
of it is the wrong tool; what a client controls is how many requests are inside the engine, in
what order they enter, and which are refused early. This package is that control, sans-IO:

* :mod:`~adaptive_batcher.llm.slo`: :class:`TokenSLO` (TTFT and TPOT targets) and presets;
* :mod:`~adaptive_batcher.llm.gate`: :class:`AdmissionGate`, the queue, limit, order,
  early rejection and deadlines (events in, actions out);
* :mod:`~adaptive_batcher.llm.controller` and :mod:`~adaptive_batcher.llm.laws`: the
  controller that sets the gate's knobs from client-side observations, and its limit laws;
* :mod:`~adaptive_batcher.llm.core`: :class:`GateCore`, the glue every shell drives (the
  simulator in :mod:`adaptive_batcher.sim.llm`; an asyncio server);
* :mod:`~adaptive_batcher.llm.errors`: the typed refusals a server maps to 429/503.

The guide is docs/llm.md.
"""

from adaptive_batcher.llm.controller import GateDecision, TokenController
from adaptive_batcher.llm.core import GateCore
from adaptive_batcher.llm.errors import (
    GateQueueFullError,
    GateRejectedError,
    RequestFailedError,
    TTFTUnreachableError,
)
from adaptive_batcher.llm.gate import AdmissionGate, GateLimits, GateRequest, TTFTForecast
from adaptive_batcher.llm.laws import AIMDLimit, LimitLaw, ModelLimit, StaticLimit
from adaptive_batcher.llm.signals import EngineMetrics
from adaptive_batcher.llm.slo import TOKEN_SLO_PRESETS, TokenSLO, token_slo_preset

__all__ = [
    "TOKEN_SLO_PRESETS",
    "AIMDLimit",
    "AdmissionGate",
    "EngineMetrics",
    "GateCore",
    "GateDecision",
    "GateLimits",
    "GateQueueFullError",
    "GateRejectedError",
    "GateRequest",
    "LimitLaw",
    "ModelLimit",
    "RequestFailedError",
    "StaticLimit",
    "TTFTForecast",
    "TTFTUnreachableError",
    "TokenController",
    "TokenSLO",
    "token_slo_preset",
]

"""What the gate's exporters publish, and the gates one exporter serves: the part common to
Prometheus (:mod:`adaptive_batcher.gateway.prometheus`) and OpenTelemetry
(:mod:`adaptive_batcher.gateway.otel`). Nothing here imports a metrics library.

Everything is read from :meth:`~adaptive_batcher.gateway.shell.LLMGate.stats`
when a scrape (or a collection) asks: the serving path does no work for an exporter. Reading
is safe from another thread than the gate's event loop.

:data:`GATE_METRICS` lists every metric with its names, type, unit, labels and meaning; every
metric carries the ``gate`` label, the gate's ``name``.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Final, Literal

from adaptive_batcher.gateway.shell import LLMGate
from adaptive_batcher.gateway.stats import LLMGateStats

__all__ = [
    "ADMITTED",
    "ADMIT_TTFT",
    "GATE_METRICS",
    "IN_FLIGHT",
    "IN_FLIGHT_LIMIT",
    "PREFILL_PACING",
    "QUANTILES",
    "QUEUE_WAIT",
    "REJECTED",
    "REQUESTS",
    "SLO_TPOT",
    "SLO_TTFT",
    "SUBMITTED",
    "TPOT",
    "TPOT_QUANTILE",
    "TTFT",
    "TTFT_QUANTILE",
    "WAITING",
    "GateList",
    "GateMetric",
    "outcomes",
]

Kind = Literal["counter", "gauge", "histogram"]

QUANTILES: Final = (0.5, 0.9, 0.99)
"""The quantiles of the sliding windows exported as gauges (label ``quantile``)."""


@dataclass(frozen=True, slots=True)
class GateMetric:
    """One exported metric.

    Attributes:
        name: the Prometheus name as exposed (counters with their ``_total``).
        otel_name: the OpenTelemetry instrument name.
        kind: ``counter``, ``gauge`` or ``histogram``.
        unit: the unit in UCUM form (``s``, ``{request}``).
        labels: the label names, ``gate`` first.
        help: what it measures.
    """

    name: str
    otel_name: str
    kind: Kind
    unit: str
    labels: tuple[str, ...]
    help: str


def _metric(name: str, kind: Kind, unit: str, help: str, *labels: str) -> GateMetric:
    otel = "adaptive_batcher.llm." + name.removesuffix("_total").replace("_seconds", "")
    otel = otel.replace("requests_", "requests.")
    return GateMetric(f"adaptive_batcher_llm_{name}", otel, kind, unit, ("gate", *labels), help)


TTFT = _metric(
    "ttft_seconds",
    "histogram",
    "s",
    "Time to first token of the requests that got one: arrival at the gate (its queue "
    "included) to the first chunk with tokens, since the gate was made.",
)
TPOT = _metric(
    "tpot_seconds",
    "histogram",
    "s",
    "Time per output token of completed requests: (last token - first token) / (output "
    "tokens - 1), 0 for one token, since the gate was made.",
)
QUEUE_WAIT = _metric(
    "queue_wait_seconds",
    "histogram",
    "s",
    "Time admitted requests waited in the gate's queue, since the gate was made.",
)
TTFT_QUANTILE = _metric(
    "ttft_quantile_seconds",
    "gauge",
    "s",
    "TTFT quantiles over the gate's sliding window (10 s), 1 % resolution.",
    "quantile",
)
TPOT_QUANTILE = _metric(
    "tpot_quantile_seconds",
    "gauge",
    "s",
    "TPOT quantiles over the gate's sliding window (10 s), 1 % resolution.",
    "quantile",
)
IN_FLIGHT_LIMIT = _metric("in_flight_limit", "gauge", "{request}", "The in-flight limit in force.")
IN_FLIGHT = _metric("in_flight", "gauge", "{request}", "Requests inside the engine now.")
WAITING = _metric("waiting", "gauge", "{request}", "Requests waiting in the gate's queue now.")
ADMIT_TTFT = _metric(
    "admit_ttft_seconds",
    "gauge",
    "s",
    "The predicted TTFT above which an arrival is refused at once (only while early "
    "rejection is on).",
)
PREFILL_PACING = _metric(
    "prefill_pacing_tokens_per_second",
    "gauge",
    "{token}/s",
    "The prompt tokens a second prefill pacing lets into the engine (only while pacing is on "
    "and the step-time fit has a prefill cost).",
)
SLO_TTFT = _metric("slo_ttft_seconds", "gauge", "s", "The SLO's TTFT target.")
SLO_TPOT = _metric("slo_tpot_seconds", "gauge", "s", "The SLO's TPOT target.")
SUBMITTED = _metric(
    "requests_submitted_total",
    "counter",
    "{request}",
    "Requests submitted to the gate, refused ones included.",
)
ADMITTED = _metric(
    "requests_admitted_total", "counter", "{request}", "Requests forwarded to the engine."
)
REQUESTS = _metric(
    "requests_total",
    "counter",
    "{request}",
    "Requests that ended, by outcome (completed, rejected, expired, failed, cancelled); they "
    "add up to the submitted ones once every request has ended.",
    "outcome",
)
REJECTED = _metric(
    "requests_rejected_total",
    "counter",
    "{request}",
    "Requests refused at once, by reason (ttft_unreachable: HTTP 503, queue_full: HTTP 429, "
    "closed).",
    "reason",
)

GATE_METRICS: Final = (
    TTFT,
    TPOT,
    QUEUE_WAIT,
    TTFT_QUANTILE,
    TPOT_QUANTILE,
    IN_FLIGHT_LIMIT,
    IN_FLIGHT,
    WAITING,
    ADMIT_TTFT,
    PREFILL_PACING,
    SLO_TTFT,
    SLO_TPOT,
    SUBMITTED,
    ADMITTED,
    REQUESTS,
    REJECTED,
)
"""Every metric the gate's exporters publish."""


def outcomes(stats: LLMGateStats) -> dict[str, int]:
    """{outcome: requests that ended so}, the ``outcome`` label of :data:`REQUESTS`."""
    counts = stats.counts
    return {
        "completed": counts.completed,
        "rejected": counts.rejected,
        "expired": counts.expired,
        "failed": counts.failed,
        "cancelled": counts.cancelled,
    }


class GateList:
    """The gates one exporter serves, by name (the ``gate`` label must tell them apart)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._gates: dict[str, LLMGate] = {}

    def add(self, gate: LLMGate) -> None:
        """Serve ``gate``; a closed gate of the same name is replaced.

        Raises:
            TypeError: ``gate`` is not an ``LLMGate``.
            ValueError: ``gate`` is served already, or an open gate of its name is.
        """
        if not isinstance(gate, LLMGate):
            raise TypeError(f"gate must be an LLMGate, got {type(gate).__name__}")
        with self._lock:
            old = self._gates.get(gate.name)
            if old is gate:
                raise ValueError(f"gate {gate.name!r} is exported already")
            if old is not None and not old.closed:
                raise ValueError(
                    f"another open gate named {gate.name!r} is exported already; give each "
                    "gate its own name (LLMGate(name=...))"
                )
            self._gates[gate.name] = gate

    def remove(self, gate: LLMGate) -> None:
        """Stop serving ``gate``.

        Raises:
            ValueError: it is not served here.
        """
        with self._lock:
            if self._gates.get(getattr(gate, "name", "")) is not gate:
                raise ValueError("this gate is not exported here")
            del self._gates[gate.name]

    def __contains__(self, gate: object) -> bool:
        with self._lock:
            return any(g is gate for g in self._gates.values())

    def read(self) -> list[LLMGateStats]:
        """``stats()`` of every gate served, in the order they were added."""
        with self._lock:
            gates = list(self._gates.values())
        return [gate.stats() for gate in gates]

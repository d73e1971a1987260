"""Engine telemetry from the engine's own Prometheus ``/metrics``: vLLM, SGLang, llama.cpp.

:class:`PrometheusEngineTelemetry` reads the page with ``prometheus_client``'s text parser and
builds an :class:`~adaptive_batcher.llm.signals.EngineMetrics` from the first engine whose
metrics it finds (:data:`ENGINE_METRICS`):

* vLLM: running ``vllm:num_requests_running``, waiting ``vllm:num_requests_waiting``, KV
  ``vllm:kv_cache_usage_perc`` (older: ``vllm:gpu_cache_usage_perc``), preemptions
  ``vllm:num_preemptions_total`` (older: ``vllm:num_preemptions``);
* SGLang: ``sglang:num_running_reqs``, ``sglang:num_queue_reqs``, ``sglang:token_usage``;
* llama.cpp: ``llamacpp:requests_processing``, ``llamacpp:requests_deferred``,
  ``llamacpp:kv_cache_usage_ratio``.

Counts are summed over label sets (several models or engines behind one page); KV usage is the
largest (the fullest engine is the one that preempts). A reading needs the running count; a
missing waiting count, KV usage or preemption counter reads as 0 (no pressure seen). Names from
vLLM's metrics docs (``docs/design/metrics.md``), SGLang's ``docs/references/production_metrics.md``
and llama.cpp's server README.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from adaptive_batcher._log import get_logger
from adaptive_batcher._validate import check_number, check_str
from adaptive_batcher.gateway._extra import missing_extra
from adaptive_batcher.gateway.outage import OutageLog, loggable_url
from adaptive_batcher.llm.signals import EngineMetrics

try:
    import httpx
    from prometheus_client.parser import text_string_to_metric_families
except ImportError as exc:  # pragma: no cover - exercised in a subprocess by the tests
    raise missing_extra("adaptive_batcher.gateway.telemetry", exc) from exc

__all__ = [
    "ENGINE_METRICS",
    "EngineMetricNames",
    "PrometheusEngineTelemetry",
    "parse_engine_metrics",
]

_log = get_logger("adaptive_batcher.gateway.telemetry")


@dataclass(frozen=True, slots=True)
class EngineMetricNames:
    """The sample names one engine uses, each field's names tried in order."""

    engine: str
    running: tuple[str, ...]
    waiting: tuple[str, ...]
    kv_usage: tuple[str, ...]
    preemptions: tuple[str, ...]


ENGINE_METRICS: Final = (
    EngineMetricNames(
        "vllm",
        ("vllm:num_requests_running",),
        ("vllm:num_requests_waiting",),
        ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        ("vllm:num_preemptions_total", "vllm:num_preemptions"),
    ),
    EngineMetricNames(
        "sglang",
        ("sglang:num_running_reqs",),
        ("sglang:num_queue_reqs",),
        ("sglang:token_usage",),
        (),
    ),
    EngineMetricNames(
        "llamacpp",
        ("llamacpp:requests_processing",),
        ("llamacpp:requests_deferred",),
        ("llamacpp:kv_cache_usage_ratio",),
        (),
    ),
)
"""The engines read, in the order tried."""


def parse_engine_metrics(text: str) -> EngineMetrics | None:
    """The engine metrics in a Prometheus text page, or None when it has no engine's running
    count (see the module for the names and how label sets combine).

    Raises:
        ValueError: the page is not Prometheus text.
    """
    samples: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if math.isfinite(sample.value):
                samples.setdefault(sample.name, []).append(float(sample.value))
    for names in ENGINE_METRICS:
        running = _first(samples, names.running)
        if running is None:
            continue
        waiting = _first(samples, names.waiting)
        kv = _first(samples, names.kv_usage)
        preemptions = _first(samples, names.preemptions)
        return EngineMetrics(
            running=_whole(sum(running)),
            waiting=_whole(sum(waiting or ())),
            kv_usage=min(max(max(kv or (0.0,)), 0.0), 1.0),
            preemptions=_whole(sum(preemptions or ())),
        )
    return None


def _first(samples: dict[str, list[float]], names: Iterable[str]) -> list[float] | None:
    for name in names:
        if name in samples:
            return samples[name]
    return None


def _whole(value: float) -> int:
    return max(round(value), 0)


class PrometheusEngineTelemetry:
    """An :class:`~adaptive_batcher.gateway.types.EngineTelemetry` that scrapes the engine's
    Prometheus page.

    Args:
        metrics_url: the page, e.g. ``http://127.0.0.1:8000/metrics``.
        interval_s: seconds between reads, for the shell (> 0).
        client: the ``httpx.AsyncClient`` to use; by default one is made and closed by
            :meth:`aclose` (a client given stays open).
        timeout_s: the whole read, seconds (> 0).

    Raises:
        TypeError, ValueError: an argument of the wrong type or out of range (named).
    """

    def __init__(
        self,
        metrics_url: str,
        *,
        interval_s: float = 1.0,
        client: httpx.AsyncClient | None = None,
        timeout_s: float = 2.0,
    ) -> None:
        self.metrics_url = check_str("metrics_url", metrics_url)
        if not self.metrics_url.startswith(("http://", "https://")):
            raise ValueError(
                f"metrics_url must start with http:// or https://, got {metrics_url!r}"
            )
        self.interval_s = check_number("interval_s", interval_s, 0, strict=True)
        self.timeout_s = check_number("timeout_s", timeout_s, 0, strict=True)
        if client is not None and not isinstance(client, httpx.AsyncClient):
            raise TypeError(f"client must be an httpx.AsyncClient, got {type(client).__name__}")
        self._owns_client = client is None
        self._client = client if client is not None else httpx.AsyncClient(trust_env=False)
        self._outage = OutageLog(_log, "engine_telemetry.failed", "engine_telemetry.recovered")

    async def read(self) -> EngineMetrics | None:
        """One reading; None when the page cannot be read or parsed, or holds no engine's
        metrics. Never raises but for cancellation. Failures are logged as an outage
        (:class:`~adaptive_batcher.gateway.outage.OutageLog`): an ``engine_telemetry.failed``
        warning when they begin and, spaced out, while they last; ``engine_telemetry.recovered``
        when a read works again."""
        try:
            response = await self._client.get(self.metrics_url, timeout=self.timeout_s)
            response.raise_for_status()
            metrics = parse_engine_metrics(response.text)
        except Exception as exc:  # a failed read is a missing reading, never an error
            url = loggable_url(self.metrics_url)
            self._outage.failed(url=url, error=f"{type(exc).__name__}: {exc}")
            return None
        self._outage.succeeded(url=loggable_url(self.metrics_url))
        return metrics

    async def aclose(self) -> None:
        """Close the client the source made (a client given stays open)."""
        if self._owns_client:
            await self._client.aclose()

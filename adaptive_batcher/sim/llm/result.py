"""What an LLM replay measured: per-request times and outcomes, summary metrics, series."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from adaptive_batcher.llm.slo import TokenSLO

__all__ = ["LLMOutcome", "LLMSimResult"]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


class LLMOutcome:
    """Per-request outcome codes of a replay."""

    UNFINISHED = 0  # still waiting or running when the replay stopped (a miss)
    COMPLETED = 1
    REJECTED = 2  # refused at arrival by the gate
    EXPIRED = 3  # waited past its time in the gate's queue
    CANCELLED = 4
    FAILED = 5


@dataclass(frozen=True, eq=False)
class LLMSimResult:
    """One replay of one contender.

    Per-request arrays (index = request number) hold seconds on the replay's clock (NaN where
    a request never got there). Requests that were rejected, expired, or had not finished
    when the replay stopped (``grace_s`` after the last arrival) count as misses.

    Attributes:
        name: the contender.
        slo: the objective goodput is judged by.
        duration_s: the arrivals' horizon, the span rates divide by, seconds.
        arrival_s, admitted_s, first_token_s, done_s: per-request times.
        prompt_tokens, output_tokens: per-request lengths.
        outcome: per-request :class:`LLMOutcome` codes.
        preempted: per request, how many times the engine preempted it.
        engine_preemptions: the engine's preemption counter at the end.
        engine_steps: steps the engine ran.
        decode_limit_tokens_s: the device's decode limit for the workload's mean context (the
            largest batch that fits over its decode step), tokens/s.
        series: ``(time_s, gate_limit, gate_waiting, in_flight, engine_running,
            engine_waiting, kv_usage)`` rows, one per metrics interval (NaN without a gate).
    """

    name: str
    slo: TokenSLO
    duration_s: float
    arrival_s: FloatArray
    admitted_s: FloatArray
    first_token_s: FloatArray
    done_s: FloatArray
    prompt_tokens: IntArray
    output_tokens: IntArray
    outcome: npt.NDArray[np.int8]
    preempted: IntArray
    engine_preemptions: int
    engine_steps: int
    decode_limit_tokens_s: float
    series: FloatArray
    _cache: dict[str, Any] = field(default_factory=dict, repr=False)

    # -- per request ----------------------------------------------------------------------

    @property
    def requests(self) -> int:
        """Requests replayed."""
        return int(self.arrival_s.size)

    def count(self, outcome: int) -> int:
        """Requests that ended with ``outcome`` (an :class:`LLMOutcome` code)."""
        return int(np.count_nonzero(self.outcome == outcome))

    @property
    def completed_mask(self) -> npt.NDArray[np.bool_]:
        """Requests answered in full."""
        mask: npt.NDArray[np.bool_] = self.outcome == LLMOutcome.COMPLETED
        return mask

    @property
    def ttft_s(self) -> FloatArray:
        """Time to first token from arrival at the gate, per request (NaN without one)."""
        return self.first_token_s - self.arrival_s

    @property
    def tpot_s(self) -> FloatArray:
        """Time per output token after the first, per completed request (NaN otherwise; 0
        for a one-token answer)."""
        if "tpot" not in self._cache:
            tokens = np.maximum(self.output_tokens - 1, 1).astype(np.float64)
            tpot = (self.done_s - self.first_token_s) / tokens
            tpot = np.where(self.output_tokens > 1, tpot, 0.0)
            self._cache["tpot"] = np.where(self.completed_mask, tpot, np.nan)
        tpot_s: FloatArray = self._cache["tpot"]
        return tpot_s

    @property
    def good_mask(self) -> npt.NDArray[np.bool_]:
        """Requests completed within both targets (and the e2e one, if set)."""
        if "good" not in self._cache:
            e2e = self.done_s - self.arrival_s
            good = self.completed_mask & self.slo.meets_many(self.ttft_s, self.tpot_s, e2e)
            self._cache["good"] = good
        good_mask: npt.NDArray[np.bool_] = self._cache["good"]
        return good_mask

    # -- summary --------------------------------------------------------------------------

    @property
    def goodput_rps(self) -> float:
        """Requests per second that met the SLO; rejections and timeouts are misses."""
        return int(np.count_nonzero(self.good_mask)) / self.duration_s if self.duration_s else 0.0

    @property
    def attainment(self) -> float:
        """Share of all requests that met the SLO (NaN without requests)."""
        return float(np.mean(self.good_mask)) if self.requests else math.nan

    @property
    def rejected_fraction(self) -> float:
        """Share refused by the gate, at arrival or after waiting too long."""
        if not self.requests:
            return math.nan
        return (self.count(LLMOutcome.REJECTED) + self.count(LLMOutcome.EXPIRED)) / self.requests

    def _completed_quantile(self, values: FloatArray, q: float) -> float:
        chosen = values[self.completed_mask]
        return float(np.quantile(chosen, q)) if chosen.size else math.nan

    def ttft_ms(self, q: float) -> float:
        """TTFT quantile ``q`` of completed requests, ms."""
        return self._completed_quantile(self.ttft_s, q) * 1e3

    def tpot_ms(self, q: float) -> float:
        """TPOT quantile ``q`` of completed requests, ms."""
        return self._completed_quantile(self.tpot_s, q) * 1e3

    @property
    def output_tokens_s(self) -> float:
        """Output tokens of completed requests per second of the horizon."""
        total = int(self.output_tokens[self.completed_mask].sum())
        return total / self.duration_s if self.duration_s else 0.0

    @property
    def decode_vs_limit(self) -> float:
        """Output tokens/s over the device's decode limit (``decode_limit_tokens_s``)."""
        return self.output_tokens_s / self.decode_limit_tokens_s

    @property
    def preempted_fraction(self) -> float:
        """Share of requests the engine preempted at least once."""
        return float(np.mean(self.preempted > 0)) if self.requests else math.nan

    def phase(self, start_s: float, end_s: float) -> LLMSimResult:
        """The requests that arrived in ``[start_s, end_s)``, as a result of their own (rates
        over that span)."""
        keep = (self.arrival_s >= start_s) & (self.arrival_s < end_s)
        return LLMSimResult(
            f"{self.name}[{start_s:g}, {end_s:g})",
            self.slo,
            min(end_s, self.duration_s) - start_s,
            self.arrival_s[keep],
            self.admitted_s[keep],
            self.first_token_s[keep],
            self.done_s[keep],
            self.prompt_tokens[keep],
            self.output_tokens[keep],
            self.outcome[keep],
            self.preempted[keep],
            self.engine_preemptions,
            self.engine_steps,
            self.decode_limit_tokens_s,
            self.series,
        )

    def summary(self) -> dict[str, float]:
        """The headline figures, for reports and pytest-benchmark's ``extra_info``."""
        return {
            "requests": float(self.requests),
            "goodput_rps": self.goodput_rps,
            "attainment": self.attainment,
            "ttft_p50_ms": self.ttft_ms(0.5),
            "ttft_p99_ms": self.ttft_ms(0.99),
            "tpot_p50_ms": self.tpot_ms(0.5),
            "tpot_p99_ms": self.tpot_ms(0.99),
            "output_tokens_s": self.output_tokens_s,
            "decode_vs_limit": self.decode_vs_limit,
            "preemptions": float(self.engine_preemptions),
            "preempted_fraction": self.preempted_fraction,
            "rejected_fraction": self.rejected_fraction,
            "unfinished": float(self.count(LLMOutcome.UNFINISHED)),
        }

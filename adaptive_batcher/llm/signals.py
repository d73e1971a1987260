"""What the gate's controller sees: the engine's own metrics, and its view of each tick.

Everything here is what a client of a real engine can know: the gate's own counts, the
timestamps of the streams it forwards, usage token counts, and (optionally) the engine's
Prometheus metrics.
"""

from __future__ import annotations

from dataclasses import dataclass

from adaptive_batcher._validate import check_in_range, check_int

__all__ = ["EngineMetrics", "GateObservation", "StepFit"]


@dataclass(frozen=True, slots=True)
class EngineMetrics:
    """One reading of the engine's metrics (vLLM's ``vllm:num_requests_running``,
    ``num_requests_waiting``, ``kv_cache_usage_perc``, ``num_preemptions``).

    Attributes:
        running: requests the engine is running (>= 0).
        waiting: requests in the engine's own queue (>= 0).
        kv_usage: share of the KV cache in use, in [0, 1].
        preemptions: preemptions since the engine started (>= 0, a counter).

    Raises:
        TypeError, ValueError: a field of the wrong type or out of range (named).
    """

    running: int
    waiting: int
    kv_usage: float
    preemptions: int

    def __post_init__(self) -> None:
        for name in ("running", "waiting", "preemptions"):
            object.__setattr__(
                self, name, check_int(f"EngineMetrics.{name}", getattr(self, name), 0)
            )
        kv = check_in_range("EngineMetrics.kv_usage", self.kv_usage, 0.0, 1.0)
        object.__setattr__(self, "kv_usage", kv)


@dataclass(frozen=True, slots=True)
class StepFit:
    """The fitted step time: ``gap_s = base_s + per_seq_s * sequences + per_ktoken_s *
    context / 1000 + per_prefill_ktoken_s * prefill_tokens / 1000``.

    Attributes:
        base_s, per_seq_s, per_ktoken_s, per_prefill_ktoken_s: the coefficients (>= 0).
        samples: how many gap samples the fit used.
    """

    base_s: float
    per_seq_s: float
    per_ktoken_s: float
    per_prefill_ktoken_s: float
    samples: int

    def step_s(self, sequences: float, context_tokens: float, prefill_tokens: float) -> float:
        """The fitted step time, seconds."""
        return (
            self.base_s
            + self.per_seq_s * sequences
            + self.per_ktoken_s * context_tokens / 1e3
            + self.per_prefill_ktoken_s * prefill_tokens / 1e3
        )


@dataclass(frozen=True, slots=True)
class GateObservation:
    """What a limit law sees at a tick.

    Counts are since the previous tick; quantiles are over the controller's recent window
    (NaN when it holds no finished request).

    Attributes:
        now_s: the tick's time, seconds.
        limit: the in-flight limit in force.
        in_flight, waiting: the gate's requests inside the engine and in its queue now.
        departure_rps: requests leaving the engine per second now (in flight over the mean
            time inside it), 0 before any finished.
        residence_s: the mean time a request spends inside the engine, seconds (NaN before
            any finished).
        arrivals, admitted, rejected, expired: since the previous tick.
        arrival_rps: the arrival rate, smoothed over several ticks, requests/s.
        finished_misses: one bool per request finished since the previous tick, in order:
            True when it missed its TTFT or TPOT target.
        finished_tpot_misses: the same for the TPOT target alone.
        in_flight_at_finish: the in-flight count when each of them finished, itself included.
        ttft_p_s, tpot_p_s: TTFT and TPOT of recently finished requests at the SLO's
            percentile, seconds (the TPOT's never their largest alone: with fewer requests
            than the percentile needs, the second largest).
        engine_ttft_p50_s, engine_ttft_p90_s: the median and 90th percentile of their time
            from admission to first token (the engine's part of the TTFT), seconds.
        recent_finished: how many finished requests those quantiles cover.
        tpot_mean_s: the mean TPOT of those requests, seconds.
        mean_gap_s: the mean gap between tokens over the last seconds, per token (what the
            streams see now), seconds; NaN before any.
        mean_prompt, mean_output: recent mean prompt and output lengths, tokens.
        context_tokens: the gate's estimate of the tokens in flight (prompts + generated).
        step_fit: the fitted step time, None while too few samples support it.
        ttft_fit: the engine's time to first token as ``steps * gap + per_prompt_token_s *
            prompt``: ``(steps, per_prompt_token_s, residual_p90_s)``, or None
            (:class:`~adaptive_batcher.llm.estimators.TTFTFit`).
        engine: the latest engine metrics, None without them.
        preemptions: preemptions since the previous tick (from the engine's counter), 0
            without engine metrics.
    """

    now_s: float
    limit: int
    in_flight: int
    waiting: int
    departure_rps: float
    residence_s: float
    arrivals: int
    arrival_rps: float
    admitted: int
    rejected: int
    expired: int
    finished_misses: tuple[bool, ...]
    finished_tpot_misses: tuple[bool, ...]
    in_flight_at_finish: tuple[int, ...]
    ttft_p_s: float
    tpot_p_s: float
    engine_ttft_p50_s: float
    engine_ttft_p90_s: float
    recent_finished: int
    tpot_mean_s: float
    mean_gap_s: float
    mean_prompt: float
    mean_output: float
    context_tokens: float
    step_fit: StepFit | None
    ttft_fit: tuple[float, float, float] | None
    engine: EngineMetrics | None
    preemptions: int

"""The gate's controller: client-side observations in, gate limits out; sans-IO.

It keeps what a client of the engine can measure (each request's TTFT, TPOT and time inside
the engine, usage token counts, the gaps between tokens of the streams, the engine's metrics
when scraped), asks a :class:`~adaptive_batcher.llm.laws.LimitLaw` for the in-flight limit at
each tick, and derives the rest of the gate's knobs the same way for every law:

* the **TTFT forecast**: slots free at ``in_flight / residence`` per second (``residence``:
  the mean time a request spends inside the engine, smoothed; twice the TTFT target before
  any request finished), and the engine's own time to first token is
  :class:`~adaptive_batcher.llm.estimators.TTFTFit`'s steps of the current token gap plus the
  prefill of the backlog and the prompt, raised by the ``ttft_quantile`` of its residuals;
* **early rejection**: an arrival whose predicted TTFT exceeds ``admit_fraction`` of the TTFT
  target is refused at once; while the gate is pressed, also one that finds a free slot
  (``predict_free``);
* the **flood guard**: an arrival that finds a free slot is refused while the prefill already
  admitted would put an empty prompt's first token past ``flood_factor`` times that threshold;
* **prefill pacing**: the prompt tokens admitted a second are at most what leaves the running
  streams' steps within the TPOT aim, ``(1 - decode step / (margin * tpot)) / cost per prefill
  token`` from the step-time fit (a share of each step, at least ``min_prefill_share``), with a
  burst of ``pacing_gaps`` aims' worth of prefill at once: a burst that finds the limit far
  above what runs fills the free slots at that pace instead of stalling every stream's steps
  behind its prompts (the requests it holds wait, and early rejection counts that wait);
* **late shedding**: a request that waited so long that the engine's TTFT at its 90th
  percentile would make it miss expires (``max_wait_s = ttft - engine TTFT p90``; half the TTFT
  target before the first token is seen).

Times are seconds on the caller's clock; nothing here reads a clock.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from adaptive_batcher._validate import check_bool, check_in_range, check_int, check_number
from adaptive_batcher.llm.estimators import DecayedMean, Ewma, StepTimeEstimator, TTFTFit
from adaptive_batcher.llm.gate import ORDERS, GateLimits, TTFTForecast
from adaptive_batcher.llm.laws import LimitLaw
from adaptive_batcher.llm.signals import EngineMetrics, GateObservation
from adaptive_batcher.llm.slo import TokenSLO
from adaptive_batcher.metrics.histogram import SlidingHistogram

__all__ = ["HISTORY_TICKS", "GateDecision", "TokenController"]

#: how many ticks :attr:`TokenController.history` keeps (half an hour at the default 0.5 s interval)
HISTORY_TICKS = 3600


@dataclass(frozen=True, slots=True)
class GateDecision:
    """What a tick decides: the gate's knobs and its TTFT forecast (None: not yet known)."""

    limits: GateLimits
    forecast: TTFTForecast | None


class TokenController:
    """Observations in, :class:`GateDecision` out, at ticks ``interval_s`` apart.

    Args:
        slo: the objective.
        law: the limit law.
        initial_limit: the limit before the first tick (>= 1; clamped to the bounds).
        min_limit: the limit's lower bound (>= 1).
        max_limit: the limit's upper bound (>= ``min_limit``).
        interval_s: seconds between ticks (> 0).
        window_s: the span of the TTFT and TPOT quantiles, seconds (> 0).
        max_queue: the gate's bounded queue (None: unbounded).
        order: ``"fcfs"`` or ``"edf"``.
        early_reject: refuse arrivals whose predicted TTFT misses (else queue them all).
        shed_late: expire waiting requests that can no longer make their TTFT.
        admit_fraction: the share of the TTFT target up to which an arrival is admitted, in
            (0, 1].
        ttft_quantile: the quantile of the engine's TTFT the forecast uses (its fit's
            residuals at that quantile), in [0.5, 1]; default 0.95.
        flood_factor: the flood guard at this multiple of the admission threshold
            (:attr:`~adaptive_batcher.llm.gate.GateLimits.flood_ttft_s`; > 0, or None: off).
        predict_free: while the gate is pressed (at the last tick requests waited, or 80 % of
            the limit was in use and the arrival rate times the time inside the engine would
            keep it so), refuse an arrival that finds a free slot too when its predicted TTFT
            misses (:attr:`~adaptive_batcher.llm.gate.GateLimits.predict_free`): under
            overload the requests whose own prefill would miss give way to those that can
            make it.
        pace_prefill: derive prefill pacing (off: the gate admits into free slots at once).
        pacing_gaps: the pacing's burst, in aims of the TPOT target (``margin * tpot``) of
            prefill time (> 0).
        min_prefill_share: the least share of a step the pacing leaves to prefill, in (0, 1].
        peak_hold_s: the arrival rate a law sees is the larger of its 5 s mean and the
            highest rate of a tick, fading with this time constant, seconds (>= 0; 0: the
            mean alone): a bursty trace's bursts are planned for while they may recur.

    Raises:
        TypeError, ValueError: an argument of the wrong type or out of range (named).
    """

    def __init__(
        self,
        slo: TokenSLO,
        law: LimitLaw,
        *,
        initial_limit: int = 256,
        min_limit: int = 1,
        max_limit: int = 1024,
        interval_s: float = 0.5,
        window_s: float = 10.0,
        max_queue: int | None = None,
        order: str = "fcfs",
        early_reject: bool = True,
        shed_late: bool = True,
        admit_fraction: float = 1.0,
        predict_free: bool = True,
        ttft_quantile: float | None = None,
        peak_hold_s: float = 10.0,
        flood_factor: float | None = 1.0,
        pace_prefill: bool = True,
        pacing_gaps: float = 2.0,
        min_prefill_share: float = 0.1,
    ) -> None:
        self.pace_prefill = check_bool("pace_prefill", pace_prefill)
        self.pacing_gaps = check_number("pacing_gaps", pacing_gaps, 0.0, strict=True)
        self.min_prefill_share = check_in_range(
            "min_prefill_share", min_prefill_share, 0.0, 1.0, open_low=True
        )
        self.flood_factor = (
            None
            if flood_factor is None
            else check_number("flood_factor", flood_factor, 0.0, strict=True)
        )
        self.peak_hold_s = check_number("peak_hold_s", peak_hold_s, 0.0)
        self.ttft_quantile = check_in_range(
            "ttft_quantile", 0.95 if ttft_quantile is None else ttft_quantile, 0.5, 1.0
        )
        self.predict_free = check_bool("predict_free", predict_free)
        self._pressed = False
        if not isinstance(slo, TokenSLO):
            raise TypeError(f"slo must be a TokenSLO, got {type(slo).__name__}")
        if not isinstance(law, LimitLaw):
            raise TypeError(f"law must have decide(observation), got {type(law).__name__}")
        if order not in ORDERS:
            raise ValueError(f"order must be one of {', '.join(map(repr, ORDERS))}, got {order!r}")
        self.slo = slo
        self.law = law
        self.min_limit = check_int("min_limit", min_limit, 1)
        self.max_limit = check_int("max_limit", max_limit, self.min_limit)
        self.limit = min(
            max(check_int("initial_limit", initial_limit, 1), self.min_limit), self.max_limit
        )
        self.interval_s = check_number("interval_s", interval_s, 0.0, strict=True)
        window = check_number("window_s", window_s, 0.0, strict=True)
        self.max_queue = max_queue
        self.order = order
        self.early_reject = check_bool("early_reject", early_reject)
        self.shed_late = check_bool("shed_late", shed_late)
        self.admit_fraction = check_in_range(
            "admit_fraction", admit_fraction, 0.0, 1.0, open_low=True
        )
        self._ttft = SlidingHistogram(window, 10)
        self._tpot = SlidingHistogram(window, 10)
        self._engine_ttft = SlidingHistogram(window, 10)
        self._prefill = TTFTFit()
        self._steps = StepTimeEstimator()
        self._gaps = DecayedMean(2.0)
        self._prompt = Ewma(30.0)
        self._output = Ewma(30.0)
        self._residence = Ewma(10.0)
        self._arrival_rate = Ewma(5.0)
        self._peak_rate = 0.0
        self._last_tick_s: float | None = None
        self._next_tick_s: float | None = None
        self._arrivals = self._admitted = self._rejected = self._expired = 0
        self._misses: list[bool] = []
        self._tpot_misses: list[bool] = []
        self._in_flight_at_finish: list[int] = []
        self._engine: EngineMetrics | None = None
        self._preemptions_seen: int | None = None
        self._preemptions = 0
        self._prefill_now = 0.0  # prompt tokens admitted since the last gap sample
        self._prefill_prev = 0.0  # ... and in the gap before (prefilled in this one)
        # (time_s, limit, admit_ttft_s) per tick, the last HISTORY_TICKS of them
        self.history: deque[tuple[float, float, float]] = deque(maxlen=HISTORY_TICKS)
        self._decision = self._decide_knobs(math.nan)

    # -- observations ----------------------------------------------------------------------

    def record_arrival(self, now: float) -> None:
        """A request reached the gate."""
        self._arrivals += 1

    def record_admit(self, now: float, prompt_tokens: int) -> None:
        """A request entered the engine with ``prompt_tokens`` of prompt."""
        self._admitted += 1
        self._prefill_now += prompt_tokens
        self._prompt.update(float(prompt_tokens), now)

    def record_reject(self, now: float) -> None:
        """An arrival was refused at once."""
        self._rejected += 1

    def record_expire(self, now: float) -> None:
        """A waiting request expired."""
        self._expired += 1

    def record_first_token(self, now: float, engine_ttft_s: float, prefill_tokens: int) -> None:
        """A stream's first token came ``engine_ttft_s`` after its admission, with
        ``prefill_tokens`` to prefill by then (its prompt and those ahead of it).

        Raises:
            TypeError, ValueError: ``engine_ttft_s`` not a finite number >= 0, or
                ``prefill_tokens`` not a number >= 0 (named).
        """
        check_number("engine_ttft_s", engine_ttft_s, 0.0)
        check_number("prefill_tokens", prefill_tokens, 0.0)
        self._engine_ttft.record(engine_ttft_s, now)
        gap = self._gaps.value
        if not math.isnan(gap):
            self._prefill.add(engine_ttft_s, gap, float(prefill_tokens))

    def record_finish(
        self,
        now: float,
        ttft_s: float,
        tpot_s: float,
        output_tokens: int,
        residence_s: float,
        in_flight: int,
    ) -> None:
        """A request finished: its TTFT and TPOT (seconds), output length (usage), time inside
        the engine, and the in-flight count when it finished, itself included (as Netflix's
        limiter counts it: at a limit of 1, 1).

        Raises:
            TypeError, ValueError: a time that is not a finite number >= 0, or a count that is
                not an int >= 0 (named).
        """
        for name, value in (("ttft_s", ttft_s), ("tpot_s", tpot_s), ("residence_s", residence_s)):
            check_number(name, value, 0.0)
        check_int("output_tokens", output_tokens, 0)
        check_int("in_flight", in_flight, 0)
        self._ttft.record(ttft_s, now)
        self._tpot.record(tpot_s, now)
        self._output.update(float(output_tokens), now)
        self._residence.update(residence_s, now)
        tpot_ok = tpot_s <= self.slo.tpot_s
        self._misses.append(not (ttft_s <= self.slo.ttft_s and tpot_ok))
        self._tpot_misses.append(not tpot_ok)
        self._in_flight_at_finish.append(in_flight)

    def record_gap(
        self, now: float, streams: int, gap_s: float, sequences: int, context_tokens: float
    ) -> None:
        """``streams`` streams each got a token ``gap_s`` after their previous one, while
        ``sequences`` requests with ``context_tokens`` of context were in flight.

        Raises:
            TypeError, ValueError: ``gap_s`` or ``context_tokens`` not a finite number >= 0, or
                ``streams`` or ``sequences`` not a number >= 0 (named): one such sample would
                spoil the step-time fit for as long as it stays in its window.
        """
        check_number("gap_s", gap_s, 0.0)
        check_number("context_tokens", context_tokens, 0.0)
        check_number("streams", streams, 0.0)
        check_number("sequences", sequences, 0.0)
        if streams > 0 and gap_s > 0:
            self._steps.add(gap_s, sequences, context_tokens, self._prefill_prev)
            self._gaps.add(gap_s, float(streams), now)

        self._prefill_prev = self._prefill_now
        self._prefill_now = 0.0

    def record_engine(self, now: float, metrics: EngineMetrics) -> None:
        """A reading of the engine's metrics."""
        if self._preemptions_seen is not None:
            self._preemptions += max(metrics.preemptions - self._preemptions_seen, 0)
        self._preemptions_seen = metrics.preemptions
        self._engine = metrics

    # -- decisions -------------------------------------------------------------------------

    @property
    def decision(self) -> GateDecision:
        """The decision in force."""
        return self._decision

    def due(self, now: float) -> bool:
        """Whether a tick is due at ``now`` (the first call starts the clock)."""
        if self._next_tick_s is None:
            self._next_tick_s = now + self.interval_s
            return False
        return now >= self._next_tick_s

    def tick(
        self, now: float, *, in_flight: int, waiting: int, context_tokens: float
    ) -> GateDecision:
        """Decide: the law's limit (clamped), then the forecast and thresholds."""
        self._next_tick_s = now + self.interval_s
        if self._last_tick_s is not None and now > self._last_tick_s:
            rate = self._arrivals / (now - self._last_tick_s)
            self._arrival_rate.update(rate, now)
            if self.peak_hold_s > 0:
                fade = math.exp(-(now - self._last_tick_s) / self.peak_hold_s)
                self._peak_rate = max(rate, self._peak_rate * fade)
        self._last_tick_s = now
        q = self.slo.quantile
        ttft_p = self._ttft.quantile_ms(q, now) / 1e3
        tpot = self._tpot.quantiles(now)
        step_fit = self._steps.fit()
        observation = GateObservation(
            now_s=now,
            limit=self.limit,
            in_flight=in_flight,
            waiting=waiting,
            departure_rps=self._departure_rps(in_flight),
            residence_s=float(self._residence.value),
            arrivals=self._arrivals,
            arrival_rps=max(_or_zero(self._arrival_rate.value), self._peak_rate),
            admitted=self._admitted,
            rejected=self._rejected,
            expired=self._expired,
            finished_misses=tuple(self._misses),
            finished_tpot_misses=tuple(self._tpot_misses),
            in_flight_at_finish=tuple(self._in_flight_at_finish),
            ttft_p_s=ttft_p,
            tpot_p_s=self._tpot_tail_s(now, tpot.p99_ms),
            tpot_mean_s=tpot.mean_ms / 1e3,
            mean_gap_s=self._gaps.value,
            engine_ttft_p50_s=self._engine_ttft.quantile_ms(0.5, now) / 1e3,
            engine_ttft_p90_s=self._engine_ttft.quantile_ms(0.9, now) / 1e3,
            recent_finished=self._ttft.count(now),
            mean_prompt=_or_zero(self._prompt.value),
            mean_output=_or_zero(self._output.value),
            context_tokens=context_tokens,
            step_fit=step_fit,
            ttft_fit=self._ttft_fit(),
            engine=self._engine,
            preemptions=self._preemptions,
        )
        limit = int(self.law.decide(observation))
        self.limit = min(max(limit, self.min_limit), self.max_limit)
        self._arrivals = self._admitted = self._rejected = self._expired = 0
        self._misses.clear()
        self._tpot_misses.clear()
        self._in_flight_at_finish.clear()
        self._preemptions = 0
        # pressed: requests wait, or 80 % of the limit runs and the arrivals (by Little's law,
        # rate x time inside) would keep it so
        demand = _or_zero(self._arrival_rate.value) * _or_zero(self._residence.value)
        busy = 0.8 * self.limit
        self._pressed = waiting > 0 or (in_flight >= busy and demand >= busy)
        self._decision = self._decide_knobs(now, in_flight, observation)
        return self._decision

    def _tpot_tail_s(self, now: float, p99_ms: float) -> float:
        """The finished requests' TPOT at the SLO's percentile, never their largest alone:
        with fewer requests than the percentile needs (``n < 1 / (1 - q)``), the second
        largest (one slow request does not set the tail it cannot estimate)."""
        q, n = self.slo.quantile, self._tpot.count(now)
        level = min(q, (n - 1) / n) if n >= 2 else q
        if level == 0.99:
            return p99_ms / 1e3
        return self._tpot.quantile_ms(level, now) / 1e3

    def _departure_rps(self, in_flight: int) -> float:
        residence = float(self._residence.value)
        if math.isnan(residence) or residence <= 0:
            return 0.0
        return max(in_flight, 1) / residence

    def _ttft_fit(self) -> tuple[float, float, float] | None:
        step = self._steps.fit()
        per_token = None if step is None else step.per_prefill_ktoken_s / 1e3
        return self._prefill.fit(per_token, self.ttft_quantile)

    def _prefill_pacing(self, obs: GateObservation | None) -> tuple[float | None, float | None]:
        """``(tokens_per_s, burst_tokens)`` of prefill pacing, or ``(None, None)``: off, or
        no step-time fit with a prefill cost yet."""
        fit = None if obs is None else obs.step_fit
        if not self.pace_prefill or obs is None or fit is None:
            return None, None
        per_token_s = fit.per_prefill_ktoken_s / 1e3
        if not per_token_s > 0:
            return None, None
        aim_s = self.slo.margin * self.slo.tpot_s
        decode_s = fit.step_s(max(obs.in_flight, 1), obs.context_tokens, 0.0)
        share = max(1.0 - decode_s / aim_s, self.min_prefill_share)
        return share / per_token_s, self.pacing_gaps * aim_s / per_token_s

    def _decide_knobs(
        self, now: float, in_flight: int | None = None, obs: GateObservation | None = None
    ) -> GateDecision:
        forecast = None
        residence = self._residence.value
        ttft = self._ttft_fit()
        gap = self._gaps.value
        if obs is not None and obs.in_flight == 0 and obs.step_fit is not None:
            gap = obs.step_fit.step_s(0.0, 0.0, 0.0)  # nothing streams: the last gap is stale
        if ttft is not None and not math.isnan(gap):
            steps, per_token, spread = ttft
            running = self.limit if in_flight is None else max(in_flight, 1)
            if math.isnan(residence) or residence <= 0:  # none finished yet: slow departures
                residence = 2.0 * self.slo.ttft_s
            engine_ttft = max(steps * gap + spread, 0.0)
            forecast = TTFTForecast(running / residence, engine_ttft, per_token)
        max_wait = None
        if self.shed_late:
            engine = math.nan if math.isnan(now) else self._engine_ttft.quantile_ms(0.9, now) / 1e3
            # before any first token, half the target: the engine's part is not known yet
            engine_part = 0.5 * self.slo.ttft_s if math.isnan(engine) else engine
            max_wait = max(self.slo.ttft_s - engine_part, 0.0)
        admit = self.admit_fraction * self.slo.ttft_s if self.early_reject else None
        flood = None if admit is None or self.flood_factor is None else admit * self.flood_factor
        rate, burst = self._prefill_pacing(obs)
        limits = GateLimits(
            self.limit,
            self.max_queue,
            max_wait,
            admit,
            self.order,
            self.predict_free and self._pressed,
            flood,
            rate,
            burst,
        )
        self.history.append((now, float(self.limit), admit if admit is not None else math.nan))
        return GateDecision(limits, forecast)


def _or_zero(value: float) -> float:
    return 0.0 if math.isnan(value) else value

"""Limit laws: how many requests the gate lets into the engine, decided at each tick.

A law sees a :class:`~adaptive_batcher.llm.signals.GateObservation` and answers an in-flight
limit; the :class:`~adaptive_batcher.llm.controller.TokenController` clamps it into its bounds
and applies it (Netflix concurrency-limits' split: the ``Limit`` algorithm apart from the
``Limiter`` machinery that admits requests).

* :class:`StaticLimit`: a fixed limit (the hindsight baselines).
* :class:`AIMDLimit`: Netflix's ``AIMDLimit`` rule per finished request: a miss multiplies the
  limit by ``backoff``, a success adds one while at least half of it is in use
  (Netflix/concurrency-limits, ``limit/AIMDLimit.java``; Chiu and Jain, 1989).
* :class:`ModelLimit`: ours. The largest limit whose predicted mean token gap, from the online
  step-time fit, stays inside a TPOT target read off the measured tail; a KV guard;
  rate-limited steps; :class:`AIMDLimit` while the fit is young. docs/llm.md derives it.
"""

from __future__ import annotations

import math
from typing import Protocol, runtime_checkable

from adaptive_batcher._validate import check_in_range, check_int, check_number
from adaptive_batcher.llm.signals import GateObservation
from adaptive_batcher.llm.slo import TokenSLO

__all__ = ["AIMDLimit", "LimitLaw", "ModelLimit", "StaticLimit"]


@runtime_checkable
class LimitLaw(Protocol):
    """``decide(observation) -> limit``; a law may keep state between ticks."""

    @property
    def name(self) -> str: ...

    def decide(self, observation: GateObservation) -> int: ...


class StaticLimit:
    """Always ``limit`` (>= 1)."""

    def __init__(self, limit: int) -> None:
        self.limit = check_int("limit", limit, 1)

    @property
    def name(self) -> str:
        """``static(<limit>)``."""
        return f"static({self.limit})"

    def decide(self, observation: GateObservation) -> int:
        """The fixed limit."""
        return self.limit


class AIMDLimit:
    """Netflix's AIMD concurrency limit, one update per finished request.

    For each request finished since the last tick, in order: a miss (of its TTFT or TPOT
    target; with ``tpot_only``, of its TPOT target) sets ``limit = int(limit * backoff)``; a
    success with ``2 * in_flight >= limit`` (the in-flight count when it finished, itself
    included) adds 1; the result is clamped to ``[minimum, maximum]``.

    Args:
        initial: the starting limit (Netflix's default 20).
        backoff: the multiplicative decrease, in [0.5, 1) (Netflix's default 0.9).
        minimum: the lowest limit (>= 1).
        maximum: the highest limit (>= ``minimum``).
        tpot_only: count only TPOT misses.
    """

    def __init__(
        self,
        initial: int = 20,
        backoff: float = 0.9,
        minimum: int = 1,
        maximum: int = 1024,
        *,
        tpot_only: bool = False,
    ) -> None:
        self.tpot_only = bool(tpot_only)
        self.minimum = check_int("minimum", minimum, 1)
        self.maximum = check_int("maximum", maximum, self.minimum)
        self.limit = min(max(check_int("initial", initial, 1), self.minimum), self.maximum)
        self.backoff = check_in_range("backoff", backoff, 0.5, 1.0, open_high=True)

    @property
    def name(self) -> str:
        """``aimd``."""
        return "aimd"

    def decide(self, observation: GateObservation) -> int:
        """The limit after this tick's finished requests."""
        limit = self.limit
        misses = observation.finished_tpot_misses if self.tpot_only else observation.finished_misses
        for missed, in_flight in zip(misses, observation.in_flight_at_finish, strict=True):
            if missed:
                limit = int(limit * self.backoff)
            elif 2 * in_flight >= limit:
                limit += 1
            limit = min(max(limit, self.minimum), self.maximum)
        self.limit = limit
        return limit


class ModelLimit:
    """Ours: the largest in-flight limit whose predicted mean token gap meets a TPOT target
    read off the measured tail (docs/llm.md derives it).

    **Model.** The step-time fit gives ``gap = a + b * B + c * C + d * P`` (``B`` sequences,
    ``C`` context tokens, ``P`` prefill tokens a step). With ``N`` in flight, mean prompt
    ``p`` and output ``o``: ``C = N * (p + o / 2)``, and the prefill admitted meanwhile comes
    at ``min(arrival rate, N / (r0 + o * gap))`` requests a second (arrivals, or departures
    once the limit binds, by Little's law, ``r0`` being the time inside the engine that is not
    the output's gaps; the arrival rate is the larger of its 5 s mean and a peak held
    ``peak_hold_s`` by the controller), each costing ``d * p`` seconds of step time, so
    ``gap(N) = (a + b * N + c * C) / (1 - d * p * rate)`` (:meth:`predicted_gap_s`). The limit
    is the largest ``N`` with ``bias * gap(N) <= margin * tpot`` (a bisection), ``bias``
    being the measured gap over the fit's where the engine is now, smoothed and kept within
    ``[1 / max_bias, max_bias]``.

    **Target.** ``margin`` turns the mean gap (which is the mean TPOT) into the tail: from the
    finished requests' mean TPOT ``m`` and TPOT ``q`` at the SLO's percentile, the mean to aim
    at is ``m + (aim * tpot - q)`` while ``q`` is below ``aim * tpot`` (the tail's excess is
    burst delay that a longer step does not multiply) and ``m * aim * tpot / q`` above it;
    ``margin`` is that over ``tpot``, smoothed (``spread_gain`` a tick) and kept within
    ``[min_margin, 1]``. While ``q`` is above ``aim * tpot`` the limit does not rise.

    **Steps.** A tick moves ``gain`` of the way to the model's limit, at most ``[0.8, 1.25]
    x`` the limit in force (+2), and rises only while at least half the limit is in use (as
    Netflix's AIMD: a lull must not let the limit drift up before a burst). **KV guard**, with
    engine metrics: while KV usage is above ``kv_high`` or the engine preempted since the last
    tick, the limit is at most 90 % of what the engine runs, at once; for ``kv_hold_s`` after a
    preemption it does not rise.
    **Fallback.** While no fit is ready (fewer than 200 gap samples, sequences that never
    varied, or fewer than 20 finished requests in the window), :class:`AIMDLimit` on TPOT
    misses decides from the limit in force (TTFT misses are the admission's business: a lower
    limit does not shorten a long prompt's prefill), and while the streams' mean gap now is
    above ``margin * tpot`` the limit is cut at once to the in-flight count times their ratio
    (finished requests come too late to stop a flood at start). Nothing is learned from the
    streams' last gap while none runs: neither this cut nor the fit's correction.

    Args:
        slo: the objective.
        minimum: the lowest limit (>= 1).
        maximum: the highest limit (>= ``minimum``).
        kv_high: KV usage above which the guard acts, in (0, 1].
        kv_hold_s: how long after a preemption the limit may not rise, seconds (>= 0).
        aim: where the TPOT at the SLO's percentile is steered, a share of the target, in
            (0, 1] (default: the SLO's ``margin``, 0.9 unless set).
        gain: the share of the way to the model's limit taken per tick, in (0, 1].
        spread_gain: the smoothing of ``margin`` and ``bias`` per tick, in (0, 1].
        min_margin: the lowest ``margin``, in (0, 1].
        max_bias: the largest correction of the fit, >= 1.

    Raises:
        TypeError, ValueError: an argument of the wrong type or out of range (named).
    """

    def __init__(
        self,
        slo: TokenSLO,
        *,
        minimum: int = 1,
        maximum: int = 1024,
        kv_high: float = 0.92,
        kv_hold_s: float = 10.0,
        aim: float | None = None,
        gain: float = 0.3,
        spread_gain: float = 0.1,
        min_margin: float = 0.6,
        max_bias: float = 1.3,
    ) -> None:
        if not isinstance(slo, TokenSLO):
            raise TypeError(f"slo must be a TokenSLO, got {type(slo).__name__}")
        self.slo = slo
        self.minimum = check_int("minimum", minimum, 1)
        self.maximum = check_int("maximum", maximum, self.minimum)
        self.kv_high = check_in_range("kv_high", kv_high, 0.0, 1.0, open_low=True)
        self.kv_hold_s = check_number("kv_hold_s", kv_hold_s, 0.0)
        aim = slo.margin if aim is None else aim
        self.aim = check_in_range("aim", aim, 0.0, 1.0, open_low=True)
        self.gain = check_in_range("gain", gain, 0.0, 1.0, open_low=True)
        self.spread_gain = check_in_range("spread_gain", spread_gain, 0.0, 1.0, open_low=True)
        self.min_margin = check_in_range("min_margin", min_margin, 0.0, 1.0, open_low=True)
        self.max_bias = check_number("max_bias", max_bias, 1.0)
        self.margin = max(self.min_margin, 0.6 * slo.margin)
        self.bias = 1.0
        self._fallback: AIMDLimit | None = None
        self._hold_until = -math.inf
        self.last_model_limit = math.nan

    @property
    def name(self) -> str:
        """``model``."""
        return "model"

    def decide(self, observation: GateObservation) -> int:
        """The limit for the next tick."""
        obs = observation
        current = obs.limit
        fit = obs.step_fit
        if fit is None or obs.mean_output <= 0 or obs.recent_finished < 20:
            if self._fallback is None:
                self._fallback = AIMDLimit(current, 0.9, self.minimum, self.maximum, tpot_only=True)
            wanted = self._fallback.decide(obs)
            target = self.margin * self.slo.tpot_s
            gap = obs.mean_gap_s
            if obs.in_flight > 0 and gap > target:  # the streams are slow now: cut at once
                wanted = min(wanted, int(obs.in_flight * target / gap))
                self._fallback.limit = max(wanted, self.minimum)
        else:
            self._fallback = None
            self._trim_margin(obs)
            wanted = self._model_limit(obs)
            measured = obs.tpot_p_s
            if not math.isnan(measured) and measured > self.aim * self.slo.tpot_s:
                wanted = min(wanted, current)  # the tail is at its aim already: no rise
            if 2 * obs.in_flight < current:  # less than half in use: no evidence for more
                wanted = min(wanted, current)
            if wanted != current:  # a low-pass: a share of the way a tick
                step = self.gain * (wanted - current)
                wanted = current + (max(int(step), 1) if step > 0 else min(int(step), -1))
        limit = min(max(wanted, int(current * 0.8)), int(current * 1.25) + 2)
        limit = self._kv_guard(obs, limit)  # a guard acts at once, not smoothed
        if obs.now_s < self._hold_until:
            limit = min(limit, current)
        return min(max(limit, self.minimum), self.maximum)

    def _trim_margin(self, obs: GateObservation) -> None:
        measured, mean = obs.tpot_p_s, obs.tpot_mean_s
        if math.isnan(measured) or math.isnan(mean) or mean <= 0 or obs.recent_finished < 20:
            return
        aim = self.aim * self.slo.tpot_s
        wanted = mean * aim / measured if measured > aim else mean + (aim - measured)
        margin = min(max(wanted / self.slo.tpot_s, self.min_margin), 1.0)
        self.margin += self.spread_gain * (margin - self.margin)

    def _model_limit(self, obs: GateObservation) -> int:
        fit = obs.step_fit
        assert fit is not None
        target = self.margin * self.slo.tpot_s
        now = self.predicted_gap_s(obs, max(obs.in_flight, 1))
        measured = obs.mean_gap_s
        running = obs.in_flight > 0  # the last gap is stale once nothing streams
        if running and not math.isnan(measured) and 0 < now < math.inf:  # the fit's error
            ratio = min(max(measured / now, 1.0 / self.max_bias), self.max_bias)
            self.bias += self.spread_gain * (ratio - self.bias)
        low, high = 0, self.maximum
        if self.bias * self.predicted_gap_s(obs, high) <= target:
            low = high
        while high - low > 1:
            middle = (low + high) // 2
            if self.bias * self.predicted_gap_s(obs, middle) <= target:
                low = middle
            else:
                high = middle
        self.last_model_limit = low
        return low

    @staticmethod
    def predicted_gap_s(obs: GateObservation, limit: int) -> float:
        """The fit's mean token gap with ``limit`` requests in flight: their context, and the
        prefill of the requests admitted meanwhile, ``gap = fixed / (1 - prefill_s *
        admissions_rps)``, admissions being the arrivals or, once the limit binds, the
        departures, ``limit / (r0 + output * gap)`` by Little's law (``r0``: the time inside
        the engine that is not the output's gaps, the measured residence less the output
        times the streams' mean gap); infinite when the arrivals' prefill alone would fill
        the engine and none finished yet."""
        fit = obs.step_fit
        assert fit is not None
        prompt, output = obs.mean_prompt, max(obs.mean_output, 1.0)
        per_admitted = fit.per_prefill_ktoken_s * prompt / 1e3  # seconds per request prefilled

        def at_rate(fixed_s: float, admissions_rps: float) -> float:
            load = per_admitted * admissions_rps
            return fixed_s / (1.0 - load) if load < 1.0 else math.inf

        def fixed(n: float) -> float:  # the step without prefill, n in flight
            return fit.step_s(n, n * (prompt + output / 2.0), 0.0)

        fixed_s, residence = fixed(limit), obs.residence_s
        arrivals = at_rate(fixed_s, obs.arrival_rps)
        if not residence > 0:  # none finished yet: the arrivals admit
            return arrivals
        gap_now = obs.mean_gap_s  # the streams' mean gap, else the fit's at the in-flight now
        if not gap_now > 0:
            now = max(obs.in_flight, 1)
            gap_now = at_rate(fixed(now), min(obs.arrival_rps, now / residence))
        r0 = max(residence - output * gap_now, 0.0)  # (-inf: the prefill fills the engine now)
        stay = r0 + output * arrivals
        if arrivals < math.inf and (stay <= 0 or limit / stay >= obs.arrival_rps):
            return arrivals  # the limit does not bind: the arrivals admit
        # gap * (r0 + output * gap) = fixed * (r0 + output * gap) + per_admitted * limit * gap
        b = r0 - per_admitted * limit - fixed_s * output
        return (-b + math.sqrt(b * b + 4.0 * output * fixed_s * r0)) / (2.0 * output)

    def _kv_guard(self, obs: GateObservation, wanted: int) -> int:
        engine = obs.engine
        if engine is None:
            return wanted
        if obs.preemptions > 0:
            self._hold_until = obs.now_s + self.kv_hold_s
        if obs.preemptions > 0 or engine.kv_usage > self.kv_high:
            return min(wanted, max(int(engine.running * 0.9), self.minimum))
        return wanted

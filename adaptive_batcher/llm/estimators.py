"""Online estimates the gate's controller keeps: the step-time fit and smoothed rates.

:class:`StepTimeEstimator` fits a continuous-batching engine's step time, as a client sees it
(the gap between consecutive tokens of a stream), against what the gate knows at that moment:
the sequences in flight, their context tokens, and the prompt tokens it just admitted (the
prefill work sharing the step). The form is DistServe's decode model with a prefill term
(Zhong et al., DistServe, OSDI 2024: ``a + b * context + c * batch``; Agrawal et al.,
Sarathi-Serve, OSDI 2024, for prefill chunks sharing a decode step), fitted by least squares
over a sliding window of samples with the coefficients kept >= 0 (an active set: a negative
coefficient is dropped and the rest refitted).
"""

from __future__ import annotations

import math

import numpy as np

from adaptive_batcher._validate import check_int, check_number
from adaptive_batcher.llm.signals import StepFit

__all__ = ["DecayedMean", "Ewma", "StepTimeEstimator", "TTFTFit"]


class StepTimeEstimator:
    """Sliding-window least squares of step time on (1, sequences, context, prefill).

    A sample is four stores into a ring; a fit forms the window's normal equations (one
    ``4 x n`` product) and solves them.

    Args:
        window: samples kept (>= 8); older ones are overwritten.
        min_samples: samples needed before :meth:`fit` answers (>= 4).
    """

    def __init__(self, window: int = 4096, min_samples: int = 200) -> None:
        self.window = check_int("window", window, 8)
        self.min_samples = check_int("min_samples", min_samples, 4)
        self._x = np.zeros((self.window, 4), dtype=np.float64)
        self._y = np.zeros(self.window, dtype=np.float64)
        self._w = np.zeros(self.window, dtype=np.float64)
        self._x[:, 0] = 1.0
        self._n = 0
        self._next = 0
        self._added = 0
        self._cached: tuple[int, StepFit | None] = (-1, None)

    @property
    def samples(self) -> int:
        """Samples in the window."""
        return self._n

    def add(
        self,
        gap_s: float,
        sequences: float,
        context_tokens: float,
        prefill_tokens: float,
        weight: float = 1.0,
    ) -> None:
        """One observed step: ``gap_s`` between tokens while ``sequences`` were in flight with
        ``context_tokens`` of context and ``prefill_tokens`` admitted just before; ``weight``
        (e.g. the streams that saw it) scales its say in the fit."""
        i = self._next
        x = self._x
        x[i, 1] = sequences
        x[i, 2] = context_tokens / 1e3
        x[i, 3] = prefill_tokens / 1e3
        self._y[i] = gap_s
        self._w[i] = weight
        self._next = (i + 1) % self.window
        self._added += 1
        if self._n < self.window:
            self._n += 1

    def fit(self) -> StepFit | None:
        """The fit of the window, or None with fewer than ``min_samples`` samples or with
        sequence counts spread over fewer than 4 (no slope to read). Cached until the next
        sample."""
        if self._cached[0] == self._added:
            return self._cached[1]
        fit = self._fit()
        self._cached = (self._added, fit)
        return fit

    def _fit(self) -> StepFit | None:
        n = self._n
        if n < self.min_samples:
            return None
        x, y, w = self._x[:n], self._y[:n], self._w[:n]
        if float(np.ptp(x[:, 1])) < 4.0:  # the sequences never varied: no slope to read
            return None
        weighted = (x * w[:, None]).T
        xtx, xty = weighted @ x, weighted @ y
        active = [0, 1, 2, 3]
        coef = np.zeros(4)
        for _ in range(4):
            # least squares on the normal equations: collinear or empty features (a batch
            # whose context is in proportion, no prefill at all) get the minimum-norm answer
            solution = np.linalg.lstsq(xtx[np.ix_(active, active)], xty[active], rcond=None)[0]
            bad = [f for f, value in zip(active, solution, strict=True) if value < 0 and f != 0]
            if not bad:
                coef[active] = solution
                break
            active = [f for f in active if f not in bad]
        coef = np.maximum(coef, 0.0)
        if not coef[0] > 0 and not np.any(coef[1:] > 0):
            return None
        return StepFit(float(coef[0]), float(coef[1]), float(coef[2]), float(coef[3]), n)


class TTFTFit:
    """The engine's time to first token (admission to first token) as ``steps * gap +
    prefill_s_per_token * prefill_tokens``, and the spread of its residuals.

    A request is prefilled within the running batch: it waits for the step in progress and is
    computed in a following one, so its TTFT is a number of steps (``steps``, fitted by least
    squares through the origin over a sliding window) of the current token gap, plus the
    prefill of its prompt and of the prompts admitted before it that still wait for theirs
    (``prefill_tokens``), at the step-time fit's cost per prefill token (given to
    :meth:`fit`; the gap alone cannot tell the two apart over the narrow range of gaps one load
    gives).

    Args:
        window: samples kept (>= 8).
        min_samples: samples needed before :meth:`fit` answers (>= 4).
    """

    def __init__(self, window: int = 256, min_samples: int = 8) -> None:
        self.window = check_int("window", window, 8)
        self.min_samples = check_int("min_samples", min_samples, 2)
        self._gap = np.zeros(self.window, dtype=np.float64)
        self._prompt = np.zeros(self.window, dtype=np.float64)
        self._y = np.zeros(self.window, dtype=np.float64)
        self._n = 0
        self._next = 0

    def add(self, engine_ttft_s: float, gap_s: float, prefill_tokens: float) -> None:
        """One first token."""
        i = self._next
        self._gap[i] = gap_s
        self._prompt[i] = prefill_tokens
        self._y[i] = engine_ttft_s
        self._next = (i + 1) % self.window
        self._n = min(self._n + 1, self.window)

    def fit(
        self, prefill_s_per_token: float | None, quantile: float = 0.9
    ) -> tuple[float, float, float] | None:
        """``(steps, prefill_s_per_token, residual_s)``: the steps, the prefill cost, and the
        ``quantile`` of the residuals; None with fewer than ``min_samples`` samples. Without a
        prefill cost (None: no step-time fit yet) both are fitted, each kept >= 0."""
        n = self._n
        if n < self.min_samples:
            return None
        gap, tokens, ttft = self._gap[:n], self._prompt[:n], self._y[:n]
        if prefill_s_per_token is None:
            a = np.array([[gap @ gap, gap @ tokens], [gap @ tokens, tokens @ tokens]])
            b = np.array([gap @ ttft, tokens @ ttft])
            steps, per_token = (float(v) for v in np.linalg.lstsq(a, b, rcond=None)[0])
            if per_token < 0 or steps < 0:  # one of them alone
                per_token = max(float(tokens @ ttft) / max(float(tokens @ tokens), 1e-30), 0.0)
                steps = 0.0
        else:
            per_token = prefill_s_per_token
            rest = ttft - per_token * tokens
            steps = max(float(np.dot(gap, rest) / max(float(np.dot(gap, gap)), 1e-30)), 0.0)
        residual = float(np.quantile(ttft - steps * gap - per_token * tokens, quantile))
        return steps, per_token, residual


class DecayedMean:
    """A weighted mean whose samples fade with a time constant: ``sum(w * x) / sum(w)``, each
    sum decayed by ``exp(-dt / tau_s)`` (the mean token gap, weighted by the streams that saw
    each gap, is the mean TPOT those streams saw).

    Args:
        tau_s: time constant, seconds (> 0).
    """

    __slots__ = ("_last_s", "_tau", "_weight", "_weighted")

    def __init__(self, tau_s: float) -> None:
        self._tau = check_number("tau_s", tau_s, 0.0, strict=True)
        self._last_s: float | None = None
        self._weighted = 0.0
        self._weight = 0.0

    def add(self, value: float, weight: float, now: float) -> None:
        """Fold in ``value`` with ``weight`` (>= 0) at ``now``."""
        if self._last_s is not None:
            keep = math.exp(-max(now - self._last_s, 0.0) / self._tau)
            self._weighted *= keep
            self._weight *= keep
        self._last_s = now
        self._weighted += value * weight
        self._weight += weight

    @property
    def value(self) -> float:
        """The mean (NaN before any weight)."""
        return self._weighted / self._weight if self._weight > 0 else math.nan


class Ewma:
    """An exponentially weighted mean with a time constant, for irregular samples.

    Args:
        tau_s: time constant, seconds (> 0): a sample ``tau_s`` old weighs ``1/e`` of a new one.
    """

    __slots__ = ("_last_s", "_tau", "value")

    def __init__(self, tau_s: float) -> None:
        self._tau = check_number("tau_s", tau_s, 0.0, strict=True)
        self._last_s: float | None = None
        self.value = math.nan

    def update(self, sample: float, now: float) -> float:
        """Fold ``sample`` in at ``now`` (seconds); the first sample is taken as is."""
        if self._last_s is None or math.isnan(self.value):
            self.value = sample
        else:
            keep = math.exp(-max(now - self._last_s, 0.0) / self._tau)
            self.value = keep * self.value + (1.0 - keep) * sample
        self._last_s = now
        return self.value

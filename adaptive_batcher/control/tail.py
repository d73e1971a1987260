"""The tail of a request's latency in a window-batched queue, from the noise of batch times.

A request that arrives while a batch is being collected waits out the rest of the collection
period, then its own batch. The period is the window, or the batch in flight where that runs
longer (divided among the device's slots); the request's place in it is uniform. So its
latency inside the batcher is ``L = U * max(window, X1 / slots) + X2``, with ``U`` uniform on
[0, 1], ``X1`` the time of the batch in flight and ``X2`` its own batch's, each a lognormal
around the fitted median (the noise's body). :func:`latency_quantile_ms` gives a quantile of
``L``; the plan's former bound, ``max(window, X1 at its error bars) + X2 at its error bars``,
is the latency of a request that arrives first in its window behind a slow batch and then
rides a slow batch itself, near the 99.99th percentile when the noise is 30 %
(docs/policies.md, "The plan").

The law: ``P(L > t) = E[(m(t) - m(t - M)) / M]`` over ``M = max(window, X1 / slots)``, with
``m(c) = E[min(X2, c)]`` (``c`` itself for ``c <= 0``), a lognormal's limited expectation in
closed form (Klugman, Panjer and Willmot, "Loss Models", 4th ed., 2012, appendix A). ``X1``
is taken at ``POINTS`` points of its normal score, and ``t`` found on a grid refined twice.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np

__all__ = [
    "POINTS",
    "exceed_probability",
    "in_flight_points_ms",
    "latency_quantile_ms",
    "lognormal_sigma",
]

POINTS = 32
"""Points at which the batch in flight is taken: the midpoints of equal steps of its normal
score from -3.5 to 4.5, each weighted by its step's probability (the rest folded into the
end steps)."""

_GRID = 48
_EDGES = np.linspace(-3.5, 4.5, POINTS + 1)
_Z_POINTS = (_EDGES[:-1] + _EDGES[1:]) / 2.0
_CDF = np.array([NormalDist().cdf(z) for z in _EDGES])
_CDF[0], _CDF[-1] = 0.0, 1.0
_WEIGHTS = np.diff(_CDF)
_MIN_SIGMA = 1e-3
# Abramowitz and Stegun 7.1.26: erf to 1.5e-7, vectorised (numpy has no erf)
_P, _A = 0.3275911, (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


def lognormal_sigma(high_ms: float, median_ms: float, z: float) -> float:
    """The sigma of a lognormal whose ``z``-quantile is ``high_ms`` and median ``median_ms``
    (at least 1e-3; 1e-3 when either is not a positive number)."""
    if not (high_ms > 0 and median_ms > 0 and z > 0):
        return _MIN_SIGMA
    return max(_MIN_SIGMA, math.log(high_ms / median_ms) / z)


def latency_quantile_ms(
    window_ms: float,
    in_flight: tuple[float, float],
    own: tuple[float, float],
    quantile: float,
    slots: int = 1,
) -> float:
    """The ``quantile`` of ``U * max(window_ms, X1 / slots) + X2``, ms, where ``in_flight`` and
    ``own`` are ``(median_ms, sigma)`` of the lognormal times of the batch in flight (``X1``)
    and of the request's own batch (``X2``), and ``U`` is uniform on [0, 1]. Where a median
    is not positive (a batch timed at 0), ``max(window_ms, median_1 / slots) + median_2``."""
    median_1, median_2 = in_flight[0], own[0]
    if not (median_1 > 0.0 and median_2 > 0.0):  # a batch timed at 0 (or unknown): no noise
        return max(window_ms, median_1 / slots) + median_2
    periods, sigma_2 = _periods(window_ms, in_flight, slots), max(own[1], _MIN_SIGMA)
    low = median_2 * math.exp(-4.0 * sigma_2)
    high = float(periods[-1]) + median_2 * math.exp(4.5 * sigma_2)
    tail = 1.0 - quantile
    for _ in range(3):
        times = np.linspace(low, high, _GRID)
        limited = _limited_mean(times, median_2, sigma_2)
        before = _limited_mean(times[:, None] - periods[None, :], median_2, sigma_2)
        exceed = ((limited[:, None] - before) / periods[None, :]) @ _WEIGHTS
        index = int(np.argmax(exceed <= tail)) if bool(exceed[-1] <= tail) else _GRID
        if index == _GRID:
            return high
        if index == 0:
            return low
        low, high = float(times[index - 1]), float(times[index])
    return high


def exceed_probability(
    window_ms: float,
    in_flight: tuple[float, float],
    own: tuple[float, float],
    latency_ms: float,
    slots: int = 1,
    points_ms: np.ndarray | None = None,
) -> float:
    """``P(U * max(window_ms, X1 / slots) + X2 > latency_ms)``, with the arguments of
    :func:`latency_quantile_ms`: one evaluation where the quantile needs a search, so a plan
    checks a window against a budget with it. Where a median is not positive, 1 or 0 as
    ``max(window_ms, median_1 / slots) + median_2`` is above ``latency_ms`` or not.
    ``points_ms``: :func:`in_flight_points_ms` of ``in_flight`` and ``slots``, for a caller
    that checks many windows behind one batch in flight (default: computed here)."""
    median_1, median_2 = in_flight[0], own[0]
    if not (median_1 > 0.0 and median_2 > 0.0):
        return float(max(window_ms, median_1 / slots) + median_2 > latency_ms)
    if points_ms is None:
        points_ms = in_flight_points_ms(in_flight, slots)
    periods, sigma_2 = np.maximum(window_ms, points_ms), max(own[1], _MIN_SIGMA)
    limited = _limited_mean_at(latency_ms, median_2, sigma_2)
    before = _limited_mean(latency_ms - periods, median_2, sigma_2)
    return float(((limited - before) / periods) @ _WEIGHTS)


def in_flight_points_ms(in_flight: tuple[float, float], slots: int = 1) -> np.ndarray:
    """``X1 / slots`` at the ``POINTS`` points of its normal score, ms, for the batch in
    flight's ``(median_ms, sigma)``."""
    median, sigma = in_flight
    points: np.ndarray = median * np.exp(max(sigma, _MIN_SIGMA) * _Z_POINTS) / slots
    return points


def _periods(window_ms: float, in_flight: tuple[float, float], slots: int) -> np.ndarray:
    """The collection period ``max(window_ms, X1 / slots)`` at the points of ``X1``, ms."""
    periods: np.ndarray = np.maximum(window_ms, in_flight_points_ms(in_flight, slots))
    return periods


def _limited_mean_at(limit: float, median: float, sigma: float) -> float:
    """:func:`_limited_mean` at one ``limit``, with the math module's erfc."""
    if limit <= 0.0:
        return limit
    log_ratio = math.log(limit / median) / sigma
    mean_part = median * math.exp(sigma * sigma / 2.0) * _cdf(log_ratio - sigma)
    return mean_part + limit * (1.0 - _cdf(log_ratio))


def _cdf(z: float) -> float:
    return 0.5 * math.erfc(-z / math.sqrt(2.0))


def _limited_mean(limits: np.ndarray, median: float, sigma: float) -> np.ndarray:
    """``E[min(X, c)]`` for ``X = median * exp(sigma * Z)`` at each ``c`` of ``limits`` (``c``
    itself where ``c <= 0``)."""
    positive = np.maximum(limits, 1e-300)
    log_ratio = np.log(positive / median) / sigma
    both = _normal_cdf(np.concatenate((log_ratio - sigma, log_ratio)))  # one call for both
    size = len(limits)
    mean_part = median * math.exp(sigma * sigma / 2.0) * both[:size]
    result = mean_part + positive * (1.0 - both[size:])
    cut: np.ndarray = np.where(limits > 0, result, limits)
    return cut


def _normal_cdf(z: np.ndarray) -> np.ndarray:
    x = np.abs(z) / math.sqrt(2.0)
    t = 1.0 / (1.0 + _P * x)
    poly = t * (_A[0] + t * (_A[1] + t * (_A[2] + t * (_A[3] + t * _A[4]))))
    erf = 1.0 - poly * np.exp(-x * x)
    cdf: np.ndarray = 0.5 * (1.0 + np.sign(z) * erf)
    return cdf

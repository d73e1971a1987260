"""Arrival processes for the simulator: when requests arrive and how many units each carries.

Every open-loop workload (:class:`Poisson`, :class:`Gamma`, :class:`MMPPBursts`,
:class:`Diurnal`, :class:`Steps`) is a small frozen dataclass with ``generate(duration_s, rng)``
that returns :class:`Arrivals` on ``[0, duration_s)``, what ``Simulator.run`` replays. All
randomness comes from the passed :class:`numpy.random.Generator` (same seed, same arrays) and
generation is vectorised: one hour of Poisson arrivals at 5000 req/s (18 M requests) takes a
fraction of a second. Arrival times are drawn first, then sizes.

Request sizes come from a *size sampler*, any callable ``(n, rng) -> array of n ints >= 1``;
:class:`FixedSize` and :class:`LognormalSizes` are the usual ones, and the default is one unit
per request.

:class:`ClosedLoop` describes closed-loop clients (one request in flight each, exponential think
time) for a duration; ``Simulator.run`` takes it as it takes :class:`Arrivals` and drives the
clients itself, since their arrivals depend on completions.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from adaptive_batcher._validate import check_number, check_str

__all__ = [
    "MAX_GAMMA_CV",
    "MIN_GAMMA_CV",
    "Arrivals",
    "ClosedLoop",
    "Diurnal",
    "FixedSize",
    "Gamma",
    "LognormalSizes",
    "MMPPBursts",
    "Poisson",
    "SizeSampler",
    "Steps",
    "Workload",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

SizeSampler = Callable[[int, np.random.Generator], npt.ArrayLike]
"""``(n, rng) -> sizes``: ``n`` request sizes in units, integers >= 1, shape ``(n,)``."""


@dataclass(frozen=True, eq=False)
class Arrivals:
    """Open-loop requests: arrival times and sizes.

    Arrays are stored as read-only views (a generator's arrays are not copied); constant sizes
    (the default one unit, :class:`FixedSize`) are a zero-stride broadcast view, so an hour of
    requests costs no memory for them. Copy an array (``np.array(a.sizes)``) to modify it.

    Args:
        times_s: arrival times in seconds from 0, float64, shape ``(n,)``, finite, >= 0 and
            sorted (non-decreasing).
        sizes: units per request (items or tokens), int64, shape ``(n,)``, each >= 1.
        name: a label for reports, e.g. ``"poisson(1000 rps)"``.
        duration_s: the horizon the arrivals cover, seconds (>= the last time); NaN (default)
            means the last arrival time (0 when empty). :attr:`rate_rps` divides by it.

    Raises:
        ValueError: shapes differ or are not 1-D, times unsorted, negative or not finite,
            sizes not integers >= 1, ``duration_s`` before the last arrival.
    """

    times_s: FloatArray
    sizes: IntArray
    name: str = "arrivals"
    duration_s: float = math.nan

    def __post_init__(self) -> None:
        check_str("Arrivals.name", self.name)
        times = np.asarray(self.times_s, dtype=np.float64).view()
        raw_sizes = np.asarray(self.sizes)
        if times.ndim != 1 or raw_sizes.ndim != 1 or times.shape != raw_sizes.shape:
            raise ValueError(
                f"times_s and sizes must be 1-D of the same length, "
                f"got shapes {times.shape} and {raw_sizes.shape}"
            )
        sizes = _as_sizes(raw_sizes, times.size, "sizes").view()
        if times.size:
            if not np.all(np.isfinite(times)) or times[0] < 0:
                raise ValueError("times_s must be finite and >= 0")
            if not np.all(times[1:] >= times[:-1]):
                raise ValueError("times_s must be sorted (non-decreasing)")
        last = float(times[-1]) if times.size else 0.0
        duration = last if math.isnan(self.duration_s) else float(self.duration_s)
        if not math.isfinite(duration) or duration < last:
            raise ValueError(
                f"duration_s must be finite and >= the last arrival ({last} s), got {duration}"
            )
        times.flags.writeable = False
        sizes.flags.writeable = False
        object.__setattr__(self, "times_s", times)
        object.__setattr__(self, "sizes", sizes)
        object.__setattr__(self, "duration_s", duration)

    def __len__(self) -> int:
        return int(self.times_s.size)

    @property
    def rate_rps(self) -> float:
        """Requests per second over ``duration_s``: 0 when empty, inf when the span is 0."""
        n = len(self)
        if n == 0:
            return 0.0
        return n / self.duration_s if self.duration_s > 0 else math.inf

    @property
    def total_units(self) -> int:
        """Sum of the request sizes, units."""
        return int(self.sizes.sum())


def _as_sizes(values: npt.ArrayLike, n: int, what: str) -> IntArray:
    array = np.asarray(values)
    if array.shape != (n,):
        raise ValueError(f"{what} must have shape ({n},), got {array.shape}")
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    if not np.issubdtype(array.dtype, np.integer) and (
        not np.issubdtype(array.dtype, np.floating)
        or not np.all(np.isfinite(array) & (array == np.round(array)))
    ):
        raise ValueError(f"{what} must be integers >= 1, got dtype {array.dtype}")
    if np.min(array) < 1:
        raise ValueError(f"{what} must be integers >= 1, got a minimum of {np.min(array)}")
    return array.astype(np.int64, copy=False)


def _constant_sizes(k: int, n: int) -> IntArray:
    """``n`` copies of ``k`` as a read-only broadcast view: no memory for any ``n``."""
    return np.broadcast_to(np.int64(k), (n,))


def _sample_sizes(sampler: SizeSampler | None, n: int, rng: np.random.Generator) -> IntArray:
    if sampler is None:
        return _constant_sizes(1, n)
    return _as_sizes(sampler(n, rng), n, f"sizes from {sampler!r}")


@runtime_checkable
class Workload(Protocol):
    """An open-loop arrival process: ``generate(duration_s, rng)`` -> :class:`Arrivals`."""

    @property
    def name(self) -> str: ...

    def generate(self, duration_s: float, rng: np.random.Generator) -> Arrivals: ...


# --- size samplers -----------------------------------------------------------------------------


@dataclass(frozen=True)
class FixedSize:
    """Every request carries ``k`` units (an integer >= 1, else ValueError). Draws nothing."""

    k: int

    def __post_init__(self) -> None:
        if isinstance(self.k, bool) or int(self.k) != self.k or self.k < 1:
            raise ValueError(f"k must be an integer >= 1, got {self.k!r}")

    def __call__(self, n: int, rng: np.random.Generator) -> IntArray:
        """``n`` copies of ``k``, int64, shape ``(n,)``, a read-only (broadcast) view."""
        return _constant_sizes(int(self.k), n)


@dataclass(frozen=True)
class LognormalSizes:
    """Sizes ``round(median * exp(sigma * Z))``, Z standard normal, clipped to [1, max_units].

    A lognormal fits prompt and output lengths of LLM services (the Azure LLM inference traces of
    2023, Azure/AzurePublicDataset; Patel et al., "Splitwise", ISCA 2024), which have a long
    right tail. Draws ``n`` standard normals.

    Args:
        median: median size before rounding, units (> 0).
        sigma: standard deviation of ``log(size)`` (>= 0; 0 gives ``round(median)``).
        max_units: the largest size (>= 1); larger draws are clipped to it.

    Raises:
        ValueError: a parameter out of range or not finite.
    """

    median: float
    sigma: float
    max_units: int

    def __post_init__(self) -> None:
        if not math.isfinite(self.median) or self.median <= 0:
            raise ValueError(f"median must be finite and > 0, got {self.median!r}")
        if not math.isfinite(self.sigma) or self.sigma < 0:
            raise ValueError(f"sigma must be finite and >= 0, got {self.sigma!r}")
        if isinstance(self.max_units, bool) or int(self.max_units) != self.max_units:
            raise ValueError(f"max_units must be an integer >= 1, got {self.max_units!r}")
        if self.max_units < 1:
            raise ValueError(f"max_units must be an integer >= 1, got {self.max_units!r}")

    def __call__(self, n: int, rng: np.random.Generator) -> IntArray:
        """``n`` sizes, int64, shape ``(n,)``, each in ``[1, max_units]``."""
        draws = rng.standard_normal(n)
        draws *= self.sigma
        np.exp(draws, out=draws)
        draws *= self.median
        np.rint(draws, out=draws)
        np.clip(draws, 1, int(self.max_units), out=draws)
        return draws.astype(np.int64)


# --- shared machinery --------------------------------------------------------------------------


MIN_GAMMA_CV: Final = 1e-3
"""The smallest inter-arrival CV :class:`Gamma` takes: gaps within 0.1 % of their mean are
regular arrivals already; near 1e-150 the shape ``1 / cv**2`` overflows (ZeroDivisionError)."""

MAX_GAMMA_CV: Final = 100.0
"""The largest inter-arrival CV :class:`Gamma` takes: several times the burstiest public trace's
(the Azure LLM code trace of 2023: 13.2)."""


def _check_duration(duration_s: float, rng: object) -> float:
    """The horizon ``duration_s``, checked with the generator a workload draws from.

    Raises:
        TypeError: ``rng`` is not a numpy Generator (an int seed is not one: pass
            ``np.random.default_rng(seed)``); ``duration_s`` is not a number.
        ValueError: ``duration_s`` < 0 or not finite.
    """
    if not isinstance(rng, np.random.Generator):
        raise TypeError(
            f"rng must be a numpy Generator (np.random.default_rng(seed)), got {type(rng).__name__}"
        )
    return check_number("duration_s", duration_s, 0.0)


def _check_rate(name: str, value: float) -> float:
    return check_number(name, value, 0.0)


def _check_positive(name: str, value: float) -> float:
    return check_number(name, value, 0.0, strict=True)


def _set_float(workload: object, name: str, value: float) -> None:
    """Store a field of a frozen workload as the float its check returned: a ``Fraction``,
    numpy scalar or int given for it reads (``name``, ``repr``) and computes as that float."""
    object.__setattr__(workload, name, value)


def _renewal_times(
    draw_unit_gaps: Callable[[int], FloatArray], scale: float, mean_gap: float, horizon: float
) -> FloatArray:
    """Epochs of a renewal process on ``[0, horizon)``, the first one gap after 0.

    Gaps are ``scale * draw_unit_gaps(m)`` (``mean_gap``: their mean, seconds), drawn in chunks
    sized to the expected remainder plus slack, cumulated in place, and the chunks concatenated
    until the horizon is passed; O(n), no temporaries, deterministic for a given rng.
    """
    if horizon <= 0 or not math.isfinite(mean_gap):
        return np.zeros(0, dtype=np.float64)
    chunks: list[FloatArray] = []
    start = 0.0
    while True:
        expected = (horizon - start) / mean_gap
        m = int(expected * 1.02 + 4.0 * math.sqrt(expected) + 16)
        epochs = np.asarray(draw_unit_gaps(m), dtype=np.float64)
        np.cumsum(epochs, out=epochs)
        with np.errstate(over="ignore"):  # extreme gamma draws overflow to inf: past the horizon
            epochs *= scale
        epochs += start
        chunks.append(epochs)
        start = float(epochs[-1])
        if start >= horizon:
            break
    times = chunks[0] if len(chunks) == 1 else np.concatenate(chunks)
    return times[: int(np.searchsorted(times, horizon, side="left"))]


def _poisson_times(rate: float, horizon: float, rng: np.random.Generator) -> FloatArray:
    if rate <= 0:
        return np.zeros(0, dtype=np.float64)
    mean_gap = 1.0 / rate
    return _renewal_times(rng.standard_exponential, mean_gap, mean_gap, horizon)


_LOOP_SEGMENTS = 4096
"""Up to this many rate segments, :func:`_piecewise_poisson` maps each in place in a loop."""


def _piecewise_poisson(
    starts: FloatArray, rates: FloatArray, horizon: float, rng: np.random.Generator
) -> FloatArray:
    """Poisson arrivals on ``[0, horizon)`` with rate ``rates[i]`` from ``starts[i]`` on.

    ``starts`` is increasing with ``starts[0] == 0``; the last rate holds to the horizon. Exact
    by time change: a unit-rate Poisson process on ``[0, Lambda(horizon))`` mapped through the
    inverse of the piecewise-linear cumulative rate ``Lambda(t)`` (Cinlar, "Introduction to
    Stochastic Processes", 1975, the time-change theorem for nonhomogeneous Poisson processes).
    """
    ends = np.append(starts[1:], horizon)
    ends = np.minimum(ends, horizon)
    lengths = np.maximum(ends - starts, 0.0)
    mass = rates * lengths
    keep = mass > 0
    if not np.any(keep):
        return np.zeros(0, dtype=np.float64)
    seg_starts, seg_rates, seg_mass = starts[keep], rates[keep], mass[keep]
    cum = np.concatenate(([0.0], np.cumsum(seg_mass)))
    # Mapped in place, segment by segment: t = start + (u - Lambda(start)) / rate.
    times = _renewal_times(rng.standard_exponential, 1.0, 1.0, float(cum[-1]))
    bounds = np.searchsorted(times, cum, side="left")
    if seg_rates.size <= _LOOP_SEGMENTS:
        for i in np.flatnonzero(bounds[1:] > bounds[:-1]):
            part = times[bounds[i] : bounds[i + 1]]
            part -= cum[i]
            part /= seg_rates[i]
            part += seg_starts[i]
    else:  # many short segments: per-arrival parameters by np.repeat
        counts = np.diff(bounds)
        times -= np.repeat(cum[:-1], counts)
        times /= np.repeat(seg_rates, counts)
        times += np.repeat(seg_starts, counts)
    np.maximum.accumulate(times, out=times)  # absorbs last-ulp rounding at segment joins
    return times[: int(np.searchsorted(times, horizon, side="left"))]


# --- open-loop workloads -----------------------------------------------------------------------


@dataclass(frozen=True)
class Poisson:
    """Poisson arrivals at ``rate_rps`` (>= 0) requests/s: i.i.d. exponential gaps.

    Raises:
        ValueError: ``rate_rps`` negative or not finite; from :meth:`generate`, a bad
            ``duration_s`` or sampler output.
    """

    rate_rps: float
    sizes: SizeSampler | None = None

    def __post_init__(self) -> None:
        _set_float(self, "rate_rps", _check_rate("rate_rps", self.rate_rps))

    @property
    def name(self) -> str:
        """``poisson(<rate> rps)``."""
        return f"poisson({self.rate_rps:g} rps)"

    def generate(self, duration_s: float, rng: np.random.Generator) -> Arrivals:
        """Arrivals on ``[0, duration_s)``; ValueError when ``duration_s`` < 0 or not finite."""
        horizon = _check_duration(duration_s, rng)
        times = _poisson_times(self.rate_rps, horizon, rng)
        return Arrivals(times, _sample_sizes(self.sizes, times.size, rng), self.name, horizon)


@dataclass(frozen=True)
class Gamma:
    """A renewal process with gamma gaps: mean ``1 / rate_rps``, coefficient of variation ``cv``.

    Shape ``k = 1 / cv**2`` and scale ``cv**2 / rate_rps`` (gamma moments: mean ``k * scale``,
    CV ``1 / sqrt(k)``). ``cv = 1`` is Poisson; ``cv > 1`` is bursty (the Azure LLM code trace of
    2023, Azure/AzurePublicDataset, has an inter-arrival CV of 13.2), ``cv < 1`` regular. The
    first arrival
    comes one gap after 0 (not the stationary start; it matters only for the first gap).

    Raises:
        ValueError: ``rate_rps`` < 0 or not finite, or ``cv`` outside
            [:data:`MIN_GAMMA_CV`, :data:`MAX_GAMMA_CV`]
            (beyond it the shape ``1 / cv**2`` is so small that numpy's gamma draws are mostly
            0 and one sample's rate is far from ``rate_rps``: at CV 1000, 254,486 arrivals in
            1 s at 100 req/s; near CV 1e154 the shape underflows to 0).
    """

    rate_rps: float
    cv: float
    sizes: SizeSampler | None = None

    def __post_init__(self) -> None:
        _set_float(self, "rate_rps", _check_rate("rate_rps", self.rate_rps))
        _set_float(self, "cv", _check_positive("cv", self.cv))
        if not MIN_GAMMA_CV <= self.cv <= MAX_GAMMA_CV:
            raise ValueError(f"cv must be in [{MIN_GAMMA_CV:g}, {MAX_GAMMA_CV:g}], got {self.cv!r}")

    @property
    def name(self) -> str:
        """``gamma(<rate> rps, cv=<cv>)``."""
        return f"gamma({self.rate_rps:g} rps, cv={self.cv:g})"

    def generate(self, duration_s: float, rng: np.random.Generator) -> Arrivals:
        """Arrivals on ``[0, duration_s)``; ValueError when ``duration_s`` < 0 or not finite."""
        horizon = _check_duration(duration_s, rng)
        if self.rate_rps == 0:
            times = np.zeros(0, dtype=np.float64)
        else:
            shape = 1.0 / (self.cv * self.cv)
            mean_gap = 1.0 / self.rate_rps
            times = _renewal_times(
                lambda m: rng.standard_gamma(shape, m), mean_gap / shape, mean_gap, horizon
            )
        return Arrivals(times, _sample_sizes(self.sizes, times.size, rng), self.name, horizon)


@dataclass(frozen=True)
class MMPPBursts:
    """Two-state Markov-modulated Poisson process: a base rate with bursts.

    The process alternates between *off* (rate ``base_rps``) and *on* (rate ``burst_rps``)
    with exponential sojourns of mean ``mean_off_s`` and ``mean_on_s``. The state at 0 is drawn
    from the stationary distribution (on with probability ``mean_on_s / (mean_on_s +
    mean_off_s)``), and by memorylessness the first sojourn is again exponential, so the process
    is stationary from 0. Its time-average rate is :attr:`mean_rate_rps`.

    Raises:
        ValueError: a rate < 0, a mean sojourn <= 0, or a value not finite.
    """

    base_rps: float
    burst_rps: float
    mean_on_s: float
    mean_off_s: float
    sizes: SizeSampler | None = None

    def __post_init__(self) -> None:
        _set_float(self, "base_rps", _check_rate("base_rps", self.base_rps))
        _set_float(self, "burst_rps", _check_rate("burst_rps", self.burst_rps))
        _set_float(self, "mean_on_s", _check_positive("mean_on_s", self.mean_on_s))
        _set_float(self, "mean_off_s", _check_positive("mean_off_s", self.mean_off_s))

    @property
    def on_fraction(self) -> float:
        """Long-run fraction of time in the burst state: ``on / (on + off)``."""
        return self.mean_on_s / (self.mean_on_s + self.mean_off_s)

    @property
    def mean_rate_rps(self) -> float:
        """Time-average rate, requests/s: ``base * (1 - f) + burst * f``, f = on_fraction."""
        f = self.on_fraction
        return self.base_rps * (1.0 - f) + self.burst_rps * f

    @property
    def name(self) -> str:
        """``mmpp(<base>/<burst> rps, on <s>/off <s>)``."""
        return (
            f"mmpp({self.base_rps:g}/{self.burst_rps:g} rps, "
            f"on {self.mean_on_s:g} s/off {self.mean_off_s:g} s)"
        )

    def sojourns(
        self, duration_s: float, rng: np.random.Generator
    ) -> tuple[FloatArray, FloatArray]:
        """The modulating chain on ``[0, duration_s)``: ``(starts_s, on)``.

        ``starts_s`` (float64, shape ``(m,)``, ``starts_s[0] == 0``) are the times the state
        changes and ``on`` (bool as float64 0/1, same shape) the state from each start on.
        Draws one uniform, then exponentials in chunks. Used by :meth:`generate`, which draws
        the same values first, so both agree for equal seeds.
        """
        horizon = _check_duration(duration_s, rng)
        first_on = bool(rng.random() < self.on_fraction)
        cycle = self.mean_on_s + self.mean_off_s
        starts: list[FloatArray] = []
        states: list[FloatArray] = []
        t, on = 0.0, first_on
        while True:
            m = int(2.0 * (horizon - t) / cycle * 1.1 + 16)
            state = np.zeros(m, dtype=np.float64)
            state[(0 if on else 1) :: 2] = 1.0
            means = np.where(state > 0, self.mean_on_s, self.mean_off_s)
            ends = t + np.cumsum(rng.standard_exponential(m) * means)
            starts.append(np.concatenate(([t], ends[:-1])))
            states.append(state)
            t = float(ends[-1])
            on = not bool(state[-1])
            if t >= horizon:
                break
        all_starts = np.concatenate(starts)
        all_states = np.concatenate(states)
        n = max(1, int(np.searchsorted(all_starts, horizon, side="left")))
        return all_starts[:n], all_states[:n]

    def generate(self, duration_s: float, rng: np.random.Generator) -> Arrivals:
        """Arrivals on ``[0, duration_s)``; ValueError when ``duration_s`` < 0 or not finite."""
        horizon = _check_duration(duration_s, rng)
        starts, on = self.sojourns(horizon, rng)
        rates = np.where(on > 0, self.burst_rps, self.base_rps)
        times = _piecewise_poisson(starts, rates, horizon, rng)
        return Arrivals(times, _sample_sizes(self.sizes, times.size, rng), self.name, horizon)


@dataclass(frozen=True)
class Diurnal:
    """Poisson arrivals with a sinusoidal rate, e.g. a day compressed into ``period_s``.

    Rate ``mean_rps * (1 + amplitude * sin(2 pi (t + phase_s) / period_s))``; with
    ``phase_s = 0`` it starts at the mean, rising, peaks at ``period_s / 4`` and bottoms out at
    ``3 period_s / 4``. Generated by thinning (Lewis & Shedler, "Simulation of nonhomogeneous
    Poisson processes by thinning", 1979): Poisson candidates at the peak rate, each kept with
    probability ``rate(t) / peak``; draws the candidates' exponentials, then one uniform each.

    Raises:
        ValueError: ``mean_rps`` < 0, ``amplitude`` outside [0, 1], ``period_s`` <= 0, or a
            value not finite.
    """

    mean_rps: float
    amplitude: float
    period_s: float
    phase_s: float = 0.0
    sizes: SizeSampler | None = None

    def __post_init__(self) -> None:
        _set_float(self, "mean_rps", _check_rate("mean_rps", self.mean_rps))
        if not math.isfinite(self.amplitude) or not 0.0 <= self.amplitude <= 1.0:
            raise ValueError(f"amplitude must be in [0, 1], got {self.amplitude!r}")
        _set_float(self, "amplitude", float(self.amplitude))
        _set_float(self, "period_s", _check_positive("period_s", self.period_s))
        if not math.isfinite(self.phase_s):
            raise ValueError(f"phase_s must be finite, got {self.phase_s!r}")
        _set_float(self, "phase_s", float(self.phase_s))

    @property
    def name(self) -> str:
        """``diurnal(<mean> rps +-<amplitude>, period <s>)``."""
        return f"diurnal({self.mean_rps:g} rps +-{self.amplitude:g}, period {self.period_s:g} s)"

    @property
    def peak_rps(self) -> float:
        """The largest rate, ``mean_rps * (1 + amplitude)``, requests/s."""
        return self.mean_rps * (1.0 + self.amplitude)

    def rate_at(self, t_s: npt.ArrayLike) -> FloatArray:
        """The instantaneous rate in requests/s at ``t_s`` seconds (any shape, float64)."""
        t = np.asarray(t_s, dtype=np.float64)
        phase = 2.0 * np.pi * (t + self.phase_s) / self.period_s
        rate: FloatArray = self.mean_rps * (1.0 + self.amplitude * np.sin(phase))
        return rate

    def generate(self, duration_s: float, rng: np.random.Generator) -> Arrivals:
        """Arrivals on ``[0, duration_s)``; ValueError when ``duration_s`` < 0 or not finite."""
        horizon = _check_duration(duration_s, rng)
        peak = self.peak_rps
        candidates = _poisson_times(peak, horizon, rng)
        if candidates.size:
            rate = candidates + self.phase_s  # the rate at each candidate, computed in place
            rate *= 2.0 * np.pi / self.period_s
            np.sin(rate, out=rate)
            rate *= self.mean_rps * self.amplitude
            rate += self.mean_rps
            draw = rng.random(candidates.size)
            draw *= peak
            times = candidates[draw < rate]
        else:
            times = candidates
        return Arrivals(times, _sample_sizes(self.sizes, times.size, rng), self.name, horizon)


@dataclass(frozen=True)
class Steps:
    """Poisson arrivals with a piecewise-constant rate: ``rates_rps[i]`` on ``[i, i+1) * step_s``.

    The last rate holds from ``(len - 1) * step_s`` to the end of the run; e.g.
    ``Steps((1000, 3000), 60)`` is 1000 req/s for a minute, then 3000 req/s. Exact for each
    segment (a Poisson process by time change).

    Raises:
        ValueError: no rates, a rate < 0, ``step_s`` <= 0, or a value not finite.
    """

    rates_rps: tuple[float, ...]
    step_s: float
    sizes: SizeSampler | None = None
    _starts: FloatArray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        rates = tuple(float(r) for r in self.rates_rps)
        if not rates:
            raise ValueError("rates_rps must hold at least one rate")
        for i, rate in enumerate(rates):
            _check_rate(f"rates_rps[{i}]", rate)
        _set_float(self, "step_s", _check_positive("step_s", self.step_s))
        object.__setattr__(self, "rates_rps", rates)
        object.__setattr__(self, "_starts", np.arange(len(rates), dtype=np.float64) * self.step_s)

    @property
    def name(self) -> str:
        """``steps(<r0>/<r1>/... rps every <s>)``."""
        return f"steps({'/'.join(f'{r:g}' for r in self.rates_rps)} rps every {self.step_s:g} s)"

    def rate_at(self, t_s: float) -> float:
        """The rate in requests/s at ``t_s`` seconds (the first rate before 0)."""
        i = min(max(int(t_s // self.step_s), 0), len(self.rates_rps) - 1)
        return self.rates_rps[i]

    def generate(self, duration_s: float, rng: np.random.Generator) -> Arrivals:
        """Arrivals on ``[0, duration_s)``; ValueError when ``duration_s`` < 0 or not finite."""
        horizon = _check_duration(duration_s, rng)
        rates = np.asarray(self.rates_rps, dtype=np.float64)
        times = _piecewise_poisson(self._starts, rates, horizon, rng)
        return Arrivals(times, _sample_sizes(self.sizes, times.size, rng), self.name, horizon)


# --- closed loop -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClosedLoop:
    """Closed-loop clients: each has one request in flight and thinks between requests.

    A client sends, waits for its response, thinks for an exponential time of mean ``think_s``,
    and sends again (the interactive model of queueing theory), until ``duration_s``: a request
    due later is not sent. ``Simulator.run(closed_loop)`` drives it: it seeds the queue with
    :meth:`first_arrivals` and, on each completion at ``done_at_s``, schedules
    :meth:`next_arrival`; each request's size comes from :meth:`sample_sizes`. With
    ``clients == 1`` and ``think_s == 0`` batches never fill, and the window should fall toward
    0 (MLServer #777).

    Args:
        clients: number of clients (an integer >= 1).
        think_s: mean think time, seconds (>= 0; 0 sends again at once, drawing nothing).
        sizes: size sampler for the requests (default one unit each, drawing nothing).
        duration_s: how long the clients send, seconds from 0 (a finite number >= 0);
            keyword only.

    Raises:
        ValueError: ``clients`` not an integer >= 1, ``think_s`` or ``duration_s`` < 0 or not
            finite.
        TypeError: ``duration_s`` not a real number.
    """

    clients: int
    think_s: float
    sizes: SizeSampler | None = None
    duration_s: float = field(kw_only=True)

    def __post_init__(self) -> None:
        if isinstance(self.clients, bool) or int(self.clients) != self.clients or self.clients < 1:
            raise ValueError(f"clients must be an integer >= 1, got {self.clients!r}")
        if not math.isfinite(self.think_s) or self.think_s < 0:
            raise ValueError(f"think_s must be finite and >= 0, got {self.think_s!r}")
        _set_float(self, "think_s", float(self.think_s))
        duration = check_number("duration_s", self.duration_s, 0.0)
        object.__setattr__(self, "duration_s", duration)

    @property
    def name(self) -> str:
        """``closed(<clients> clients, think <s>)``."""
        return f"closed({self.clients} clients, think {self.think_s:g} s)"

    def first_arrivals(self, rng: np.random.Generator) -> FloatArray:
        """Each client's first request time, seconds: one think time after 0, sorted.

        float64, shape ``(clients,)``; all zeros when ``think_s == 0``.
        """
        if self.think_s == 0:
            return np.zeros(int(self.clients), dtype=np.float64)
        return np.sort(rng.exponential(self.think_s, int(self.clients)))

    def next_arrival(self, done_at_s: float, rng: np.random.Generator) -> float:
        """Seconds: the next request of a client whose response came at ``done_at_s`` seconds."""
        if self.think_s == 0:
            return float(done_at_s)
        return float(done_at_s) + float(rng.exponential(self.think_s))

    def sample_sizes(self, n: int, rng: np.random.Generator) -> IntArray:
        """Sizes of ``n`` requests, int64, shape ``(n,)``; ValueError on bad sampler output."""
        return _sample_sizes(self.sizes, n, rng)

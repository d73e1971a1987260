"""Sliding-window latency quantiles: a log-bucket histogram in a ring of time slices.

A value ``x`` (seconds) lands in bucket ``floor(log(x / MIN_S) / log(GAMMA))``; a bucket is reported
by the value ``2 * lower * GAMMA / (1 + GAMMA)``, whose relative error is at most
``(GAMMA - 1) / (GAMMA + 1)``, 0.99 % for ``GAMMA = 1.02`` (the bucket scheme of DDSketch,
Masson et al., VLDB 2019). Recording is O(1): one log, one list increment. Old samples leave the
window a whole slice at a time (``window_s / slices`` granularity). Each slice also keeps the lowest
and highest bucket it holds, so a reading converts only that range (a few hundred buckets, not all
~1300). Reading (quantiles, counts) never changes the ring, so another thread (a metrics scrape)
may read while the event loop records.

:class:`CumulativeHistogram` is the other kind: counts since creation at fixed bounds, exact, the
shape of a Prometheus or OpenTelemetry explicit-bucket histogram.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import numpy as np

__all__ = [
    "GAMMA",
    "LATENCY_BOUNDS_S",
    "MAX_S",
    "MIN_S",
    "CumulativeHistogram",
    "HistogramSnapshot",
    "Quantiles",
    "SlidingHistogram",
]

GAMMA = 1.02
MIN_S = 1e-6
MAX_S = 1e5
_LOG_GAMMA = math.log(GAMMA)
_INV_LOG_GAMMA = 1.0 / _LOG_GAMMA
_INV_MIN_S = 1.0 / MIN_S
_N_BUCKETS = math.ceil(math.log(MAX_S / MIN_S) / _LOG_GAMMA) + 1
_UPPER_S = [MIN_S * GAMMA ** (i + 1) for i in range(_N_BUCKETS)]  # bucket i is below _UPPER_S[i]
_REPRESENTATIVE = MIN_S * 2.0 * GAMMA ** (np.arange(_N_BUCKETS) + 1.0) / (1.0 + GAMMA)
_LISTED = np.array([0.5, 0.9, 0.95, 0.99, 1.0])  # the quantiles a Quantiles reading holds

LATENCY_BOUNDS_S: tuple[float, ...] = (
    0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05,
    0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip
"""Upper bounds (seconds) of the cumulative latency and batch-time histograms: 0.1 ms to 60 s,
dense around the 5-300 ms of online-serving SLOs (a 1-2-3-5 series there)."""


@dataclass(frozen=True, slots=True)
class Quantiles:
    """Latency quantiles over the window, in milliseconds, and the number of samples behind them.

    The quantile fields are NaN when ``count`` is 0.
    """

    count: int
    p50_ms: float
    p90_ms: float
    p95_ms: float
    p99_ms: float
    max_ms: float
    mean_ms: float

    def quantile_ms(self, q: float) -> float:
        """One of the stored quantiles by its fraction (0.5, 0.9, 0.95 or 0.99)."""
        table = {0.5: self.p50_ms, 0.9: self.p90_ms, 0.95: self.p95_ms, 0.99: self.p99_ms}
        if q not in table:
            raise ValueError(f"q must be one of {sorted(table)}, got {q!r}")
        return table[q]


def _bucket(value_s: float) -> int:
    if value_s <= MIN_S:
        return 0
    return min(int(math.log(value_s * _INV_MIN_S) * _INV_LOG_GAMMA), _N_BUCKETS - 1)


class SlidingHistogram:
    """Latency histogram over the last ``window_s`` seconds, in ``slices`` ring slices.

    Args:
        window_s: span of the sliding window, seconds (> 0).
        slices: number of ring slices (>= 1); samples expire one slice at a time.

    Raises:
        ValueError: on a non-positive window or slice count.
    """

    __slots__ = (
        "_counts",
        "_current",
        "_frozen",
        "_high",
        "_limit_s",
        "_low",
        "_max",
        "_sizes",
        "_slice_end",
        "_slice_s",
        "_sums",
        "_within",
        "_within_limit",
        "slices",
        "window_s",
    )

    def __init__(self, window_s: float = 10.0, slices: int = 10) -> None:
        if not window_s > 0:
            raise ValueError(f"window_s must be > 0, got {window_s!r}")
        if slices < 1:
            raise ValueError(f"slices must be >= 1, got {slices!r}")
        self.window_s = window_s
        self.slices = slices
        self._slice_s = window_s / slices
        self._counts = [[0] * _N_BUCKETS for _ in range(slices)]
        self._sums = [0.0] * slices
        # the lowest and highest bucket each slice holds (_N_BUCKETS and -1 when empty)
        self._low = [_N_BUCKETS] * slices
        self._high = [-1] * slices
        # a slice the ring has moved past: (its lowest bucket, its counts from there, as an
        # array); None while it is not frozen
        self._frozen: list[tuple[int, np.ndarray[Any, np.dtype[np.int64]]] | None]
        self._frozen = [None] * slices
        self._sizes = [0] * slices  # samples per slice
        self._max = [-math.inf] * slices  # each slice's largest sample, exact
        self._limit_s = math.inf
        # samples per slice at or below _within_limit (NaN: the limit changed within the slice)
        self._within = [0] * slices
        self._within_limit = [math.inf] * slices
        self._current = 0
        self._slice_end: float | None = None

    @property
    def limit_s(self) -> float:
        """The limit (seconds) whose share :meth:`fraction_at_most` counts exactly."""
        return self._limit_s

    def set_limit(self, limit_s: float) -> None:
        """Count samples at or below ``limit_s`` seconds exactly from now on (the SLO).

        Slices that hold samples counted under another limit are read from their buckets.
        """
        self._limit_s = limit_s

    def record(self, value_s: float, now: float) -> None:
        """Add one latency sample ``value_s`` (seconds) observed at ``now`` (seconds)."""
        if self._slice_end is None or now >= self._slice_end:
            self._advance(now)
        index = _bucket(value_s)
        self._counts[self._current][index] += 1
        self._sums[self._current] += value_s
        self._note_range(index, index)
        self._note_exact(1, value_s, 1 if value_s <= self._limit_s else 0)

    def record_many(self, values_s: list[float], now: float, failed: int = 0) -> int:
        """Add several samples observed at ``now`` (one slice check for all of them);
        ``failed`` of them were errors, which never count as within the limit. Returns how
        many count as within it (at most the limit, less the errors, at least 0)."""
        if self._slice_end is None or now >= self._slice_end:
            self._advance(now)
        if not values_s:
            return 0
        counts = self._counts[self._current]
        indexes = [_bucket(value) for value in values_s]
        for index in indexes:
            counts[index] += 1
        self._sums[self._current] += sum(values_s)
        self._note_range(min(indexes), max(indexes))
        limit = self._limit_s
        within = max(0, sum(1 for v in values_s if v <= limit) - failed)
        self._note_exact(len(values_s), max(values_s), within)
        return within

    def record_since(self, arrivals_s: list[float], now: float, failed: int = 0) -> int:
        """Add the latencies ``now - a`` for the arrival times ``arrivals_s`` (seconds), which
        must be in non-decreasing order (a FIFO batch); ``failed`` of them were errors, which
        never count as within the limit. Returns how many count as within it (as
        :meth:`record_many`).

        Sorted arrivals have sorted latencies, so each bucket's share is found by bisection:
        the cost grows with the number of buckets the batch spans, not with its size.
        """
        if self._slice_end is None or now >= self._slice_end:
            self._advance(now)
        end = len(arrivals_s)  # arrivals_s[:end] are still to count; the latest has the least wait
        if not end:
            return 0
        counts = self._counts[self._current]
        log, top = math.log, _N_BUCKETS - 1
        lowest = index = _bucket(now - arrivals_s[-1])  # buckets are counted upwards from here
        while True:
            # the samples in this bucket are those below its upper bound: arrived after now - upper
            # (at least the latest one); a bisection only when the one before it is among them
            bound = now - _UPPER_S[index]
            if end > 1 and arrivals_s[end - 2] > bound:
                start = bisect_right(arrivals_s, bound, 0, end)
            else:
                start = end - 1
            counts[index] += end - start
            end = start
            if not end:
                break
            wait = now - arrivals_s[end - 1]  # _bucket(wait), inlined
            if wait <= MIN_S:
                index = 0
            else:
                index = int(log(wait * _INV_MIN_S) * _INV_LOG_GAMMA)
                if index > top:
                    index = top
        answered = len(arrivals_s)
        self._sums[self._current] += answered * now - sum(arrivals_s)
        self._note_range(lowest, index)
        # latency <= limit  <=>  arrived at or after now - limit
        limit = self._limit_s
        within = answered if limit == math.inf else answered - bisect_left(arrivals_s, now - limit)
        within = max(0, within - failed)
        self._note_exact(answered, now - arrivals_s[0], within)
        return within

    def _freeze(self, index: int) -> None:
        """Slice ``index`` takes no more samples: keep its counts of buckets low..high as an
        array, so readings add it up without converting it again."""
        first, last = self._low[index], self._high[index]
        counts = self._counts[index][first : last + 1] if last >= first else []
        self._frozen[index] = (first, np.asarray(counts, dtype=np.int64))

    def _note_range(self, low: int, high: int) -> None:
        """The current slice now holds buckets ``low..high`` too."""
        current = self._current
        if low < self._low[current]:
            self._low[current] = low
        if high > self._high[current]:
            self._high[current] = high

    def _note_exact(self, samples: int, largest_s: float, within: int) -> None:
        """The current slice took ``samples`` more, the largest ``largest_s``, ``within`` of
        them at or below the limit."""
        current = self._current
        if self._within_limit[current] != self._limit_s:  # a new limit (or a mixed slice)
            self._within_limit[current] = self._limit_s if self._sizes[current] == 0 else math.nan
        self._sizes[current] += samples
        self._within[current] += within
        if largest_s > self._max[current]:
            self._max[current] = largest_s

    def quantiles(self, now: float, span_s: float | None = None) -> Quantiles:
        """p50/p90/p95/p99/max/mean of the samples in the window ending at ``now``.

        ``span_s`` narrows the window to the most recent slices covering at least that many
        seconds (the controller looks at the last ~2 s; ``stats()`` at the whole window).
        """
        counts, low, slices = self._window_counts(now, span_s)
        cumulative = np.cumsum(counts)
        total = int(cumulative[-1]) if cumulative.size else 0
        if total == 0:
            nan = math.nan
            return Quantiles(0, nan, nan, nan, nan, nan, nan)
        ranks = np.ceil(_LISTED * total)
        indexes = np.searchsorted(cumulative, ranks, side="left")
        values_ms = _REPRESENTATIVE[indexes + low] * 1e3
        mean_ms = sum(self._sums[i] for i in slices) / total * 1e3
        largest_ms = self._largest_ms(slices)
        p50, p90, p95, p99, top = np.minimum(values_ms, largest_ms).tolist()
        top = largest_ms if largest_ms < math.inf else top
        return Quantiles(total, p50, p90, p95, p99, top, mean_ms)

    def _largest_ms(self, slices: list[int]) -> float:
        """The largest sample of ``slices``, ms (inf without a record of it)."""
        largest = max((self._max[i] for i in slices), default=-math.inf)
        return largest * 1e3 if largest > -math.inf else math.inf

    def quantile_ms(self, q: float, now: float, span_s: float | None = None) -> float:
        """Any quantile ``q`` in (0, 1] of the window (or its last ``span_s``), ms; NaN if empty."""
        if not 0.0 < q <= 1.0:
            raise ValueError(f"q must be in (0, 1], got {q!r}")
        counts, low, slices = self._window_counts(now, span_s)
        total = int(counts.sum())
        if total == 0:
            return math.nan
        index = int(np.searchsorted(np.cumsum(counts), math.ceil(q * total), side="left"))
        return min(float(_REPRESENTATIVE[index + low] * 1e3), self._largest_ms(slices))

    def count(self, now: float) -> int:
        """Samples in the window ending at ``now``."""
        counts, _, _ = self._window_counts(now, None)
        return int(counts.sum())

    def fraction_at_most(self, limit_s: float, now: float, span_s: float | None = None) -> float:
        """Share of the window's samples (or its last ``span_s``) at or below ``limit_s``
        seconds; NaN if the window is empty.

        Exact for slices recorded while :meth:`set_limit` held ``limit_s``; in other slices a
        sample counts as at most the limit when its bucket's reported value is (exact for
        samples more than 1 %, the bucket width, from the limit).
        """
        slices = self._live_slices(now, span_s)
        exact = [i for i in slices if self._within_limit[i] == limit_s]
        total = sum(self._sizes[i] for i in exact)
        within = sum(self._within[i] for i in exact)
        counts, low, _ = self._sum_counts([i for i in slices if i not in exact])
        total += int(counts.sum())
        if total == 0:
            return math.nan
        below = int(np.searchsorted(_REPRESENTATIVE, limit_s, side="right"))
        within += int(counts[: max(0, below - low)].sum())
        return min(within / total, 1.0)  # a reader racing a recording may see a count early

    def clear(self) -> None:
        """Drop every sample."""
        for counts in self._counts:
            counts[:] = [0] * _N_BUCKETS
        self._sums = [0.0] * self.slices
        self._low = [_N_BUCKETS] * self.slices
        self._high = [-1] * self.slices
        self._frozen = [None] * self.slices
        self._sizes = [0] * self.slices
        self._max = [-math.inf] * self.slices
        self._within = [0] * self.slices
        self._within_limit = [self._limit_s] * self.slices
        self._slice_end = None

    def _live_slices(self, now: float, span_s: float | None) -> list[int]:
        """The slices that hold the samples of the window (or its last ``span_s``) ending at
        ``now``, most recent first, found without moving the ring: those ``_advance(now)``
        would clear are left out."""
        wanted = self.slices
        if span_s is not None:
            wanted = min(self.slices, max(1, math.ceil(span_s / self._slice_s)))
        stale = self._steps_to(now)  # the newest `stale` slices of the window are still empty
        return [(self._current - k) % self.slices for k in range(wanted - stale)]

    def _steps_to(self, now: float) -> int:
        """How many slices ``_advance(now)`` would move the ring on (``slices``: all of it),
        by the same float arithmetic."""
        end = self._slice_end
        steps = 0
        if end is None:
            return steps
        while now >= end and steps < self.slices:
            end += self._slice_s
            steps += 1
        return steps

    def _window_counts(
        self, now: float, span_s: float | None
    ) -> tuple[np.ndarray[Any, np.dtype[np.int64]], int, list[int]]:
        """The counts of buckets ``low..high`` summed over the window's slices, ``low``, and the
        slices; every bucket outside that range is empty (all are when the array is empty)."""
        return self._sum_counts(self._live_slices(now, span_s))

    def _sum_counts(
        self, slices: list[int]
    ) -> tuple[np.ndarray[Any, np.dtype[np.int64]], int, list[int]]:
        """:meth:`_window_counts` of the given slices."""
        # each slice's range is read once, with its counts: another thread may be recording
        parts: list[tuple[int, np.ndarray[Any, np.dtype[np.int64]]]] = []
        current = self._current
        for i in slices:
            frozen = self._frozen[i] if i != current else None
            if frozen is None:
                first, last = self._low[i], self._high[i]
                if last < first:
                    continue
                frozen = (first, np.asarray(self._counts[i][first : last + 1], dtype=np.int64))
            if frozen[1].size:
                parts.append(frozen)
        if not parts:
            return np.zeros(0, dtype=np.int64), 0, slices
        low = min(first for first, _ in parts)
        high = max(first + part.size for first, part in parts)
        total: np.ndarray[Any, np.dtype[np.int64]] = np.zeros(high - low, dtype=np.int64)
        for first, part in parts:
            total[first - low : first - low + part.size] += part
        return total, low, slices

    def _advance(self, now: float) -> None:
        if self._slice_end is None:
            self._slice_end = now + self._slice_s
            return
        steps = 0
        while now >= self._slice_end and steps < self.slices:
            self._freeze(self._current)
            self._current = (self._current + 1) % self.slices
            self._frozen[self._current] = None
            self._counts[self._current] = [0] * _N_BUCKETS
            self._sums[self._current] = 0.0
            self._low[self._current] = _N_BUCKETS
            self._high[self._current] = -1
            self._sizes[self._current] = 0
            self._max[self._current] = -math.inf
            self._within[self._current] = 0
            self._within_limit[self._current] = self._limit_s

            self._slice_end += self._slice_s
            steps += 1
        if now >= self._slice_end:
            # idle for longer than the whole window: every slice is already empty
            skipped = math.floor((now - self._slice_end) / self._slice_s) + 1
            self._slice_end += skipped * self._slice_s


@dataclass(frozen=True, slots=True)
class HistogramSnapshot:
    """A cumulative histogram read at one moment, in the layout of a Prometheus histogram.

    Attributes:
        bounds: the finite upper bounds (``le``), increasing, in the histogram's unit.
        cumulative: ``cumulative[i]`` samples at or below ``bounds[i]``; one entry more than
            ``bounds``, the last (``+Inf``) being the number of samples.
        sum: the sum of the samples, in the histogram's unit.
    """

    bounds: tuple[float, ...]
    cumulative: tuple[int, ...]
    sum: float

    @property
    def count(self) -> int:
        """The number of samples (the ``+Inf`` bucket)."""
        return self.cumulative[-1]

    @property
    def per_bucket(self) -> tuple[int, ...]:
        """Samples in each bucket alone: ``(bounds[i-1], bounds[i]]``, then above the last
        bound (OpenTelemetry's ``bucket_counts``)."""
        previous = (0, *self.cumulative[:-1])
        return tuple(c - p for c, p in zip(self.cumulative, previous, strict=True))


def check_bounds(name: str, bounds: tuple[float, ...]) -> tuple[float, ...]:
    """``bounds`` as floats if they are finite and strictly increasing.

    Raises:
        ValueError: an empty, unsorted or non-finite sequence (the message names ``name``).
    """
    values = tuple(float(b) for b in bounds)
    if not values or not all(math.isfinite(b) for b in values):
        raise ValueError(f"{name} must be a non-empty sequence of finite numbers, got {bounds!r}")
    if any(b >= c for b, c in pairwise(values)):
        raise ValueError(f"{name} must be strictly increasing, got {bounds!r}")
    return values


class CumulativeHistogram:
    """Samples since creation, counted at fixed upper bounds: exact, never expiring.

    A sample ``x`` falls in the first bucket whose bound is ``>= x`` (Prometheus's ``le``), or
    in the overflow bucket above the last bound. The counts only grow, as a Prometheus
    histogram's must (rates are taken by the monitoring system).

    Args:
        bounds: the upper bounds, finite and strictly increasing (seconds for latencies).

    Raises:
        ValueError: empty, unsorted or non-finite ``bounds``.
    """

    __slots__ = ("_counts", "bounds", "sum")

    def __init__(self, bounds: tuple[float, ...] = LATENCY_BOUNDS_S) -> None:
        self.bounds = check_bounds("bounds", bounds)
        self._counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0

    def record(self, value: float) -> None:
        """Add one sample."""
        self._counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def record_many(self, values: list[float]) -> None:
        """Add several samples (one bisection each)."""
        counts, bounds = self._counts, self.bounds
        for value in values:
            counts[bisect_left(bounds, value)] += 1
        self.sum += sum(values)

    def record_since(self, arrivals_s: list[float], now: float) -> None:
        """Add the latencies ``now - a`` for the arrival times ``arrivals_s`` (seconds),
        non-decreasing (a FIFO batch). A latency is at most bound ``b`` exactly when its arrival
        is at or after ``now - b``, so each bucket's share is one bisection of the arrivals: the
        cost grows with the buckets the batch spans, not with its size."""
        total = len(arrivals_s)
        if not total:
            return
        bounds, counts = self.bounds, self._counts
        index = bisect_left(bounds, now - arrivals_s[-1])  # the bucket of the shortest latency
        counted = 0
        while counted < total and index < len(bounds):
            at_most = total - bisect_left(arrivals_s, now - bounds[index])
            counts[index] += at_most - counted
            counted = at_most
            index += 1
        counts[-1] += total - counted
        self.sum += total * now - sum(arrivals_s)

    def snapshot(self) -> HistogramSnapshot:
        """The counts so far, cumulative (``le``) as Prometheus exposes them."""
        counts = list(self._counts)  # one copy: consistent even if another thread records
        running = 0
        cumulative: list[int] = []
        for count in counts:
            running += count
            cumulative.append(running)
        return HistogramSnapshot(self.bounds, tuple(cumulative), self.sum)

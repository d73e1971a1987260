"""What a replay measured: per-request outcomes, summary metrics and time series."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from adaptive_batcher.metrics.recorder import Counts
from adaptive_batcher.slo import SLO

__all__ = ["Outcome", "Phase", "SimResult", "TimeSeries"]

FloatArray = np.ndarray[Any, np.dtype[np.float64]]


class Outcome:
    """Per-request outcome codes."""

    PENDING = 0
    OK = 1
    EXPIRED = 2
    REJECTED = 3
    FAILED = 4


@dataclass(frozen=True)
class TimeSeries:
    """Per-bin series for plots: bin start (s), arrivals/s, p99 latency (ms) of requests that
    arrived in the bin (NaN if none completed), goodput (req/s within SLO); and the controller's
    decisions as (time_s, window_ms, max_batch_size) rows."""

    bin_s: float
    start_s: FloatArray
    arrivals_rps: FloatArray
    p99_ms: FloatArray
    goodput_rps: FloatArray
    decisions: np.ndarray[Any, np.dtype[np.float64]]


@dataclass(frozen=True)
class Phase:
    """The requests that arrived in one time range of a replay (see :meth:`SimResult.phase`).

    Attributes:
        requests: how many arrived in it.
        slo_attainment: share of them answered within the SLO (NaN if none arrived).
        shed_fraction: share of them shed (expired: deadlines and SLO-aware shedding).
        p99_ms: 99th percentile latency of those answered, ms.
    """

    requests: int
    slo_attainment: float
    shed_fraction: float
    p99_ms: float


@dataclass(frozen=True)
class SimResult:
    """Summary of one replay. Latencies are end-to-end inside the batcher (queue + compute), ms.

    Attributes:
        name: label of the configuration.
        requests, completed, expired, rejected, failed: counts (completed = answered with a
            result).
        oom_errors: model calls that ran out of memory (a batch of several was split and
            re-run; a single item failed).
        duration_s: the time the rates divide by, s: the span from the first to the last
            arrival; when that span is 0 (a single request, or all arriving at one instant),
            the span from the first arrival to the last request's end (answer or error)
            instead, the time it took to serve them. NaN when that is 0 too, or without
            requests.
        p50_ms, p95_ms, p99_ms, mean_ms: latency of completed requests (exact, not sketched).
        slo_attainment: fraction of *all* requests answered within the SLO (rejected, expired
            and failed requests count as misses); NaN without an SLO. The simulator replays
            the batcher alone, so an answer is within the SLO when its latency is within
            ``latency_ms - preprocess_ms``.
        goodput_rps: requests answered within the SLO per second (all completed without SLO).
        throughput_rps: completed requests per second.
        power: throughput / mean latency (Kleinrock), req/s per s.
        mean_batch_size: items per model call.
        device_busy_s: device cost: the summed time of every model call (split and failed
            out-of-memory attempts included), seconds.
        device_ms_per_request: ``device_busy_s`` per completed request, ms.
        device_ms_per_good: ``device_busy_s`` per answer within the SLO, ms (the cost of what
            counts; inf when nothing was answered within the SLO).
        busy_fraction: share of slot time spent computing (including failed OOM attempts), from
            the first arrival to the last answer.
        series: per-second time series and controller decisions.
        latency_ms: latency of each completed request, ms, in request order; shape ``(completed,)``.
        calls: one row per model call ``(start_s, end_s, items, units)``, in the order the calls
            ended (an out-of-memory attempt is a call too); shape ``(calls, 4)``.
        arrival_s, done_s, outcome: per request (index = request id): arrival time, s; when it
            ended, s (NaN if it never did); its :class:`Outcome` code. Shape ``(requests,)``.
    """

    name: str
    requests: int
    completed: int
    expired: int
    rejected: int
    failed: int
    oom_errors: int
    duration_s: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    mean_ms: float
    slo_attainment: float
    goodput_rps: float
    throughput_rps: float
    power: float
    mean_batch_size: float
    device_busy_s: float
    device_ms_per_request: float
    device_ms_per_good: float
    busy_fraction: float
    series: TimeSeries = field(repr=False)
    latency_ms: FloatArray = field(repr=False)
    calls: FloatArray = field(repr=False, default_factory=lambda: np.empty((0, 4)))
    arrival_s: FloatArray = field(repr=False, default_factory=lambda: np.empty(0))
    done_s: FloatArray = field(repr=False, default_factory=lambda: np.empty(0))
    outcome: np.ndarray[Any, np.dtype[np.int8]] = field(
        repr=False, default_factory=lambda: np.empty(0, dtype=np.int8)
    )

    @property
    def lost(self) -> int:
        """Requests that ended with neither a result nor an explicit error (must be 0)."""
        return self.requests - self.completed - self.expired - self.rejected - self.failed

    def summary(self) -> dict[str, float | int | str]:
        """The scalar metrics as a flat dict (for tables and ``extra_info``)."""
        return {
            "name": self.name,
            "requests": self.requests,
            "completed": self.completed,
            "expired": self.expired,
            "rejected": self.rejected,
            "failed": self.failed,
            "oom_errors": self.oom_errors,
            "lost": self.lost,
            "p50_ms": round(self.p50_ms, 3),
            "p99_ms": round(self.p99_ms, 3),
            "slo_attainment": round(self.slo_attainment, 5),
            "goodput_rps": round(self.goodput_rps, 2),
            "throughput_rps": round(self.throughput_rps, 2),
            "mean_batch_size": round(self.mean_batch_size, 2),
            "device_busy_s": round(self.device_busy_s, 6),
            "device_ms_per_request": round(self.device_ms_per_request, 6),
            "device_ms_per_good": round(self.device_ms_per_good, 6),
            "busy_fraction": round(self.busy_fraction, 4),
        }

    @classmethod
    def build(
        cls,
        *,
        name: str,
        arrival_s: FloatArray,
        done_s: FloatArray,
        outcome: np.ndarray[Any, np.dtype[np.int8]],
        sizes: np.ndarray[Any, np.dtype[np.int64]],
        slo: SLO | None,
        counts: Counts,
        busy_s: float,
        decisions: list[tuple[float, float, int]],
        slots: int,
        bin_s: float = 1.0,
        calls: Sequence[tuple[float, float, int, int]] | FloatArray = (),
    ) -> SimResult:
        """Compute the metrics from per-request arrays (index = request id)."""
        del sizes
        ok = outcome == Outcome.OK
        latency_ms = (done_s[ok] - arrival_s[ok]) * 1e3
        requests = int(outcome.size)
        duration = _rate_span_s(arrival_s, done_s)
        limit_ms = _room_ms(slo)
        good = int(np.count_nonzero(latency_ms <= limit_ms))
        completed = int(np.count_nonzero(ok))
        p50, p95, p99 = _percentiles(latency_ms, (50, 95, 99))
        mean_ms = float(latency_ms.mean()) if latency_ms.size else math.nan
        throughput = completed / duration
        return cls(
            name=name,
            requests=requests,
            completed=completed,
            expired=int(np.count_nonzero(outcome == Outcome.EXPIRED)),
            rejected=int(np.count_nonzero(outcome == Outcome.REJECTED)),
            failed=int(np.count_nonzero(outcome == Outcome.FAILED)),
            oom_errors=counts.oom_errors,
            duration_s=duration,
            p50_ms=p50,
            p95_ms=p95,
            p99_ms=p99,
            mean_ms=mean_ms,
            slo_attainment=good / requests if slo is not None and requests else math.nan,
            goodput_rps=good / duration,
            throughput_rps=throughput,
            power=throughput / (mean_ms / 1e3) if mean_ms > 0 else math.nan,
            mean_batch_size=counts.mean_batch_size,
            device_busy_s=busy_s,
            device_ms_per_request=busy_s * 1e3 / completed if completed else math.nan,
            device_ms_per_good=busy_s * 1e3 / good if good else math.inf,
            busy_fraction=busy_s / (_span_s(arrival_s, done_s) * slots),
            series=_series(arrival_s, done_s, ok, limit_ms, decisions, bin_s),
            latency_ms=latency_ms,
            calls=np.asarray(calls, dtype=np.float64).reshape(-1, 4),
            arrival_s=arrival_s,
            done_s=done_s,
            outcome=outcome,
        )

    def phase(self, start_s: float, end_s: float, slo: SLO | None) -> Phase:
        """What happened to the requests that arrived in ``[start_s, end_s)``.

        Args:
            start_s: the arrival-time range's start, seconds (included).
            end_s: its end, seconds (excluded).
            slo: the SLO answers are judged against (None: every answer counts as good).
        """
        chosen = (self.arrival_s >= start_s) & (self.arrival_s < end_s)
        outcome = self.outcome[chosen]
        ok = outcome == Outcome.OK
        latency_ms = (self.done_s[chosen][ok] - self.arrival_s[chosen][ok]) * 1e3
        limit_ms = _room_ms(slo)
        requests = int(outcome.size)
        good = int(np.count_nonzero(latency_ms <= limit_ms))
        shed = int(np.count_nonzero(outcome == Outcome.EXPIRED))
        return Phase(
            requests=requests,
            slo_attainment=good / requests if requests else math.nan,
            shed_fraction=shed / requests if requests else math.nan,
            p99_ms=_percentiles(latency_ms, (99,))[0],
        )

    def recovery_time_s(self, after_s: float, limit_ms: float, hold_s: float = 5.0) -> float:
        """Seconds after ``after_s`` until the per-bin p99 stays <= ``limit_ms`` for ``hold_s``.

        NaN if it never settles. Bins are those of :attr:`series` (by arrival time).
        """
        series = self.series
        need = max(1, math.ceil(hold_s / series.bin_s))
        start = int(np.searchsorted(series.start_s, after_s, side="left"))
        p99 = series.p99_ms
        for index in range(start, len(p99) - need + 1):
            window = p99[index : index + need]
            if np.all(np.isnan(window) | (window <= limit_ms)):
                return max(0.0, float(series.start_s[index]) - after_s)
        return math.nan


def _rate_span_s(arrival_s: FloatArray, done_s: FloatArray) -> float:
    """The arrival span, s, or when it is 0 (one instant) the span to the last answer."""
    if arrival_s.size == 0:
        return math.nan
    arrival_span = float(arrival_s.max() - arrival_s.min())
    return arrival_span if arrival_span > 0 else _span_s(arrival_s, done_s)


def _span_s(arrival_s: FloatArray, done_s: FloatArray) -> float:
    """From the first arrival to the last answer, s (the time the device could have been busy)."""
    if arrival_s.size == 0:
        return math.nan
    last = np.nanmax(done_s) if np.any(~np.isnan(done_s)) else arrival_s.max()
    span = float(max(last, arrival_s.max()) - arrival_s.min())
    return span if span > 0 else math.nan


def _percentiles(values: FloatArray, qs: tuple[float, ...]) -> tuple[float, ...]:
    if values.size == 0:
        return tuple(math.nan for _ in qs)
    return tuple(float(v) for v in np.percentile(values, qs))


def _room_ms(slo: SLO | None) -> float:
    """The latency a replayed answer must be within, ms: the SLO's less its preprocessing (the
    simulator replays the batcher alone, whose share of the SLO that is); inf without an SLO."""
    return slo.room_ms if slo is not None else math.inf


def _series(
    arrival_s: FloatArray,
    done_s: FloatArray,
    ok: np.ndarray[Any, np.dtype[np.bool_]],
    limit_ms: float,
    decisions: list[tuple[float, float, int]],
    bin_s: float,
) -> TimeSeries:
    if arrival_s.size == 0:
        empty = np.empty(0)
        return TimeSeries(bin_s, empty, empty, empty, empty, np.empty((0, 3)))
    bins = np.floor(arrival_s / bin_s).astype(np.int64)
    n_bins = int(bins.max()) + 1
    arrivals: FloatArray = np.bincount(bins, minlength=n_bins).astype(np.float64) / bin_s
    latency_ms = (done_s - arrival_s) * 1e3
    good = ok & (latency_ms <= limit_ms)
    goodput: FloatArray = np.bincount(bins[good], minlength=n_bins).astype(np.float64) / bin_s
    p99 = np.full(n_bins, np.nan)
    ok_bins, ok_latency = bins[ok], latency_ms[ok]
    if np.any(ok_bins[1:] < ok_bins[:-1]):  # arrivals out of order (closed-loop clients)
        order = np.argsort(ok_bins, kind="stable")
        ok_bins, ok_latency = ok_bins[order], ok_latency[order]
    edges = np.searchsorted(ok_bins, np.arange(n_bins + 1))
    _fill_bin_percentiles(p99, ok_latency, edges, 99)
    decision_rows = np.asarray(decisions, dtype=float).reshape(-1, 3)
    starts: FloatArray = np.arange(n_bins, dtype=np.float64) * bin_s
    return TimeSeries(bin_s, starts, arrivals, p99, goodput, decision_rows)


def _fill_bin_percentiles(
    out: FloatArray, values: FloatArray, edges: np.ndarray[Any, np.dtype[np.intp]], q: float
) -> None:
    """``out[b] = np.percentile(values[edges[b]:edges[b + 1]], q)`` for every non-empty bin.

    Bins of equal length are stacked and done in one ``np.percentile(..., axis=1)`` call, which
    computes each row exactly as the call for that row alone does (the same partition and
    interpolation per row); an hour of one-second bins takes a few hundred calls, not 3600.
    """
    lengths = np.diff(edges)
    for length in np.unique(lengths[lengths > 0]).tolist():
        chosen = np.flatnonzero(lengths == length)
        rows = values[edges[chosen][:, None] + np.arange(length)]
        out[chosen] = np.percentile(rows, q, axis=1)

"""Observations on the per-request path: sliding-window latency quantiles, cumulative
histograms and counters."""

from adaptive_batcher.metrics.histogram import (
    CumulativeHistogram,
    HistogramSnapshot,
    Quantiles,
    SlidingHistogram,
)
from adaptive_batcher.metrics.recorder import BatchSample, Counts, Recorder

__all__ = [
    "BatchSample",
    "Counts",
    "CumulativeHistogram",
    "HistogramSnapshot",
    "Quantiles",
    "Recorder",
    "SlidingHistogram",
]

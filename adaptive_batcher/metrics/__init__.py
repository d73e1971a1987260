"""Observations on the per-request path: sliding-window latency quantiles and counters."""

from adaptive_batcher.metrics.histogram import Quantiles, SlidingHistogram
from adaptive_batcher.metrics.recorder import BatchSample, Counts, Recorder

__all__ = ["BatchSample", "Counts", "Quantiles", "Recorder", "SlidingHistogram"]

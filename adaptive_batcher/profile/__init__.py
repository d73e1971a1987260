"""The offline profiler: the practitioners' sweep -> knee -> safety margin method, as a tool.

1. :func:`profile_model` sweeps batch sizes on the real model and hardware (median / p99 batch
   latency, items/s, peak memory; stops at the first out-of-memory batch size), repeating each
   until its timings settle, and warns when they did not or when a larger batch ran measurably
   faster than a smaller one (:func:`noise_warnings`): ``ProfileResult.noisy``.
2. :func:`find_knee` finds the knee of the throughput curve (Kneedle, with a fallback).
3. :func:`recommend` keeps a safety margin (``window_fraction``, 80 % of the window that would
   fit) and checks the latency budget against an :class:`~adaptive_batcher.SLO`;
   :meth:`Recommendation.controller_bounds` turns it into the ``Bounds`` of a batcher.

Then :func:`write_profile` / :func:`load_profile` (JSON, also the simulator's service-time table),
:func:`markdown_report` and :func:`plot_profile` report it. ``adaptive-batcher profile`` runs all
of it from the command line.

Example::

    from adaptive_batcher import SLO
    from adaptive_batcher.profile import profile_model, recommend

    result = profile_model(model, lambda n: torch.randn(n, 256), max_batch_size=256)
    rec = recommend(result, SLO(latency_ms=50.0))
    print(rec.max_batch_size, rec.window_ms, rec.reasons)
    if rec.noisy:
        print(rec.noise_message, *rec.warnings, sep="\n")
"""

from __future__ import annotations

from adaptive_batcher.profile._devices import is_out_of_memory, resolve_device
from adaptive_batcher.profile.format import (
    SCHEMA,
    ProfileFormatError,
    load_profile,
    profile_to_dict,
    read_service_profile,
    write_profile,
)
from adaptive_batcher.profile.knee import FALLBACK_FRACTION, Knee, KneeMethod, find_knee
from adaptive_batcher.profile.noise import (
    DEFAULT_CV_THRESHOLD,
    MONOTONE_TOLERANCE,
    noise_warnings,
)
from adaptive_batcher.profile.plot import plot_profile
from adaptive_batcher.profile.recommend import (
    DEFAULT_WINDOW_FRACTION,
    Recommendation,
    controller_bounds,
    recommend,
)
from adaptive_batcher.profile.report import markdown_report, markdown_table
from adaptive_batcher.profile.result import ProfileResult, ProfileRow
from adaptive_batcher.profile.sweep import default_batch_sizes, profile_model

__all__ = [
    "DEFAULT_CV_THRESHOLD",
    "DEFAULT_WINDOW_FRACTION",
    "FALLBACK_FRACTION",
    "MONOTONE_TOLERANCE",
    "SCHEMA",
    "Knee",
    "KneeMethod",
    "ProfileFormatError",
    "ProfileResult",
    "ProfileRow",
    "Recommendation",
    "controller_bounds",
    "default_batch_sizes",
    "find_knee",
    "is_out_of_memory",
    "load_profile",
    "markdown_report",
    "markdown_table",
    "noise_warnings",
    "plot_profile",
    "profile_model",
    "profile_to_dict",
    "read_service_profile",
    "recommend",
    "resolve_device",
    "write_profile",
]

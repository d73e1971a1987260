"""Step 2 of the practitioners' method: find the knee of the throughput curve.

Past the knee, a larger batch buys little throughput and costs proportionally more latency
(resnet50 on an H200: 128 -> 14.6k img/s at 8.8 ms, 512 -> 15.9k img/s at 32 ms).

Method: Kneedle (V. Satopaa, J. Albrecht, D. Irwin, B. Raghavan, "Finding a 'Kneedle' in a
Haystack: Detecting Knee Points in System Behavior", ICDCS workshops 2011), via the ``kneed``
library (the ``cli`` extra; imported when a knee is sought), on throughput (items/s) against
log2(batch size), with ``curve="concave"`` and ``direction="increasing"``. The x axis is log2
because batch sizes are powers of two: evenly spaced points, as Kneedle's normalisation assumes.

A throughput curve against log2(batch) is usually S-shaped: convex while the device is
launch-bound (throughput doubles with the batch), concave once it saturates. Kneedle's difference
curve is 0 at both end points by construction, so on such a curve it reports a spurious "knee" at
the first point. We therefore run kneed with ``online=True`` (collect every knee), drop knees at
either end point, and keep the one with the largest difference value (Kneedle's knee is the
maximum of the difference curve).

Fallback, when fewer than 3 batch sizes were profiled or Kneedle finds no interior knee: the
smallest batch size whose throughput reaches ``fallback_fraction`` (default 90 %) of the maximum
measured.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Literal

import numpy as np

from adaptive_batcher._optional import require
from adaptive_batcher._validate import check_in_range, check_number
from adaptive_batcher.profile.result import ProfileResult, ProfileRow

__all__ = ["FALLBACK_FRACTION", "Knee", "KneeMethod", "find_knee"]

KneeMethod = Literal["kneedle", "fraction_of_max"]

FALLBACK_FRACTION: Final = 0.9
"""Fallback knee: the smallest batch size reaching this fraction of the maximum throughput."""


@dataclass(frozen=True, slots=True)
class Knee:
    """The knee of the throughput curve, and the measurements there.

    Attributes:
        batch_size: the knee's batch size (one of the profiled sizes).
        median_ms: median batch latency at the knee, ms.
        p99_ms: p99 batch latency at the knee, ms.
        items_per_s: throughput at the knee, items/s.
        method: ``"kneedle"`` (found by Kneedle) or ``"fraction_of_max"`` (the fallback).
    """

    batch_size: int
    median_ms: float
    p99_ms: float
    items_per_s: float
    method: KneeMethod

    @classmethod
    def at(cls, row: ProfileRow, method: KneeMethod) -> Knee:
        """The knee at a profiled row."""
        return cls(row.batch_size, row.median_ms, row.p99_ms, row.items_per_s, method)


def _kneedle_index(rows: Sequence[ProfileRow], sensitivity: float) -> int | None:
    """Index of the Kneedle knee among ``rows``, or None if there is no interior knee."""
    knee_locator = require("kneed", "find_knee (Kneedle)").KneeLocator
    x = np.log2(np.array([row.batch_size for row in rows], dtype=float))
    y = np.array([row.items_per_s for row in rows], dtype=float)
    if np.ptp(y) == 0.0:  # flat curve: normalisation would divide by zero
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # kneed warns "No knee/elbow found"
        locator = knee_locator(
            x, y, S=sensitivity, curve="concave", direction="increasing", online=True
        )
    best: int | None = None
    for knee_x in locator.all_knees:
        matches = np.flatnonzero(np.isclose(x, float(knee_x)))
        if matches.size == 0:
            continue
        index = int(matches[0])
        if index in (0, len(rows) - 1):
            continue  # end points: an artefact of the normalisation, not a knee
        if best is None or locator.y_difference[index] > locator.y_difference[best]:
            best = index
    return best


def find_knee(
    profile: ProfileResult | Sequence[ProfileRow],
    *,
    sensitivity: float = 1.0,
    fallback_fraction: float = FALLBACK_FRACTION,
) -> Knee:
    """The knee of the throughput curve (items/s vs batch size).

    See the module docstring for the method (Kneedle on log2 batch size, with the
    fraction-of-max fallback) and its sources.

    Args:
        profile: a sweep result, or its rows (strictly increasing batch sizes).
        sensitivity: Kneedle's ``S`` (> 0); 1.0 is the paper's recommendation for offline data.
        fallback_fraction: in (0, 1]; the fallback's fraction of the maximum throughput.

    Returns:
        The :class:`Knee`, always at a profiled batch size.

    Raises:
        TypeError: ``profile`` is neither a ProfileResult nor a sequence of ProfileRow.
        ValueError: no rows, rows not in strictly increasing batch size, or an argument out of
            range.
        ImportError: kneed is missing (``pip install "adaptive-batcher[cli]"``) and 3 or more
            rows were given (fewer never reach Kneedle).
    """
    if isinstance(profile, ProfileResult):
        rows: Sequence[ProfileRow] = profile.rows
    elif not isinstance(profile, Sequence):
        raise TypeError(
            "profile must be a ProfileResult or a sequence of ProfileRow, "
            f"got {type(profile).__name__}"
        )
    else:
        # ProfileResult validates types and ordering.
        rows = ProfileResult(tuple(profile), None, "", "", 1).rows
    if not rows:
        raise ValueError("cannot find a knee: the profile has no rows")
    check_number("sensitivity", sensitivity, 0.0, strict=True)
    fraction = check_in_range("fallback_fraction", fallback_fraction, 0.0, 1.0, open_low=True)

    if len(rows) >= 3:
        index = _kneedle_index(rows, sensitivity)
        if index is not None:
            return Knee.at(rows[index], "kneedle")
    peak = max(row.items_per_s for row in rows)
    threshold = fraction * peak
    for row in rows:
        if row.items_per_s >= threshold or math.isclose(row.items_per_s, threshold):
            return Knee.at(row, "fraction_of_max")
    raise AssertionError("unreachable: the maximum row reaches any fraction <= 1")

"""Is a sweep's latency curve trustworthy? Spread statistics of the timed calls, and the checks.

Two signs that timings measured the machine's load rather than the model:

- **a batch size whose timings did not settle**: its robust coefficient of variation stays above
  the threshold even after the most repeats allowed;
- **a latency curve that is not monotone beyond noise**: a larger batch measurably faster than a
  smaller one. Running more items cannot take less time unless the work itself changed (a
  different kernel, more threads), so the usual cause is contention: other processes, or more
  torch threads than free cores, slowing some batch sizes and not others (seen on a busy 2-core
  machine: batch 4 at 40 ms next to batch 8 at 0.52 ms; one torch thread gave a sane curve).

Spread statistics, of the timed calls at one batch size (at least 2, else None):

- ``cv``: sample standard deviation over the mean (the coefficient of variation);
- ``robust_cv``: ``1.4826 x MAD / median``, MAD the median absolute deviation from the median.
  1.4826 (= 1 / the standard normal's 75th percentile) makes the scaled MAD estimate the
  standard deviation of normally distributed data (F. R. Hampel, "The influence curve and its
  role in robust estimation", JASA 1974; P. J. Rousseeuw and C. Croux, "Alternatives to the
  median absolute deviation", JASA 1993), so the two are on the same scale. Unlike ``cv`` it
  ignores a minority of outliers (a few preempted calls), as the reported median does.

Because the sweep stops repeating once the robust CV is low, a batch size whose every call was
slowed alike (a burst of load that lasted its whole round) settles at the slow value; only the
comparison with the other batch sizes (the monotonicity check) can show it.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

from adaptive_batcher._validate import check_number

if TYPE_CHECKING:
    from adaptive_batcher._threads import TorchThreads
    from adaptive_batcher.profile.result import ProfileRow

__all__ = [
    "DEFAULT_CV_THRESHOLD",
    "MAD_TO_SD",
    "MONOTONE_TOLERANCE",
    "coefficient_of_variation",
    "noise_warnings",
    "robust_cv",
    "setup_warnings",
]

MAD_TO_SD: Final = 1.4826
"""Scales a median absolute deviation to a standard deviation for normal data (Hampel 1974)."""

DEFAULT_CV_THRESHOLD: Final = 0.1
"""A batch size is settled once its robust CV is at most this (10 %). A choice, not a measured
constant: loose enough for the calls of a quiet machine to settle in one round, tight enough that
timings spread by a tenth of their median are repeated; ``cv_threshold`` changes it."""

MONOTONE_TOLERANCE: Final = 0.05
"""A larger batch faster by less than this fraction of the smaller batch's median is not reported
as non-monotone, whatever the spread: launch-bound batch sizes take nearly the same time, and
their medians differ by a percent or two either way."""


def coefficient_of_variation(samples: Sequence[float]) -> float | None:
    """Sample standard deviation / mean of ``samples`` (durations, any unit); None with fewer
    than 2 samples or a mean that is not positive."""
    if len(samples) < 2:
        return None
    mean = statistics.fmean(samples)
    return statistics.stdev(samples) / mean if mean > 0 else None


def robust_cv(samples: Sequence[float]) -> float | None:
    """``MAD_TO_SD * MAD / median`` of ``samples`` (durations, any unit); None with fewer than 2
    samples or a median that is not positive."""
    if len(samples) < 2:
        return None
    median = statistics.median(samples)
    if median <= 0:
        return None
    mad = statistics.median(abs(x - median) for x in samples)
    return MAD_TO_SD * mad / median


def _spread_ms(row: ProfileRow) -> float:
    """The row's scaled MAD in ms; 0 when unknown (fewer than 2 calls, or an old profile)."""
    return 0.0 if row.robust_cv is None else row.robust_cv * row.median_ms


def _unsettled(rows: Sequence[ProfileRow], cv_threshold: float) -> list[str]:
    warnings = []
    for row in rows:
        if row.robust_cv is None or row.robust_cv <= cv_threshold:
            continue
        cv = "n/a" if row.cv is None else f"{row.cv:.1%}"
        calls = "" if row.repeats is None else f" after {row.repeats} timed calls"
        warnings.append(
            f"batch {row.batch_size}: timings did not settle: robust CV {row.robust_cv:.1%} "
            f"(CV {cv}){calls}, above the threshold of {cv_threshold:.1%}"
        )
    return warnings


def _not_monotone(rows: Sequence[ProfileRow]) -> list[str]:
    """One warning per row measurably faster than the slowest smaller batch size before it."""
    warnings = []
    slowest: ProfileRow | None = None
    for row in rows:
        if slowest is not None:
            gap_ms = slowest.median_ms - row.median_ms
            spread_ms = _spread_ms(slowest) + _spread_ms(row)
            if gap_ms > spread_ms and gap_ms > MONOTONE_TOLERANCE * slowest.median_ms:
                warnings.append(
                    f"latency not monotone: batch {row.batch_size} (median {row.median_ms:.3f} ms)"
                    f" is faster than batch {slowest.batch_size} (median "
                    f"{slowest.median_ms:.3f} ms) by {gap_ms:.3f} ms, more than the two rows' "
                    f"spread ({spread_ms:.3f} ms); a larger batch should not run faster"
                )
        if slowest is None or row.median_ms > slowest.median_ms:
            slowest = row
    return warnings


def noise_warnings(
    rows: Sequence[ProfileRow], *, cv_threshold: float = DEFAULT_CV_THRESHOLD
) -> tuple[str, ...]:
    """The signs of noise in a sweep's rows (see the module docstring); empty when none.

    First one warning per batch size whose ``robust_cv`` is above ``cv_threshold``, then one per
    batch size whose median is below that of a smaller batch size by more than the two rows'
    spread (their scaled MADs, ``robust_cv x median_ms``, added; 0 where unknown) and by more
    than :data:`MONOTONE_TOLERANCE` of the smaller one's median.

    Works on any rows, also those of a profile written before the spread was recorded (only the
    monotonicity check applies there, with a spread of 0).

    Args:
        rows: rows in strictly increasing batch size.
        cv_threshold: the robust CV above which a batch size counts as unsettled (> 0).

    Raises:
        TypeError, ValueError: ``cv_threshold`` is not a finite number > 0.
    """
    threshold = check_number("cv_threshold", cv_threshold, 0.0, strict=True)
    return (*_unsettled(rows, threshold), *_not_monotone(rows))


def setup_warnings(
    rows: Sequence[ProfileRow], threads: TorchThreads | None, cores: int | None
) -> tuple[str, ...]:
    """Warnings about how the sweep was run, not about what it measured: more torch intra-op
    threads than cores available, and batch sizes timed once (their spread is unknown)."""
    warnings = []
    if threads is not None and cores is not None and threads.intra_op > cores:
        warnings.append(
            f"torch uses {threads.intra_op} intra-op threads but this process may run on only "
            f"{cores} CPU core(s) (os.sched_getaffinity): the threads compete for the cores and "
            f"the timings get noisy; use at most {cores} (torch.set_num_threads, "
            "profile_model(torch_threads=...), adaptive-batcher profile --threads)"
        )
    once = [row.batch_size for row in rows if row.repeats == 1]
    if once:
        warnings.append(
            f"batch sizes {once} were timed once each: their spread is unknown, so noise "
            "cannot be detected there; allow at least 2 timed calls (max_repeats >= 2)"
        )
    return tuple(warnings)

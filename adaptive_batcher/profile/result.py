"""What a sweep measures: a row per batch size (:class:`ProfileRow`) and the whole outcome
(:class:`ProfileResult`), checked at construction. The sweep makes them; the noise checks, the
knee, the recommendation and the file format read them.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from adaptive_batcher._validate import (
    check_batch_time,
    check_bool,
    check_int,
    check_number,
    check_optional_int,
    check_str,
    check_strings,
)

__all__ = ["ProfileResult", "ProfileRow"]


@dataclass(frozen=True, slots=True)
class ProfileRow:
    """The measurements at one batch size.

    Attributes:
        batch_size: items per call (>= 1).
        median_ms: median wall-clock latency of one call, milliseconds (> 0, at most 1e8:
            ``MAX_SERVICE_S``, about 28 hours; so is ``p99_ms``).
        p99_ms: 99th percentile of the same samples, ms (>= ``median_ms``); computed with
            ``numpy.percentile`` (linear interpolation, Hyndman & Fan type 7).
        items_per_s: throughput, ``batch_size / median`` in items per second (> 0).
        peak_mem_bytes: peak memory in bytes (CUDA: allocator peak; CPU: growth of the process
            peak RSS since the sweep started), or None where it could not be read.
        repeats: timed calls the statistics are over (>= 1), or None (a profile written before
            it was recorded).
        cv: coefficient of variation of those calls, sample standard deviation / mean (>= 0), or
            None (fewer than 2 calls, or not recorded).
        robust_cv: ``1.4826 x MAD / median`` of those calls (>= 0; MAD: median absolute deviation
            from the median; on the scale of ``cv`` for normal data, but blind to a minority of
            outliers), or None (fewer than 2 calls, or not recorded). The sweep repeats a batch
            size until this is at most its ``cv_threshold``; see
            :mod:`adaptive_batcher.profile.noise`.

    Raises:
        TypeError, ValueError: on a field of the wrong type or out of range (message names it).
    """

    batch_size: int
    median_ms: float
    p99_ms: float
    items_per_s: float
    peak_mem_bytes: int | None = None
    repeats: int | None = None
    cv: float | None = None
    robust_cv: float | None = None

    def __post_init__(self) -> None:
        check_int("ProfileRow.batch_size", self.batch_size, 1)
        for name in ("median_ms", "p99_ms"):
            value = check_batch_time(f"ProfileRow.{name}", getattr(self, name), "ms", strict=True)
            object.__setattr__(self, name, value)
        value = check_number("ProfileRow.items_per_s", self.items_per_s, 0.0, strict=True)
        object.__setattr__(self, "items_per_s", value)
        check_optional_int("ProfileRow.peak_mem_bytes", self.peak_mem_bytes, 0)
        check_optional_int("ProfileRow.repeats", self.repeats, 1)
        for name in ("cv", "robust_cv"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, check_number(f"ProfileRow.{name}", value, 0.0))
        if self.p99_ms < self.median_ms:
            raise ValueError(
                f"ProfileRow.p99_ms ({self.p99_ms!r}) must be >= median_ms ({self.median_ms!r})"
            )


@dataclass(frozen=True, slots=True)
class ProfileResult:
    """The outcome of a sweep: one row per batch size measured, in ascending batch size.

    Attributes:
        rows: the measured rows, batch sizes strictly increasing (may be empty when the very
            first batch size ran out of memory).
        oom_batch_size: the batch size that ran out of memory and stopped the sweep, or None.
            Larger than every row's batch size.
        device: the device the sweep ran on, e.g. ``"cpu"`` or ``"cuda:0 (NVIDIA H200)"``.
        model_name: a name for the model (free text).
        repeats: timed calls per round at each batch size (>= 1); each row's ``repeats`` says
            how many were run in all.
        max_repeats: the most timed calls allowed per batch size (>= ``repeats``), or None (a
            profile written before it was recorded).
        cv_threshold: the robust CV a batch size had to reach to stop repeating (> 0), or None.
        torch_threads: ``torch.get_num_threads()`` during the sweep (intra-op threads), or None
            when torch was not in use (not imported) or not recorded.
        torch_interop_threads: ``torch.get_num_interop_threads()`` during the sweep, or None.
        available_cores: CPU cores the process could run on (``os.sched_getaffinity``, else
            ``os.cpu_count()``), or None.
        warnings: human-readable warnings about the sweep, stable wording: the noise checks of
            :func:`~adaptive_batcher.profile.noise.noise_warnings` first, then those about how it
            was run (more torch threads than cores, batch sizes timed once).
        noisy: True when the noise checks found a batch size that did not settle or a latency
            curve that is not monotone beyond noise: the timings then describe the machine's load
            as much as the model, and a recommendation from them is not reliable.

    Raises:
        TypeError, ValueError: on an inconsistent field (message names it).
    """

    rows: tuple[ProfileRow, ...]
    oom_batch_size: int | None
    device: str
    model_name: str
    repeats: int
    max_repeats: int | None = None
    cv_threshold: float | None = None
    torch_threads: int | None = None
    torch_interop_threads: int | None = None
    available_cores: int | None = None
    warnings: tuple[str, ...] = ()
    noisy: bool = False

    def __post_init__(self) -> None:
        rows = tuple(self.rows)
        object.__setattr__(self, "rows", rows)
        for i, row in enumerate(rows):
            if not isinstance(row, ProfileRow):
                raise TypeError(
                    f"ProfileResult.rows[{i}] must be a ProfileRow, got {type(row).__name__}"
                )
        sizes = [row.batch_size for row in rows]
        if any(b <= a for a, b in itertools.pairwise(sizes)):
            raise ValueError(
                f"ProfileResult.rows must have strictly increasing batch sizes, got {sizes}"
            )
        check_optional_int("ProfileResult.oom_batch_size", self.oom_batch_size, 1)
        if self.oom_batch_size is not None and sizes and self.oom_batch_size <= sizes[-1]:
            raise ValueError(
                f"ProfileResult.oom_batch_size ({self.oom_batch_size}) must be larger than "
                f"every profiled batch size (largest: {sizes[-1]})"
            )
        for name in ("device", "model_name"):
            check_str(f"ProfileResult.{name}", getattr(self, name))
        check_int("ProfileResult.repeats", self.repeats, 1)
        self._check_sweep_settings()

    def _check_sweep_settings(self) -> None:
        check_optional_int("ProfileResult.max_repeats", self.max_repeats, self.repeats)
        if self.cv_threshold is not None:
            threshold = check_number(
                "ProfileResult.cv_threshold", self.cv_threshold, 0.0, strict=True
            )
            object.__setattr__(self, "cv_threshold", threshold)
        for name in ("torch_threads", "torch_interop_threads", "available_cores"):
            check_optional_int(f"ProfileResult.{name}", getattr(self, name), 1)
        object.__setattr__(self, "warnings", check_strings("ProfileResult.warnings", self.warnings))
        object.__setattr__(self, "noisy", check_bool("ProfileResult.noisy", self.noisy))

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        """The profiled batch sizes, ascending."""
        return tuple(row.batch_size for row in self.rows)

    @property
    def max_items_per_s(self) -> float:
        """The highest throughput measured, items/s.

        Raises:
            ValueError: the result has no rows.
        """
        if not self.rows:
            raise ValueError("the profile has no rows")
        return max(row.items_per_s for row in self.rows)

    def row(self, batch_size: int) -> ProfileRow:
        """The row measured at ``batch_size``.

        Raises:
            KeyError: that batch size was not profiled (message lists those that were).
        """
        for row in self.rows:
            if row.batch_size == batch_size:
                return row
        raise KeyError(
            f"batch size {batch_size} was not profiled; profiled: {list(self.batch_sizes)}"
        )

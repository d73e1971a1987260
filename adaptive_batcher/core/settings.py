"""A batcher's settings, checked once, with the same names in production and in replay.

:class:`BatcherSettings` holds what ``AdaptiveBatcher`` takes besides the model and the
I/O-related arguments, and the simulator's :class:`~adaptive_batcher.sim.SimConfig` extends it,
so a setting has one name, one default, one check and one error message everywhere (the
preset loader reuses the same checks too). Every default lives here; this module imports no
runtime, simulator or policy code.

Rules that join the settings (each refused at construction with the message shown):

* ``max_batch_size`` is the **hard cap**: no decision, ``set_limits`` call or preset may exceed
  it, and a larger request is rejected with ``ItemTooLargeError``.
* ``bounds`` (the controller's range) must lie within it: ``bounds.max_batch_size`` <=
  ``max_batch_size``, and ``window_ms`` must lie in the bounds' window range.
* Without ``bounds`` the controller's range is window 0 to ``max(100, window_ms, the SLO's
  batcher budget)`` ms and cap 1 to ``max_batch_size``, on ``batch_sizes`` if given; with
  ``bounds`` but no buckets in them, the batcher's ``batch_sizes`` are used.
* ``batch_sizes`` must be strictly increasing and end at the cap: no bucket may exceed
  ``max_batch_size`` (a batch would be padded past the cap) and ``max_batch_size`` may not
  exceed the largest bucket (a full batch would have no bucket to pad to).
* ``shed_late`` needs an ``slo`` (and ``set_slo(None)`` is refused while it is on).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

from adaptive_batcher._validate import (
    MAX_SERVICE_S,
    check_batch_time,
    check_bool,
    check_callable,
    check_choice,
    check_int,
    check_number,
    check_optional_int,
    check_sequence,
)
from adaptive_batcher.control.policy import GuardFactory, Policy
from adaptive_batcher.control.slack import DEFAULT_MAX_SCALE
from adaptive_batcher.control.types import Bounds
from adaptive_batcher.core.buckets import check_buckets
from adaptive_batcher.slo import SLO, check_slo

__all__ = [
    "DEFAULT_CONTROL_INTERVAL_MS",
    "DEFAULT_MAX_BATCH_SIZE",
    "DEFAULT_MIN_WINDOW_RANGE_MS",
    "DEFAULT_WINDOW_MS",
    "EXECUTOR_KINDS",
    "SHED_LATE_NEEDS_SLO",
    "WINDOW_ORIGINS",
    "BatcherSettings",
    "GuardFactory",
    "ServiceProfile",
    "check_policy",
    "check_service_profile",
    "default_window_range_ms",
]

DEFAULT_MAX_BATCH_SIZE: Final = 32
"""Batch cap when none is given, units (Ray Serve's default is 10, Triton's none)."""

DEFAULT_WINDOW_MS: Final = 5.0
"""Window when none is given, ms."""

DEFAULT_CONTROL_INTERVAL_MS: Final = 250.0
"""Time between controller decisions, ms."""

DEFAULT_MIN_WINDOW_RANGE_MS: Final = 100.0
"""Without ``bounds``, the controller's window range reaches at least this far, ms."""

WINDOW_ORIGINS: Final = ("arrival", "slot_free")
"""Where a window counts from: the oldest request's arrival (ours), or a free slot (the
TorchServe-like baseline; see :class:`~adaptive_batcher.core.engine.BatchingEngine`)."""

EXECUTOR_KINDS: Final[tuple[str, ...]] = (
    "auto",
    "async",
    "inline",
    "thread",
    "adaptive",
    "cuda",
)
"""Where a model call runs: the runtime's ``executor`` argument (see
:func:`~adaptive_batcher.runtime.executors.make_executor`), which presets may name too."""

SHED_LATE_NEEDS_SLO: Final = "shed_late=True needs an slo: shedding is relative to the SLO"
"""Why ``shed_late`` without an ``slo`` is refused: at construction and by ``set_slo(None)``."""

ServiceProfile = str | os.PathLike[str] | Sequence[tuple[int, float]]
"""A profile JSON path (``adaptive-batcher profile``) or ``(batch_size, median_ms)`` rows."""


def default_window_range_ms(window_ms: float, slo: SLO | None) -> float:
    """The widest window the controller may choose when no bounds are given, ms: 100 ms, the
    starting window, or the SLO's batcher budget, whichever is widest. A window as long as the
    budget may pay where one batch takes a large share of it (a 50 ms decode step under a
    200 ms SLO: the cheapest static setting waits 100 ms, half window 0's device time)."""
    budget = slo.batcher_budget_ms if slo is not None else 0.0
    return max(DEFAULT_MIN_WINDOW_RANGE_MS, float(window_ms), budget)


@dataclass(frozen=True)
class BatcherSettings:
    """Everything that shapes batching and control, checked at construction.

    Attributes:
        max_batch_size: the hard cap, and the starting cap, in size units (>= 1).
        window_ms: the starting window, ms (>= 0).
        max_concurrent_batches: execution slots (>= 1).
        max_queue_size: most requests waiting beyond what the idle slots take next, a full
            batch each (>= 1); None: unbounded (see ``BatchingEngine``).
        batch_sizes: allowed batch sizes ("buckets"), strictly increasing, units; empty: any.
        slo: the latency objective (None: none; no controller unless a ``policy`` is given).
        policy: the control law (None: PID when an ``slo`` is set, else fixed settings). It
            holds its controller's state: give each batcher its own (a replay copies it).
        bounds: the controller's range (None: see the module docstring).
        guards: guard factories around the policy, innermost first (None: the default chain).
        control_interval_ms: time between controller decisions, ms (> 0).
        control_interval_batches: also decide after this many finished batches (>= 1; None:
            time only).
        service_profile: where the controller's service-time model starts: a profile JSON path
            or ``(batch_size, median_ms)`` rows (None: it learns from the first batches). Rows
            are checked at construction; a file is read by the shell that takes the settings
            (``AdaptiveBatcher``, ``SimConfig``: at their construction), never here.
        shed_late: fail at once the queued requests that can no longer meet the SLO.
        window_origin: ``"arrival"`` (default) or ``"slot_free"`` (a baseline only).
        window_slack: the most the window's planning budget may widen over the SLO's budget
            where the measured tail leaves room (>= 1; 1: the plan's bound alone; see
            :class:`~adaptive_batcher.control.slack.TailSlack`).

    Raises:
        TypeError: a setting of the wrong type (the message names it).
        ValueError: a setting out of range, or settings that contradict each other (see the
            module docstring; the message names them).
    """

    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE
    window_ms: float = DEFAULT_WINDOW_MS
    max_concurrent_batches: int = 1
    max_queue_size: int | None = None
    batch_sizes: Iterable[int] | None = None
    slo: SLO | None = None
    policy: Policy | None = None
    bounds: Bounds | None = None
    guards: Sequence[GuardFactory] | None = None
    control_interval_ms: float = DEFAULT_CONTROL_INTERVAL_MS
    control_interval_batches: int | None = None
    service_profile: ServiceProfile | None = None
    shed_late: bool = False
    window_origin: str = "arrival"
    window_slack: float = DEFAULT_MAX_SCALE

    def __post_init__(self) -> None:
        cap = check_int("max_batch_size", self.max_batch_size, 1)
        self._set("window_ms", check_number("window_ms", self.window_ms, 0.0))
        check_int("max_concurrent_batches", self.max_concurrent_batches, 1)
        check_optional_int("max_queue_size", self.max_queue_size, 1)
        self._set("batch_sizes", check_buckets(self.batch_sizes, cap) or None)
        check_slo(self.slo)
        if self.policy is not None:
            check_policy(self.policy)
        if self.bounds is not None and not isinstance(self.bounds, Bounds):
            raise TypeError(f"bounds must be a Bounds or None, got {type(self.bounds).__name__}")
        self._set("guards", _check_guards(self.guards))
        check_number("control_interval_ms", self.control_interval_ms, 0.0, strict=True)
        check_optional_int("control_interval_batches", self.control_interval_batches, 1)
        self._set("shed_late", check_bool("shed_late", self.shed_late))
        if self.shed_late and self.slo is None:
            raise ValueError(SHED_LATE_NEEDS_SLO)
        check_choice("window_origin", self.window_origin, WINDOW_ORIGINS)
        self._set("window_slack", check_number("window_slack", self.window_slack, 1.0))
        self._check_bounds(self.controller_bounds)
        if self.service_profile is not None:  # rows checked; a file is the shells' to read
            self._set("service_profile", check_service_profile(self.service_profile))

    def _set(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)  # a normalised value (e.g. a tuple for a list)

    @property
    def buckets(self) -> tuple[int, ...]:
        """``batch_sizes`` as a tuple (empty: any size)."""
        return tuple(self.batch_sizes or ())

    @property
    def controller_bounds(self) -> Bounds:
        """The range the controller keeps window and cap in (see the module docstring)."""
        if self.bounds is None:
            window_range = default_window_range_ms(self.window_ms, self.slo)
            return Bounds(0.0, window_range, 1, self.max_batch_size, self.buckets)
        if self.buckets and not self.bounds.batch_sizes:
            return replace(self.bounds, batch_sizes=self.buckets)
        return self.bounds

    @property
    def control_interval_s(self) -> float:
        """``control_interval_ms`` in seconds."""
        return self.control_interval_ms / 1e3

    def _check_bounds(self, bounds: Bounds) -> None:
        if bounds.max_batch_size > self.max_batch_size:
            raise ValueError(
                f"bounds.max_batch_size ({bounds.max_batch_size}) exceeds max_batch_size "
                f"({self.max_batch_size}), the hard cap: raise max_batch_size or lower the bounds"
            )
        if not bounds.min_window_ms <= self.window_ms <= bounds.max_window_ms:
            raise ValueError(
                f"window_ms ({self.window_ms:g}) must lie within the bounds' window range "
                f"[{bounds.min_window_ms:g}, {bounds.max_window_ms:g}]"
            )
        stray = [b for b in bounds.batch_sizes if self.buckets and b not in self.buckets]
        if stray:
            raise ValueError(
                f"bounds.batch_sizes {list(stray)} are not among batch_sizes {list(self.buckets)}"
            )

    def service_seed(self) -> tuple[tuple[int, float], ...]:
        """``(batch_size, median_ms)`` rows from ``service_profile`` (empty without one).

        Raises:
            TypeError: ``service_profile`` is a file path: the settings read no file, the
                shells do (``AdaptiveBatcher``, ``SimConfig``), with
                :func:`adaptive_batcher.profile.format.read_service_profile`.
        """
        profile = self.service_profile
        if profile is None:
            return ()
        if isinstance(profile, str | os.PathLike):
            raise TypeError(
                f"service_profile {os.fspath(profile)!r} is a file the settings do not read: "
                "read it first (adaptive_batcher.profile.format.read_service_profile)"
            )
        return tuple(profile)


def check_policy(policy: object) -> Policy:
    """``policy`` if it has ``decide()`` and ``reset()``, else TypeError."""
    if not (callable(getattr(policy, "decide", None)) and callable(getattr(policy, "reset", None))):
        raise TypeError(
            f"policy must be a Policy (with decide() and reset()), got {type(policy).__name__}"
        )
    return policy  # type: ignore[return-value]


def _check_guards(guards: object) -> tuple[GuardFactory, ...] | None:
    if guards is None:
        return None
    factories = check_sequence("guards", guards, "guard factories")  # a generator: kept whole
    return tuple(check_callable("each guard", guard) for guard in factories)


def check_service_profile(profile: object) -> ServiceProfile:
    """``profile`` as given if it is a file path (the shells read it), else its rows, checked,
    as a tuple.

    Raises:
        ValueError: rows that are not ``(int >= 1, number in (0, 1e8])`` pairs, median_ms at
            most ``MAX_SERVICE_S`` (the message names ``service_profile``), or no row.
        TypeError: neither a path nor a sequence of rows.
    """
    if isinstance(profile, str | os.PathLike):
        return profile
    if not isinstance(profile, Sequence):
        raise TypeError(
            "service_profile must be a profile JSON path or (batch_size, median_ms) rows, "
            f"got {type(profile).__name__}"
        )
    rows = tuple(_profile_row(row) for row in profile)
    if not rows:
        raise ValueError("service_profile needs at least one (batch_size, median_ms) row")
    return rows


def _profile_row(row: object) -> tuple[int, float]:
    problem = (
        "service_profile rows must be (batch_size: int >= 1, median_ms: number in "
        f"(0, {MAX_SERVICE_S * 1e3:g}]), got {row!r}"
    )
    if not isinstance(row, Sequence) or isinstance(row, str | bytes) or len(row) != 2:
        raise ValueError(problem)
    try:
        size = check_int("batch_size", row[0], 1)
        median = check_batch_time("median_ms", row[1], "ms", strict=True)
    except (TypeError, ValueError) as exc:
        raise ValueError(problem) from exc
    return size, median

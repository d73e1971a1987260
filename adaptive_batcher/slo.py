"""The latency objective a batcher is asked to meet, set in code."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NoReturn, Self

from adaptive_batcher._validate import check_real

__all__ = ["SLO", "SMALLEST_LATENCY_MS", "check_measurable"]

SMALLEST_LATENCY_MS = 0.001
"""The smallest latency target an SLO takes, ms: 1 us, the floor of the latency histograms
(:data:`adaptive_batcher.metrics.histogram.MIN_S`); below it nothing could be measured."""


def check_measurable(name: str, value_ms: float) -> None:
    """Refuse a latency target below ``SMALLEST_LATENCY_MS``.

    Raises:
        ValueError: ``value_ms`` below it (the message names ``name``).
    """
    if value_ms < SMALLEST_LATENCY_MS:
        raise ValueError(
            f"{name} must be at least {SMALLEST_LATENCY_MS} ms (1 us, the smallest latency the "
            f"histograms resolve), got {value_ms!r}"
        )


@dataclass(frozen=True, slots=True)
class SLO:
    """A latency service-level objective: ``percentile`` of end-to-end latency <= ``latency_ms``.

    End-to-end latency = queueing (the window) + preprocessing + compute. The controller aims
    below the target, leaving room for arrival fluctuations (the 80 % margin of the
    practitioners' sweep-knee-margin method; see docs/tuning.md): at ``margin * latency_ms``,
    or higher where two batches of one take a large share of the SLO, which the margin exempts
    by that share (docs/policies.md, "The margin").

    Attributes:
        latency_ms: the latency target at ``percentile``, ms (>= ``SMALLEST_LATENCY_MS``,
            1 us). ``SLO(latency_ms=50,
            percentile=95)`` means p95 <= 50 ms. (Named ``p99_ms`` before; that name read false
            for any other percentile and is refused with a TypeError saying so.)
        percentile: the percentile the target applies to, in [1, 100); 99 by default (below
            1 is refused: ``0.99`` is a quantile given where a percentile is meant).
        preprocess_ms: time spent per request outside the batcher (decode, tokenise), ms (>= 0,
            and below ``target_ms = margin * latency_ms``: the batcher needs time left); -0.0
            is stored as 0.0.
        margin: fraction of the target the controller aims at, at least, in (0, 1]: the
            online controller steers the batcher's latency (timed from submission) to
            ``margin * latency_ms - preprocess_ms`` plus ``(1 - margin) * room * share**2``
            at every tick (``room = latency_ms - preprocess_ms``, ``share`` = two batches of
            one over the room). Not the
            profiler's ``window_fraction`` (:func:`adaptive_batcher.profile.recommend`), which
            trims the recommended window once, offline, to a share of the slack left after
            compute.

    Every field takes any real number (ints, floats, numpy scalars; not bools) and is stored as
    a ``float``.

    Raises:
        TypeError: a field that is not a real number (message names the field), or the old
            keyword ``p99_ms`` (message names ``latency_ms``).
        ValueError: on a value out of range (message names the field), or a ``preprocess_ms``
            that leaves the batcher no time (>= ``target_ms``; message gives the figures).
    """

    latency_ms: float
    percentile: float = 99.0
    preprocess_ms: float = 0.0
    margin: float = 0.8

    # The old keyword gets a message naming the new one, not Python's "unexpected keyword".
    def __new__(cls, *args: Any, **kwargs: Any) -> Self:
        if "p99_ms" in kwargs:
            raise TypeError(
                "SLO.p99_ms was renamed latency_ms (the latency target at `percentile`, ms): "
                "write SLO(latency_ms=...)"
            )
        return object.__new__(cls)

    def __post_init__(self) -> None:
        for name in ("latency_ms", "percentile", "preprocess_ms", "margin"):
            object.__setattr__(self, name, check_real(f"SLO.{name}", getattr(self, name)))
        if not (math.isfinite(self.latency_ms) and self.latency_ms > 0):
            raise ValueError(f"SLO.latency_ms must be a finite number > 0, got {self.latency_ms!r}")
        check_measurable("SLO.latency_ms", self.latency_ms)
        if not 1.0 <= self.percentile < 100.0:
            message = f"SLO.percentile must be in [1, 100), got {self.percentile!r}"
            if 0.0 < self.percentile < 1.0:  # a quantile given for a percentile: p0.99 is no SLO
                message += (
                    f": for the {self.percentile * 100:g}th percentile write "
                    f"percentile={self.percentile * 100:g}"
                )
            raise ValueError(message)
        if not (math.isfinite(self.preprocess_ms) and self.preprocess_ms >= 0):
            raise ValueError(
                f"SLO.preprocess_ms must be a finite number >= 0, got {self.preprocess_ms!r}"
            )
        object.__setattr__(self, "preprocess_ms", self.preprocess_ms + 0.0)  # -0.0 -> 0.0
        if not 0.0 < self.margin <= 1.0:
            raise ValueError(f"SLO.margin must be in (0, 1], got {self.margin!r}")
        if self.preprocess_ms >= self.latency_ms:
            raise ValueError(
                f"SLO.preprocess_ms ({self.preprocess_ms}) must be below latency_ms "
                f"({self.latency_ms})"
            )
        left = self.target_ms - self.preprocess_ms
        if left <= 0:  # the controller's aim is all preprocessing: nothing left to steer
            raise ValueError(
                f"SLO.preprocess_ms ({self.preprocess_ms}) must be below target_ms = margin * "
                f"latency_ms ({self.margin} * {self.latency_ms} = {self.target_ms:g}): it leaves "
                f"{left:g} ms for the batcher"
            )

    @property
    def p99_ms(self) -> NoReturn:
        """The old name of :attr:`latency_ms`: reading it raises an AttributeError that says
        so (the name read false for any percentile but 99).

        Raises:
            AttributeError: always.
        """
        raise AttributeError(
            "SLO.p99_ms was renamed latency_ms (the latency target at `percentile`, ms)"
        )

    @property
    def quantile(self) -> float:
        """The percentile as a fraction in (0, 1)."""
        return self.percentile / 100.0

    @property
    def target_ms(self) -> float:
        """``margin * latency_ms``: the least latency the controller aims at (more where two
        batches of one are a large share of the SLO; docs/policies.md, "The margin")."""
        return self.margin * self.latency_ms

    @property
    def room_ms(self) -> float:
        """The most the batcher's queueing + compute may take: ``latency_ms - preprocess_ms``."""
        return self.latency_ms - self.preprocess_ms

    @property
    def batcher_budget_ms(self) -> float:
        """Time left for queueing + compute inside the batcher: ``target_ms - preprocess_ms``,
        > 0 (an SLO that leaves none is refused)."""
        return self.target_ms - self.preprocess_ms


def check_slo(value: object, name: str = "slo") -> SLO | None:
    """``value`` if it is an :class:`SLO` or None.

    Raises:
        TypeError: anything else (message names ``name`` and the type given).
    """
    if value is not None and not isinstance(value, SLO):
        raise TypeError(f"{name} must be an SLO or None, got {type(value).__name__}")
    return value

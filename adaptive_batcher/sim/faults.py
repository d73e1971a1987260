"""Faults that only real time has, replayed on the simulator's virtual clock.

A replay's service-time model says how long the device takes; these say what else happens to
the process around it (see ``docs/benchmarks.md``, "Faults in replay", for the real-time runs
they stand for):

- :class:`LoopStall`: the shell's event loop stands still (a blocking call in a handler, a
  large request body parsed on the loop, a garbage-collector pause). Nothing is taken in,
  dispatched, completed or timed until it ends.
- :class:`Slowdown`: the device runs slower for a span (CPU contention, torch threads
  fighting for cores, a throttled or shared device): a batch's work in it takes longer.
- :class:`LongBatch`: one batch takes longer, once (a cold shape, a pause in the model's thread).

:class:`Faults` is the schedule a :class:`~adaptive_batcher.sim.simulator.Simulator` is given.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass, field

from adaptive_batcher._validate import check_batch_time, check_number, check_sequence

__all__ = ["Fault", "Faults", "LongBatch", "LoopStall", "Slowdown"]


@dataclass(frozen=True)
class LoopStall:
    """The event loop stands still from ``at_s`` for ``duration_s`` seconds.

    A request that arrives meanwhile reaches the batcher when the stall ends (its latency in
    the result still counts from its arrival); a batch that ends meanwhile is seen to end when
    the stall ends, so its measured service time includes the rest of the stall, as the
    runtime measures it on the loop's clock; timers due meanwhile fire at the end. Closed-loop
    clients are taken to run on the stalled loop: they send again once it resumes.

    Raises:
        TypeError: an argument that is not a number.
        ValueError: ``at_s`` < 0, ``duration_s`` <= 0 or above ``MAX_SERVICE_S``.
    """

    at_s: float
    duration_s: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "at_s", check_number("LoopStall.at_s", self.at_s, 0.0))
        duration = check_batch_time("LoopStall.duration_s", self.duration_s, strict=True)
        object.__setattr__(self, "duration_s", duration)

    @property
    def end_s(self) -> float:
        """When the loop runs again, s."""
        return self.at_s + self.duration_s


@dataclass(frozen=True)
class Slowdown:
    """The device runs ``factor`` times slower in ``[at_s, at_s + duration_s)``: the part of a
    batch's work that falls in the span takes ``factor`` times as long, so a batch that starts
    before it slows on entering it and one still running at its end speeds up again; a batch
    that starts in the span also takes ``overhead_s`` more (dispatch under contention). Both
    are device time: they count in the device cost.

    Raises:
        TypeError: an argument that is not a number.
        ValueError: ``at_s`` < 0, ``duration_s`` <= 0, ``factor`` <= 0, ``overhead_s`` < 0
            (or a time above ``MAX_SERVICE_S``).
    """

    at_s: float
    duration_s: float
    factor: float = 1.0
    overhead_s: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "at_s", check_number("Slowdown.at_s", self.at_s, 0.0))
        duration = check_batch_time("Slowdown.duration_s", self.duration_s, strict=True)
        object.__setattr__(self, "duration_s", duration)
        factor = check_number("Slowdown.factor", self.factor, 0.0, strict=True)
        object.__setattr__(self, "factor", factor)
        overhead = check_batch_time("Slowdown.overhead_s", self.overhead_s)
        object.__setattr__(self, "overhead_s", overhead)

    @property
    def end_s(self) -> float:
        """When batches run at their own pace again, s."""
        return self.at_s + self.duration_s

    def applies(self, time_s: float) -> bool:
        """True while the device is slowed: ``at_s <= time_s < end_s``."""
        return self.at_s <= time_s < self.end_s


@dataclass(frozen=True)
class LongBatch:
    """The first batch that starts at or after ``at_s`` takes ``extra_s`` seconds longer.

    Raises:
        TypeError: an argument that is not a number.
        ValueError: ``at_s`` < 0, ``extra_s`` <= 0 or above ``MAX_SERVICE_S``.
    """

    at_s: float
    extra_s: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "at_s", check_number("LongBatch.at_s", self.at_s, 0.0))
        extra = check_batch_time("LongBatch.extra_s", self.extra_s, strict=True)
        object.__setattr__(self, "extra_s", extra)

    @property
    def end_s(self) -> float:
        """The earliest the long batch can end, s."""
        return self.at_s + self.extra_s


Fault = LoopStall | Slowdown | LongBatch


@dataclass(frozen=True)
class Faults:
    """The faults of one replay, in any order (overlapping stalls merge; overlapping
    slowdowns multiply).

    Raises:
        TypeError: ``faults`` not a sequence of :class:`LoopStall`, :class:`Slowdown` and
            :class:`LongBatch`.
    """

    faults: tuple[Fault, ...] = ()
    _stall_starts: tuple[float, ...] = field(init=False, repr=False, compare=False)
    _stall_ends: tuple[float, ...] = field(init=False, repr=False, compare=False)
    _slowdowns: tuple[Slowdown, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        faults = check_sequence("Faults.faults", self.faults, "faults")
        for i, fault in enumerate(faults):
            if not isinstance(fault, LoopStall | Slowdown | LongBatch):
                raise TypeError(
                    f"Faults.faults[{i}] must be a LoopStall, Slowdown or LongBatch, "
                    f"got {type(fault).__name__}"
                )
        object.__setattr__(self, "faults", faults)
        starts, ends = _merged([(f.at_s, f.end_s) for f in faults if isinstance(f, LoopStall)])
        object.__setattr__(self, "_stall_starts", starts)
        object.__setattr__(self, "_stall_ends", ends)
        object.__setattr__(self, "_slowdowns", tuple(f for f in faults if type(f) is Slowdown))

    def __bool__(self) -> bool:
        return bool(self.faults)

    @property
    def has_stalls(self) -> bool:
        """True when the schedule holds a loop stall."""
        return bool(self._stall_starts)

    @property
    def stalls(self) -> tuple[tuple[float, float], ...]:
        """The loop stalls as ``(start, end)`` spans, s, merged where they overlap, in order."""
        return tuple(zip(self._stall_starts, self._stall_ends, strict=True))

    @property
    def long_batches(self) -> tuple[LongBatch, ...]:
        """The one-off long batches, by their ``at_s``."""
        return tuple(sorted((f for f in self.faults if type(f) is LongBatch), key=_at))

    @property
    def end_s(self) -> float:
        """When the last fault is over, s (0 without faults)."""
        return max((f.end_s for f in self.faults), default=0.0)

    def seen_s(self, time_s: float) -> float:
        """When the shell sees an event due at ``time_s``: the end of the stall it falls in,
        else ``time_s`` itself."""
        index = bisect_right(self._stall_starts, time_s) - 1
        if index >= 0 and time_s < self._stall_ends[index]:
            return self._stall_ends[index]
        return time_s

    def service_s(self, start_s: float, service_s: float) -> float:
        """A batch's device time when it starts at ``start_s`` and would take ``service_s``
        at full speed: its work done at ``1 / factor`` speed while slowdowns run (overlapping
        ones multiply), plus the ``overhead_s`` of each slowdown it starts in (long batches
        are the simulator's to count)."""
        slowdowns = self._slowdowns
        if not slowdowns:
            return service_s
        overhead_s = sum(s.overhead_s for s in slowdowns if s.applies(start_s))
        edges = sorted({t for s in slowdowns for t in (s.at_s, s.end_s) if t > start_s})
        now_s, work_s, elapsed_s = start_s, service_s, overhead_s
        for edge_s in [*edges, math.inf]:
            factor = math.prod(s.factor for s in slowdowns if s.applies(now_s))
            if work_s * factor <= edge_s - now_s:
                return elapsed_s + work_s * factor
            work_s -= (edge_s - now_s) / factor
            elapsed_s += edge_s - now_s
            now_s = edge_s
        raise AssertionError("unreachable: the last span is unbounded")  # pragma: no cover


def _at(fault: LongBatch) -> float:
    return fault.at_s


def _merged(spans: list[tuple[float, float]]) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Overlapping or touching ``(start, end)`` spans merged, as sorted starts and ends."""
    starts: list[float] = []
    ends: list[float] = []
    for start, end in sorted(spans):
        if ends and start <= ends[-1]:
            ends[-1] = max(ends[-1], end)
        else:
            starts.append(start)
            ends.append(end)
    return tuple(starts), tuple(ends)

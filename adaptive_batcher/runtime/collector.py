"""The cyclic garbage collector and serving latency: measure its pauses, freeze the warm heap.

CPython frees most objects by reference counting. Its cyclic collector, which finds garbage held
in reference cycles, runs when the container objects allocated minus those freed since the last
collection pass generation 0's threshold (700 by default); every 10 generation-0 collections
make a generation-1 collection, and every 10 of those a full (generation-2) collection, which
CPython 3.11 runs only once the objects promoted into generation 2 since the last full
collection exceed 25 % of those already there (the heuristic in CPython's
``Modules/gcmodule.c``). A full collection traverses every tracked object of the process and
the event loop stands still meanwhile: with torch imported (about 170 thousand tracked objects)
one took 110-230 ms on the shared 2-core machine this project is developed on, long enough to
break a 60 ms p99.

:func:`freeze_after_warmup` is the standard remedy: ``gc.freeze()`` (Python 3.7+) moves every
object tracked at that moment into a permanent generation that later collections skip. Called
once the model is loaded and warmed up, it leaves future full collections only the objects
created since, so they take a few ms instead of a hundred. Instagram contributed it for their
Django fleet (bpo-31558, whose change description gives speeding up collection as a use besides
sharing memory after ``fork()``; Instagram Engineering, "Copy-on-write friendly Python garbage
collection", 2017, after "Dismissing Python Garbage Collection at Instagram", where they had
disabled the collector altogether). Frozen objects are still freed by reference counting; only
cycles among them are never collected, so the heap is collected once just before freezing.

:class:`GCPauseProbe` measures the pauses, per generation, with ``gc.callbacks``;
:class:`FullCollections` tells whether a stall of the event loop held a full collection.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass
from types import TracebackType
from typing import Any

__all__ = ["FREEZE_ADVICE", "FullCollections", "GCPause", "GCPauseProbe", "freeze_after_warmup"]


def freeze_after_warmup(*, collect: bool = True) -> int:
    """Freeze the heap as it is after model load and warm-up; returns the objects frozen.

    Runs a full collection first (``collect``: garbage frozen with the rest would never be
    collected), then ``gc.freeze()``: every object the collector tracks now moves into the
    permanent generation, which later collections skip. Call it once, after the model is
    loaded and warmed up and before taking traffic (``AdaptiveBatcher.warmup(...,
    freeze_gc=True)`` calls it); call it again after loading more long-lived state.
    ``gc.unfreeze()`` undoes it.

    Returns:
        ``gc.get_freeze_count()``: the objects in the permanent generation.
    """
    if collect:
        gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


FREEZE_ADVICE = (
    "a full garbage collection ran in the stall: freeze the warm heap once the model is loaded "
    "(warmup(..., freeze_gc=True) or freeze_after_warmup())"
)
"""The advice ``batcher.loop_stalled`` carries when a full collection ran in the stall and the
heap is not frozen."""


class FullCollections:
    """Counts the cyclic collector's full (generation-2) collections since a mark, from
    ``gc.get_stats()`` (no callback installed, nothing changed in the process): the shell marks
    it at each stall heartbeat, and a stall noted before the next mark held the collections
    counted. Source: CPython's ``gc.get_stats``, whose ``collections`` count every run of a
    generation, ``gc.collect()`` included."""

    def __init__(self) -> None:
        self._marked = _full_collections()

    def mark(self) -> None:
        """Count from now."""
        self._marked = _full_collections()

    def since_mark(self) -> dict[str, object]:
        """``{"full_gc": n}``, the full collections since the mark, with ``advice``
        (:data:`FREEZE_ADVICE`) when ``n > 0`` and nothing is frozen (``gc.freeze``)."""
        count = _full_collections() - self._marked
        context: dict[str, object] = {"full_gc": count}
        if count > 0 and gc.get_freeze_count() == 0:
            context["advice"] = FREEZE_ADVICE
        return context


def _full_collections() -> int:
    collections: int = gc.get_stats()[2]["collections"]
    return collections


@dataclass(frozen=True, slots=True)
class GCPause:
    """One collection: its generation (0, 1 or 2), when it started (``time.perf_counter()``
    seconds), how long it held the interpreter (ms), and the unreachable objects it found."""

    generation: int
    start_s: float
    duration_ms: float
    collected: int


class GCPauseProbe:
    """Records every collection of the cyclic collector while active (``gc.callbacks``).

    Use as a context manager (or :meth:`start` / :meth:`stop`); :attr:`pauses` holds one
    :class:`GCPause` per collection, in order. A collection runs in whichever thread triggers
    it, and holds the interpreter lock throughout: its duration is a pause of the event loop.

    Raises:
        RuntimeError: :meth:`start` on a probe already started.
    """

    def __init__(self) -> None:
        self.pauses: list[GCPause] = []
        self._started_s = 0.0
        self._active = False

    def start(self) -> None:
        """Begin recording (installs the callback)."""
        if self._active:
            raise RuntimeError("this GCPauseProbe is already started")
        self._active = True
        gc.callbacks.append(self._on_collection)

    def stop(self) -> None:
        """Stop recording (removes the callback); the pauses recorded stay."""
        if self._active:
            gc.callbacks.remove(self._on_collection)
            self._active = False

    def __enter__(self) -> GCPauseProbe:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def count(self, generation: int) -> int:
        """Collections of ``generation`` recorded."""
        return sum(1 for pause in self.pauses if pause.generation == generation)

    def durations_ms(self, generation: int) -> list[float]:
        """Pause durations of ``generation``'s collections, ms, in order."""
        return [p.duration_ms for p in self.pauses if p.generation == generation]

    def _on_collection(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started_s = time.perf_counter()
            return
        ended = time.perf_counter()
        self.pauses.append(
            GCPause(
                info["generation"],
                self._started_s,
                (ended - self._started_s) * 1e3,
                info["collected"],
            )
        )

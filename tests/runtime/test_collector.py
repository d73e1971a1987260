"""The garbage collector's pauses (GCPauseProbe) and the freeze after warm-up."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest
from structlog.testing import capture_logs

from adaptive_batcher import AdaptiveBatcher, GCPauseProbe, freeze_after_warmup
from adaptive_batcher.testing import EchoModel


@pytest.fixture
def unfrozen() -> Iterator[None]:
    """Leave the test process's collector as it was: nothing frozen."""
    gc.unfreeze()
    yield
    gc.unfreeze()


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


def garbage_cycle() -> weakref.ref[Node]:
    """Two objects that hold each other and nothing else: only the cyclic collector frees them."""
    a, b = Node(), Node()
    a.other, b.other = b, a
    return weakref.ref(a)


def test_freeze_collects_first_then_freezes_what_is_tracked(unfrozen: None) -> None:
    cycle = garbage_cycle()
    assert cycle() is not None
    live = [Node() for _ in range(100)]
    frozen = freeze_after_warmup()
    assert cycle() is None  # collected before the freeze, not frozen with the rest
    assert frozen == gc.get_freeze_count() >= len(live)
    assert all(gc.is_tracked(node) for node in live)


def test_freeze_without_collecting_keeps_garbage_frozen(unfrozen: None) -> None:
    cycle = garbage_cycle()
    freeze_after_warmup(collect=False)
    gc.collect()
    assert cycle() is not None  # the permanent generation is never collected
    gc.unfreeze()
    gc.collect()
    assert cycle() is None


async def test_warmup_can_freeze_the_heap(unfrozen: None) -> None:
    batcher = AdaptiveBatcher(EchoModel(), max_batch_size=4, window_ms=1)
    with capture_logs() as logs:
        await batcher.warmup(lambda: 0, freeze_gc=True)
    event = next(e for e in logs if e["event"] == "batcher.gc_frozen")
    # frozen objects freed by reference counting since then leave the permanent generation
    assert event["objects"] >= gc.get_freeze_count() > 0
    assert await batcher.submit(3) == 3
    await batcher.aclose()


async def test_warmup_does_not_freeze_by_default(unfrozen: None) -> None:
    batcher = AdaptiveBatcher(EchoModel(), max_batch_size=4, window_ms=1)
    await batcher.warmup(lambda: 0)
    assert gc.get_freeze_count() == 0
    await batcher.aclose()


async def test_warmup_freeze_gc_must_be_a_bool() -> None:
    batcher = AdaptiveBatcher(EchoModel(), max_batch_size=4, window_ms=1)
    with pytest.raises(TypeError, match="freeze_gc"):
        await batcher.warmup(lambda: 0, freeze_gc="yes")  # type: ignore[arg-type]
    await batcher.aclose()


def test_probe_records_each_collection_with_its_generation() -> None:
    with GCPauseProbe() as probe:
        garbage_cycle()
        gc.collect(1)
        gc.collect()
    assert [p.generation for p in probe.pauses][-2:] == [1, 2]
    full = probe.pauses[-1]
    assert full.duration_ms >= 0.0
    assert probe.count(2) >= 1
    assert probe.durations_ms(2)[-1] == full.duration_ms
    assert sum(p.collected for p in probe.pauses) >= 2  # the cycle's two nodes
    recorded = len(probe.pauses)
    gc.collect()
    assert len(probe.pauses) == recorded  # stopped: nothing recorded after the block


def test_probe_cannot_start_twice_and_stops_cleanly() -> None:
    probe = GCPauseProbe()
    probe.start()
    with pytest.raises(RuntimeError, match="already started"):
        probe.start()
    probe.stop()
    probe.stop()  # a second stop does nothing
    assert probe._on_collection not in gc.callbacks

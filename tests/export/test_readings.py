"""The library-neutral part: the metric table, the per-batch timings, the watch list."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from adaptive_batcher import AdaptiveBatcher
from adaptive_batcher.export.readings import (
    METRICS,
    BatchTimings,
    Watchlist,
    batch_size_histogram,
)
from adaptive_batcher.runtime.batcher import BatchRecord
from tests.export.helpers import model

DOCS = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def test_the_metrics_page_lists_every_metric_with_its_names_type_and_unit() -> None:
    rows = {}
    for line in DOCS.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if line.startswith("| `adaptive_batcher_") and len(cells) == 7:
            rows[cells[0].strip("`")] = cells
    assert set(rows) == {spec.name for spec in METRICS}
    for spec in METRICS:
        _, otel_name, kind, unit, labels, meaning, _ = rows[spec.name]
        exported = "(not exported)" if spec.name.endswith("request_latency_seconds") else None
        assert otel_name == (exported or f"`{spec.otel_name}`"), spec.name
        assert kind == spec.kind, spec.name
        assert unit == (spec.unit or "(none)"), spec.name
        assert re.findall(r"`(\w+)` =", labels) == list(spec.labels[1:]), spec.name
        assert meaning, spec.name


def test_names_follow_the_prometheus_conventions() -> None:
    for spec in METRICS:
        assert re.fullmatch(r"adaptive_batcher_[a-z_]+", spec.name), spec.name
        assert spec.name.endswith("_total") == (spec.kind == "counter"), spec.name
        assert (
            spec.name.endswith("_seconds")
            or spec.name.endswith("_seconds_total")
            or (spec.unit != "s")
        ), spec.name
        assert spec.labels[0] == "batcher"
    assert len({spec.name for spec in METRICS}) == len({spec.otel_name for spec in METRICS})


def test_the_batch_size_histogram_is_exact_at_its_bounds() -> None:
    snapshot = batch_size_histogram({1: 4, 3: 2, 4: 1, 40: 5, 2000: 1}, bounds=(1, 4, 32, 64))
    assert snapshot.cumulative == (4, 7, 7, 12, 13)
    assert snapshot.sum == 4 + 6 + 4 + 200 + 2000
    assert batch_size_histogram({}).count == 0


def test_batch_timings_count_each_batch() -> None:
    timings = BatchTimings(bounds_s=(0.001, 0.01))
    timings(BatchRecord(0, first_arrival_s=1.0, start_s=1.005, end_s=1.0055, items=3, units=3))
    timings(BatchRecord(1, first_arrival_s=2.0, start_s=2.0, end_s=2.02, items=1, units=1))
    queue_wait, execution = timings.snapshot()
    assert queue_wait.cumulative == (1, 2, 2)
    assert execution.cumulative == (1, 1, 2)
    assert execution.sum == pytest.approx(0.0205)
    with pytest.raises(ValueError, match="bounds_s must be strictly increasing"):
        BatchTimings(bounds_s=(0.1, 0.01))


def test_the_watch_list_adds_and_removes_its_listener() -> None:
    watchlist = Watchlist()
    batcher = AdaptiveBatcher(model, name="w")
    watchlist.add(batcher)
    assert batcher in watchlist and len(watchlist) == 1
    assert [r.name for r in watchlist.read()] == ["w"]
    watchlist.remove(batcher)
    assert batcher not in watchlist and watchlist.read() == []
    with pytest.raises(ValueError, match="not exported here"):
        watchlist.remove(batcher)
    with pytest.raises(ValueError, match="not exported here"):
        watchlist.remove(object())  # type: ignore[arg-type]

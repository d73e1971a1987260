"""Noise in a sweep: repeat until the timings settle, record the spread, warn on a curve that is
not monotone beyond noise, flag the recommendation; torch's thread counts. Fake clock throughout."""

from __future__ import annotations

import os
import statistics
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from structlog.testing import capture_logs

from adaptive_batcher.profile import (
    MONOTONE_TOLERANCE,
    ProfileResult,
    ProfileRow,
    noise_warnings,
    profile_model,
    recommend,
)
from tests.profile.fakes import FakeClock, FakeModel, make_list_batch

JITTER = (0.99, 1.0, 1.01)  # +-1 %: a robust CV of 1.5 %, well under the 10 % threshold


def jittered(base_ms: Callable[[int], float]) -> Callable[[int, int], float]:
    """``latency_ms(n, i)``: ``base_ms(n)`` times a +-1 % jitter cycling with the call index."""
    return lambda n, i: base_ms(n) * JITTER[i % len(JITTER)]


def _profile(clock: FakeClock, model: Any, **kwargs: Any) -> ProfileResult:
    kwargs.setdefault("progress", False)
    kwargs.setdefault("device", "cpu")
    kwargs.setdefault("warmup", 0)
    return profile_model(model, make_list_batch, timer=clock, **kwargs)


# what a busy 2-core machine produced: batch 4 at 40 ms next to batch 8 at 0.52 ms
CONTENDED_MS = {1: 0.2, 2: 0.3, 4: 40.0, 8: 0.52, 16: 1.0}


@pytest.fixture
def restore_torch_threads() -> Iterator[int]:
    """Start every test at 3 intra-op threads (so that 1 and 2 are changes), restore after."""
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    yield 3
    torch.set_num_threads(before)


# --- repeat until stable; the spread and the calls are recorded ---


def test_a_stable_batch_size_takes_one_round_and_records_its_spread(clock: FakeClock) -> None:
    model = FakeModel(clock, jittered(lambda n: float(n)))
    result = _profile(clock, model, batch_sizes=[1, 2, 4], repeats=6)

    samples = [JITTER[i % 3] for i in range(6)]  # batch 1, ms
    median = statistics.median(samples)
    mad = statistics.median(abs(x - median) for x in samples)
    for row in result.rows:
        assert row.repeats == 6
        assert row.cv == pytest.approx(statistics.stdev(samples) / statistics.fmean(samples))
        assert row.robust_cv == pytest.approx(1.4826 * mad / median)
    assert model.calls == [1] * 6 + [2] * 6 + [4] * 6
    assert result.warnings == ()
    assert result.noisy is False
    assert (result.repeats, result.max_repeats, result.cv_threshold) == (6, 30, 0.1)


def test_a_batch_size_that_never_settles_runs_max_repeats_and_is_a_warning(
    clock: FakeClock,
) -> None:
    def latency_ms(n: int, i: int) -> float:
        if n == 2:
            return 1.0 if i % 2 == 0 else 3.0  # bimodal: robust CV 74 %
        return float(n)

    model = FakeModel(clock, latency_ms)
    with capture_logs() as logs:
        result = _profile(clock, model, batch_sizes=[1, 2], repeats=4, max_repeats=12)

    one, two = result.rows
    assert one.repeats == 4 and two.repeats == 12
    assert model.calls.count(2) == 12
    assert two.robust_cv == pytest.approx(1.4826 * 1.0 / 2.0)
    assert result.noisy is True
    assert result.warnings == (
        "batch 2: timings did not settle: robust CV 74.1% (CV 52.2%) after 12 timed calls, "
        "above the threshold of 10.0%",
    )
    noisy = [entry for entry in logs if entry["event"] == "profile.noisy"]
    assert noisy == [
        {
            "event": "profile.noisy",
            "log_level": "warning",
            "model": "FakeModel",
            "warnings": list(result.warnings),
        }
    ]


def test_a_higher_threshold_accepts_the_same_timings(clock: FakeClock) -> None:
    model = FakeModel(clock, lambda n, i: 1.0 if i % 2 == 0 else 3.0)
    result = _profile(clock, model, batch_sizes=[1], repeats=4, cv_threshold=0.8)
    assert result.rows[0].repeats == 4
    assert result.noisy is False


def test_a_burst_in_the_first_round_is_outvoted_by_the_next_round(clock: FakeClock) -> None:
    def latency_ms(n: int, i: int) -> float:
        return 40.0 if i < 2 else JITTER[i % 3]  # the machine was busy for the first 2 calls

    result = _profile(clock, FakeModel(clock, latency_ms), batch_sizes=[1], repeats=4)
    row = result.rows[0]
    # after 4 calls half are slow (robust CV 141 %); after 8 the fast ones are the majority
    assert row.repeats == 8
    assert row.median_ms == pytest.approx(1.0, rel=0.01)  # the fast calls, +-1 %
    assert row.robust_cv is not None and row.robust_cv < 0.1
    assert row.cv is not None and row.cv > 1.0  # the plain CV still shows the burst
    assert result.noisy is False


def test_a_burst_over_a_whole_round_settles_there_and_only_the_curve_shows_it(
    clock: FakeClock,
) -> None:
    # consistent timings settle, however slow: a burst that covers every call of a batch size
    # is found only by comparing batch sizes
    def latency_ms(n: int, i: int) -> float:
        return 40.0 if n == 2 else float(n) * JITTER[i % 3]

    result = _profile(clock, FakeModel(clock, latency_ms), batch_sizes=[1, 2, 4], repeats=4)
    assert [row.repeats for row in result.rows] == [4, 4, 4]
    assert result.noisy is True
    assert [w.split(" (")[0] for w in result.warnings] == ["latency not monotone: batch 4"]


def test_one_call_gives_no_spread_so_a_second_round_runs(clock: FakeClock) -> None:
    model = FakeModel(clock, lambda n, i: 1.0)
    result = _profile(clock, model, batch_sizes=[1], repeats=1)
    assert result.rows[0].repeats == 2
    assert result.rows[0].cv == 0.0


def test_timed_once_is_a_warning_but_not_noise(clock: FakeClock) -> None:
    model = FakeModel(clock, lambda n, i: float(n))
    result = _profile(clock, model, batch_sizes=[1, 2], repeats=1, max_repeats=1)
    assert [(row.repeats, row.cv, row.robust_cv) for row in result.rows] == [(1, None, None)] * 2
    assert result.noisy is False
    assert result.warnings == (
        "batch sizes [1, 2] were timed once each: their spread is unknown, so noise cannot be "
        "detected there; allow at least 2 timed calls (max_repeats >= 2)",
    )


# --- a latency curve that is not monotone beyond noise ---


def test_a_larger_batch_measurably_faster_is_a_warning_and_flags_the_recommendation(
    clock: FakeClock,
) -> None:
    model = FakeModel(clock, jittered(lambda n: CONTENDED_MS[n]))
    with capture_logs() as logs:
        result = _profile(clock, model, batch_sizes=list(CONTENDED_MS), repeats=6)

    assert all(row.repeats == 6 for row in result.rows)  # each row settled on its own
    assert result.noisy is True
    assert len(result.warnings) == 2
    assert result.warnings[0].startswith(
        "latency not monotone: batch 8 (median 0.520 ms) is faster than batch 4 "
        "(median 40.000 ms) by 39.480 ms, more than the two rows' spread ("
    )
    assert result.warnings[0].endswith("ms); a larger batch should not run faster")
    assert result.warnings[1].startswith("latency not monotone: batch 16 (median 1.000 ms)")
    assert [e["warnings"] for e in logs if e["event"] == "profile.noisy"] == [list(result.warnings)]

    rec = recommend(result)
    assert rec.noisy is True
    assert rec.warnings == result.warnings
    assert rec.noise_message is not None
    assert rec.noise_message.startswith(
        f"recommendation NOT RELIABLE: cap {rec.max_batch_size} and window "
        f"{rec.window_ms:.2f} ms come from a noisy sweep"
    )


def test_a_stable_monotone_sweep_gives_an_unflagged_recommendation(clock: FakeClock) -> None:
    model = FakeModel(clock, jittered(lambda n: 1.0 + 0.1 * n))
    result = _profile(clock, model, max_batch_size=64, repeats=6)
    rec = recommend(result)
    assert result.noisy is False and rec.noisy is False
    assert rec.warnings == ()
    assert rec.noise_message is None


def _row(batch_size: int, median_ms: float, robust_cv: float | None) -> ProfileRow:
    return ProfileRow(
        batch_size, median_ms, median_ms * 1.2, batch_size / median_ms * 1e3, None,
        None if robust_cv is None else 20, robust_cv, robust_cv,
    )  # fmt: skip


def test_an_inversion_within_the_rows_spread_is_not_a_warning() -> None:
    # batch 2 is 9 % faster than batch 1: beyond the 5 % tolerance, but inside the spread
    # (1.0 + 0.73 ms) when the rows are noisy, outside it (0.1 + 0.09 ms) when they are not
    wide = [_row(1, 10.0, 0.10), _row(2, 9.1, 0.08)]
    narrow = [_row(1, 10.0, 0.01), _row(2, 9.1, 0.01)]
    assert noise_warnings(wide, cv_threshold=0.2) == ()
    assert noise_warnings(narrow) == (
        "latency not monotone: batch 2 (median 9.100 ms) is faster than batch 1 (median "
        "10.000 ms) by 0.900 ms, more than the two rows' spread (0.191 ms); a larger batch "
        "should not run faster",
    )


def test_a_dip_smaller_than_the_tolerance_is_not_a_warning() -> None:
    assert MONOTONE_TOLERANCE == 0.05
    flat = [_row(1, 4.0, 0.0), _row(2, 3.9, 0.0), _row(4, 3.85, 0.0)]  # launch-bound, -2.5 %
    assert noise_warnings(flat) == ()
    dip = [_row(1, 4.0, 0.0), _row(2, 3.7, 0.0)]  # -7.5 %
    assert len(noise_warnings(dip)) == 1


def test_each_row_is_compared_with_the_slowest_smaller_batch() -> None:
    # 1 -> 2 -> 4 each dips 4 % (under the tolerance), but batch 4 is 8 % under batch 1
    rows = [_row(1, 10.0, 0.0), _row(2, 9.6, 0.0), _row(4, 9.2, 0.0)]
    warnings = noise_warnings(rows)
    assert len(warnings) == 1
    assert warnings[0].startswith("latency not monotone: batch 4 (median 9.200 ms) is faster than "
                                  "batch 1")  # fmt: skip


def test_rows_without_a_recorded_spread_are_checked_with_a_spread_of_zero() -> None:
    old = [_row(1, 6.284, None), _row(2, 3.881, None)]  # resnet50 on an H200: 2 -> 4
    assert len(noise_warnings(old)) == 1
    assert noise_warnings(old[:1]) == ()


def test_noise_warnings_checks_its_threshold() -> None:
    with pytest.raises(ValueError, match=r"^cv_threshold must be a finite number > 0, got 0$"):
        noise_warnings([], cv_threshold=0)


# --- torch's threads ---


def test_torch_threads_are_set_for_the_sweep_and_restored(
    clock: FakeClock, restore_torch_threads: int
) -> None:
    seen: list[int] = []

    def model(batch: list[int]) -> list[int]:
        seen.append(torch.get_num_threads())
        clock.advance(1e-3)
        return batch

    result = _profile(clock, model, batch_sizes=[1, 2], repeats=2, torch_threads=1)
    assert set(seen) == {1}
    assert result.torch_threads == 1
    assert result.torch_interop_threads == torch.get_num_interop_threads()
    assert torch.get_num_threads() == restore_torch_threads


def test_torch_threads_are_reported_when_left_alone(
    clock: FakeClock, restore_torch_threads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    result = _profile(clock, FakeModel(clock, lambda n, i: 1.0), batch_sizes=[1], repeats=2)
    assert result.torch_threads == restore_torch_threads
    assert result.available_cores == 4
    assert result.warnings == ()


def test_more_torch_threads_than_cores_is_a_warning_but_not_noise(
    clock: FakeClock, restore_torch_threads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    with capture_logs() as logs:
        result = _profile(
            clock, FakeModel(clock, lambda n, i: 1.0), batch_sizes=[1], repeats=2
        )  # 3 threads
    assert result.available_cores == 2
    assert result.warnings == (
        "torch uses 3 intra-op threads but this process may run on only 2 CPU core(s) "
        "(os.sched_getaffinity): the threads compete for the cores and the timings get noisy; "
        "use at most 2 (torch.set_num_threads, profile_model(torch_threads=...), "
        "adaptive-batcher profile --threads)",
    )
    assert result.noisy is False
    events = [e for e in logs if e["event"] == "profile.threads_oversubscribed"]
    assert events == [
        {
            "event": "profile.threads_oversubscribed",
            "log_level": "warning",
            "model": "FakeModel",
            "torch_threads": 3,
            "available_cores": 2,
        }
    ]
    fixed = _profile(clock, FakeModel(clock, lambda n, i: 1.0), batch_sizes=[1], torch_threads=2)
    assert fixed.warnings == ()


def test_without_torch_no_threads_are_reported_and_none_can_be_set(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # as if torch were not installed
    result = _profile(clock, FakeModel(clock, lambda n, i: 1.0), batch_sizes=[1], repeats=2)
    assert (result.torch_threads, result.torch_interop_threads) == (None, None)
    with pytest.raises(RuntimeError) as info:
        _profile(clock, FakeModel(clock, lambda n, i: 1.0), batch_sizes=[1], torch_threads=2)
    assert str(info.value) == (
        "torch_threads=2 sets torch's thread count, but torch is not installed"
    )


# --- arguments and fields ---


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"repeats": 5, "max_repeats": 4}, ValueError, "max_repeats must be >= 5, got 4"),
        ({"max_repeats": 2.5}, TypeError, "max_repeats must be an int, got float"),
        ({"cv_threshold": 0}, ValueError, "cv_threshold must be a finite number > 0, got 0"),
        ({"cv_threshold": "x"}, TypeError, "cv_threshold must be a number, got str"),
        ({"torch_threads": 0}, ValueError, "torch_threads must be >= 1, got 0"),
    ],
)
def test_invalid_arguments(kwargs: dict[str, Any], error: type[Exception], message: str) -> None:
    with pytest.raises(error) as info:
        profile_model(lambda b: b, make_list_batch, progress=False, **kwargs)
    assert str(info.value) == message


def test_field_validation() -> None:
    with pytest.raises(ValueError, match=r"^ProfileRow.repeats must be >= 1, got 0$"):
        ProfileRow(1, 1.0, 1.0, 1000.0, None, 0)
    with pytest.raises(ValueError, match=r"^ProfileRow.cv must be a finite number >= 0"):
        ProfileRow(1, 1.0, 1.0, 1000.0, None, 2, -0.1)
    with pytest.raises(ValueError, match=r"^ProfileResult.max_repeats must be >= 5, got 4$"):
        ProfileResult((), None, "cpu", "m", 5, max_repeats=4)
    with pytest.raises(TypeError, match=r"^ProfileResult.warnings\[0\] must be a str, got int$"):
        ProfileResult((), None, "cpu", "m", 5, warnings=(3,))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^ProfileResult.noisy must be a bool, got int$"):
        ProfileResult((), None, "cpu", "m", 5, noisy=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^ProfileResult.torch_threads must be >= 1, got 0$"):
        ProfileResult((), None, "cpu", "m", 5, torch_threads=0)

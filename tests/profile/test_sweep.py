"""profile_model on the CPU path, driven by a fake clock and a fake model."""

from __future__ import annotations

import sys
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import structlog
import torch
from structlog.testing import capture_logs

from adaptive_batcher.profile import (
    ProfileResult,
    ProfileRow,
    _devices,
    default_batch_sizes,
    is_out_of_memory,
    profile_model,
)
from tests.profile.fakes import FakeClock, FakeModel, make_list_batch

# Timed-call latencies (ms) at batch size 1, in call order; batch n takes n times as long.
TIMED_MS = [5.0, 1.0, 3.0, 2.0, 4.0]
WARMUP_MS = 1000.0  # warm-up calls are slow; they must not show in any statistic


def _latency(warmup: int) -> Any:
    def latency_ms(n: int, index: int) -> float:
        if index < warmup:
            return WARMUP_MS
        return n * TIMED_MS[index - warmup]

    return latency_ms


def _profile(clock: FakeClock, model: Any, **kwargs: Any) -> ProfileResult:
    kwargs.setdefault("progress", False)
    kwargs.setdefault("device", "cpu")
    return profile_model(model, make_list_batch, timer=clock, **kwargs)


def test_median_p99_and_throughput_are_computed_from_the_timed_calls(clock: FakeClock) -> None:
    model = FakeModel(clock, _latency(warmup=2))
    # one round: TIMED_MS has a robust CV of 49 %, which would make the sweep repeat
    result = _profile(clock, model, batch_sizes=[1, 4], repeats=5, max_repeats=5, warmup=2)

    assert result.batch_sizes == (1, 4)
    one, four = result.rows
    assert one.median_ms == pytest.approx(3.0, rel=1e-9)
    # numpy.percentile, linear: 4 + 0.96 * (5 - 4)
    assert one.p99_ms == pytest.approx(4.96, rel=1e-9)
    assert one.items_per_s == pytest.approx(1 / 0.003, rel=1e-9)
    assert four.median_ms == pytest.approx(12.0, rel=1e-9)
    assert four.p99_ms == pytest.approx(19.84, rel=1e-9)
    assert four.items_per_s == pytest.approx(4 / 0.012, rel=1e-9)
    assert one.p99_ms == pytest.approx(float(np.percentile(TIMED_MS, 99)), rel=1e-9)


def test_warmup_calls_run_first_and_are_not_timed(clock: FakeClock) -> None:
    model = FakeModel(clock, _latency(warmup=3))
    batches: list[int] = []

    def make_batch(n: int) -> list[int]:
        batches.append(n)
        return list(range(n))

    result = profile_model(
        model,
        make_batch,
        batch_sizes=[2, 8],
        repeats=5,
        max_repeats=5,  # one round (TIMED_MS does not settle)
        warmup=3,
        device="cpu",
        progress=False,
        timer=clock,
    )
    assert model.calls == [2] * 8 + [8] * 8
    assert batches == [2, 8]  # one batch per size, built outside the timing
    assert max(row.p99_ms for row in result.rows) < WARMUP_MS


def test_result_metadata(clock: FakeClock) -> None:
    model = FakeModel(clock, lambda n, i: 1.0)
    result = _profile(clock, model, batch_sizes=[1], repeats=4, warmup=0, model_name="m")
    assert result.device == "cpu"
    assert result.model_name == "m"
    assert result.repeats == 4
    assert result.oom_batch_size is None
    assert model.calls == [1, 1, 1, 1]


def test_model_name_defaults_to_the_callable_qualname(clock: FakeClock) -> None:
    def my_model(batch: list[int]) -> list[int]:
        clock.advance(0.001)
        return batch

    result = _profile(clock, my_model, batch_sizes=[1], repeats=1, warmup=0)
    assert result.model_name.endswith("my_model")
    result = _profile(clock, FakeModel(clock, lambda n, i: 1.0), batch_sizes=[1], repeats=1)
    assert result.model_name == "FakeModel"


def test_default_batch_sizes_are_powers_of_two_up_to_the_max(clock: FakeClock) -> None:
    assert default_batch_sizes() == (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
    assert default_batch_sizes(100) == (1, 2, 4, 8, 16, 32, 64)
    assert default_batch_sizes(1) == (1,)
    model = FakeModel(clock, lambda n, i: 1.0)
    result = _profile(clock, model, max_batch_size=8, repeats=1, max_repeats=1, warmup=0)
    assert result.batch_sizes == (1, 2, 4, 8)
    assert model.calls == [1, 2, 4, 8]


def test_batch_sizes_are_sorted_and_deduplicated(clock: FakeClock) -> None:
    model = FakeModel(clock, lambda n, i: 1.0)
    result = _profile(clock, model, batch_sizes=[8, 2, 8, 1], repeats=1, warmup=0)
    assert result.batch_sizes == (1, 2, 8)


@pytest.mark.parametrize(
    "error",
    [
        torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
        MemoryError(),
        RuntimeError("[enforce fail] DefaultCPUAllocator: can't allocate: out of memory"),
    ],
    ids=["torch.OutOfMemoryError", "MemoryError", "RuntimeError"],
)
def test_stops_at_the_first_out_of_memory_batch_and_keeps_earlier_rows(
    clock: FakeClock, error: BaseException
) -> None:
    model = FakeModel(clock, lambda n, i: float(n), fail_at={64: error, 128: error})
    with capture_logs() as logs:
        result = _profile(clock, model, max_batch_size=256, repeats=2, warmup=1)

    assert result.batch_sizes == (1, 2, 4, 8, 16, 32)
    assert result.oom_batch_size == 64
    assert 128 not in model.calls and 256 not in model.calls
    assert result.rows[-1].median_ms == pytest.approx(32.0)
    oom = [entry for entry in logs if entry["event"] == "profile.oom"]
    assert oom == [
        {"event": "profile.oom", "log_level": "warning", "batch_size": 64, "error": repr(error)}
    ]


def test_out_of_memory_while_building_the_batch_also_stops(clock: FakeClock) -> None:
    model = FakeModel(clock, lambda n, i: 1.0)

    def make_batch(n: int) -> list[int]:
        if n >= 4:
            raise MemoryError
        return list(range(n))

    result = profile_model(
        model, make_batch, batch_sizes=[1, 2, 4, 8], repeats=1, device="cpu", progress=False,
        timer=clock,
    )  # fmt: skip
    assert result.batch_sizes == (1, 2)
    assert result.oom_batch_size == 4


def test_out_of_memory_at_the_first_size_gives_no_rows(clock: FakeClock) -> None:
    model = FakeModel(clock, lambda n, i: 1.0, fail_at={1: MemoryError()})
    result = _profile(clock, model, batch_sizes=[1, 2], repeats=1)
    assert result.rows == ()
    assert result.oom_batch_size == 1


def test_other_errors_from_the_model_propagate(clock: FakeClock) -> None:
    model = FakeModel(clock, lambda n, i: 1.0, fail_at={4: RuntimeError("shape mismatch")})
    with pytest.raises(RuntimeError, match="shape mismatch"):
        _profile(clock, model, batch_sizes=[1, 4], repeats=1)


def test_is_out_of_memory() -> None:
    assert is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory"))
    assert is_out_of_memory(MemoryError())
    assert is_out_of_memory(RuntimeError("CUDA error: out of memory"))
    assert is_out_of_memory(RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried"))
    assert not is_out_of_memory(RuntimeError("size mismatch"))
    assert not is_out_of_memory(ValueError("out of memory"))


def test_zero_latency_timer_is_an_error(clock: FakeClock) -> None:
    model = FakeModel(clock, lambda n, i: 0.0)
    with pytest.raises(RuntimeError) as info:
        _profile(clock, model, batch_sizes=[2], repeats=3)
    assert str(info.value) == (
        "batch size 2: median latency is 0.0 s; the timer must be monotonic with "
        "sub-millisecond resolution (time.perf_counter is)"
    )


def test_logs_one_event_per_batch_size(clock: FakeClock) -> None:
    model = FakeModel(clock, lambda n, i: 2.0 * n)
    with capture_logs() as logs:
        _profile(clock, model, batch_sizes=[1, 2], repeats=1, warmup=0, model_name="m")
    done = [entry for entry in logs if entry["event"] == "profile.batch_size_done"]
    assert [entry["batch_size"] for entry in done] == [1, 2]
    assert done[1]["median_ms"] == pytest.approx(4.0)
    assert done[1]["items_per_s"] == pytest.approx(500.0)
    assert set(done[0]) >= {"median_ms", "p99_ms", "items_per_s", "peak_mem_bytes"}
    events = [entry["event"] for entry in logs]
    assert events[0] == "profile.started"
    assert events[-1] == "profile.finished"


def test_the_library_never_configures_logging(
    clock: FakeClock, capsys: pytest.CaptureFixture[str]
) -> None:
    _profile(clock, FakeModel(clock, lambda n, i: 1.0), batch_sizes=[1], repeats=1)
    assert not structlog.is_configured()


def test_progress_bar_goes_to_stderr(clock: FakeClock, capsys: pytest.CaptureFixture[str]) -> None:
    model = FakeModel(clock, lambda n, i: 1.0)
    _profile(clock, model, batch_sizes=[1, 2], repeats=1, progress=True)
    captured = capsys.readouterr()
    assert "profiled 2 batch sizes" in captured.err
    assert "2/2" in captured.err
    assert "2/2" not in captured.out


def test_no_progress_bar_when_disabled(
    clock: FakeClock, capsys: pytest.CaptureFixture[str]
) -> None:
    model = FakeModel(clock, lambda n, i: 1.0)
    _profile(clock, model, batch_sizes=[1, 2], repeats=1, progress=False)
    assert "profiled" not in capsys.readouterr().err


def test_cpu_peak_memory_is_the_growth_of_ru_maxrss_since_the_sweep_started(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    import resource

    readings_kib = iter([1000, 1000, 1500, 1200])  # baseline, then one reading per batch size

    def getrusage(who: int) -> SimpleNamespace:
        assert who == resource.RUSAGE_SELF
        return SimpleNamespace(ru_maxrss=next(readings_kib))

    monkeypatch.setattr(resource, "getrusage", getrusage)
    monkeypatch.setattr(sys, "platform", "linux")  # Linux reports KiB
    model = FakeModel(clock, lambda n, i: 1.0)
    result = _profile(clock, model, batch_sizes=[1, 2, 4], repeats=1)
    assert [row.peak_mem_bytes for row in result.rows] == [0, 500 * 1024, 200 * 1024]


def test_ru_maxrss_is_bytes_on_macos(monkeypatch: pytest.MonkeyPatch) -> None:
    import resource

    monkeypatch.setattr(resource, "getrusage", lambda who: SimpleNamespace(ru_maxrss=4096))
    monkeypatch.setattr(sys, "platform", "darwin")
    assert _devices._ru_maxrss_bytes() == 4096


def test_cpu_peak_memory_is_measured_for_real(clock: FakeClock) -> None:
    def allocating_model(batch: list[int]) -> int:
        clock.advance(0.001)
        block = bytearray(len(batch) * 1024 * 1024)  # zero-filled: really resident
        return len(block)

    result = _profile(clock, allocating_model, batch_sizes=[1, 64], repeats=1, warmup=0)
    one, sixty_four = (row.peak_mem_bytes for row in result.rows)
    assert isinstance(one, int) and isinstance(sixty_four, int)
    assert 0 <= one <= sixty_four  # a high-water mark over a fixed baseline never falls


def test_no_peak_memory_without_the_resource_module(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "resource", None)  # as on Windows: import fails
    result = _profile(clock, FakeModel(clock, lambda n, i: 1.0), batch_sizes=[1], repeats=1)
    assert result.rows[0].peak_mem_bytes is None


# --- argument validation: exact messages ---


def _ok_model(batch: Any) -> Any:
    return batch


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"model": 3}, TypeError, "model must be callable, got int"),
        ({"make_batch": "x"}, TypeError, "make_batch must be callable, got str"),
        (
            {"batch_sizes": []},
            ValueError,
            "batch_sizes must be a non-empty sequence of ints, got []",
        ),
        ({"batch_sizes": [1, 0]}, ValueError, "batch_sizes[1] must be >= 1, got 0"),
        ({"batch_sizes": [1.0]}, TypeError, "batch_sizes[0] must be an int, got float"),
        ({"batch_sizes": "1,2"}, TypeError, "batch_sizes must be a sequence of ints, got str"),
        ({"batch_sizes": 4}, TypeError, "batch_sizes must be a sequence of ints, got int"),
        ({"max_batch_size": 0}, ValueError, "max_batch_size must be >= 1, got 0"),
        ({"max_batch_size": True}, TypeError, "max_batch_size must be an int, got bool"),
        ({"repeats": 0}, ValueError, "repeats must be >= 1, got 0"),
        ({"warmup": -1}, ValueError, "warmup must be >= 0, got -1"),
        ({"progress": 1}, TypeError, "progress must be a bool, got int"),
        ({"timer": 1.0}, TypeError, "timer must be callable, got float"),
        ({"model_name": 7}, TypeError, "model_name must be a str, got int"),
        ({"device": 0}, TypeError, "device must be a str, got int"),
        (
            {"device": "tpu"},
            ValueError,
            "device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got 'tpu'",
        ),
    ],
)
def test_invalid_arguments(kwargs: dict[str, Any], error: type[Exception], message: str) -> None:
    call: dict[str, Any] = {"model": _ok_model, "make_batch": make_list_batch, "progress": False}
    call.update(kwargs)
    with pytest.raises(error) as info:
        profile_model(call.pop("model"), call.pop("make_batch"), **call)
    assert str(info.value) == message


def test_cuda_requested_without_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError) as info:
        profile_model(_ok_model, make_list_batch, device="cuda:1", progress=False)
    assert str(info.value) == (
        "device='cuda:1' but CUDA is not available "
        "(torch is not installed or torch.cuda.is_available() is False)"
    )


def test_auto_device_is_cpu_without_cuda_or_without_torch(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    model = FakeModel(clock, lambda n, i: 1.0)
    assert _profile(clock, model, batch_sizes=[1], repeats=1, device="auto").device == "cpu"
    monkeypatch.setitem(sys.modules, "torch", None)  # torch not installed
    assert _profile(clock, model, batch_sizes=[1], repeats=1, device="auto").device == "cpu"


# --- the dataclasses ---


def test_profile_row_validation() -> None:
    row = ProfileRow(2, 3, 4, 5.5, None)
    assert row.median_ms == 3.0 and isinstance(row.median_ms, float)
    with pytest.raises(
        ValueError, match=r"^ProfileRow.p99_ms \(1.0\) must be >= median_ms \(2.0\)$"
    ):
        ProfileRow(1, 2.0, 1.0, 500.0)
    with pytest.raises(ValueError, match=r"^ProfileRow.median_ms must be a finite number > 0"):
        ProfileRow(1, 0.0, 1.0, 500.0)
    with pytest.raises(ValueError, match=r"^ProfileRow.peak_mem_bytes must be >= 0, got -1$"):
        ProfileRow(1, 1.0, 1.0, 500.0, -1)
    with pytest.raises(TypeError, match=r"^ProfileRow.batch_size must be an int, got str$"):
        ProfileRow("1", 1.0, 1.0, 500.0)  # type: ignore[arg-type]


def test_profile_result_validation() -> None:
    rows = (ProfileRow(1, 1.0, 1.0, 1000.0), ProfileRow(2, 1.0, 1.0, 2000.0))
    with pytest.raises(ValueError, match=r"strictly increasing batch sizes, got \[2, 1\]$"):
        ProfileResult(rows[::-1], None, "cpu", "m", 1)
    with pytest.raises(ValueError, match=r"^ProfileResult\.oom_batch_size") as info:
        ProfileResult(rows, 2, "cpu", "m", 1)
    assert str(info.value) == (
        "ProfileResult.oom_batch_size (2) must be larger than every profiled batch size "
        "(largest: 2)"
    )
    with pytest.raises(TypeError, match=r"^ProfileResult.rows\[0\] must be a ProfileRow, got int$"):
        ProfileResult((1,), None, "cpu", "m", 1)  # type: ignore[arg-type]
    result = ProfileResult(list(rows), 4, "cpu", "m", 1)  # type: ignore[arg-type]
    assert result.rows == rows
    assert result.row(2) is rows[1]
    assert result.max_items_per_s == 2000.0
    with pytest.raises(KeyError, match=r"batch size 3 was not profiled; profiled: \[1, 2\]"):
        result.row(3)

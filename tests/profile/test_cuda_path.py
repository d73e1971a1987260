"""The CUDA path of profile_model, with torch.cuda's functions replaced by fakes.

The fake GPU runs work asynchronously, as a real one does: a model call only *enqueues* its
kernels; ``synchronize`` is where the fake clock advances by the queued GPU time. So the
measured latencies are right only if the sweep synchronises before starting and before stopping
the timer, which is what these tests check.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from adaptive_batcher.profile import profile_model
from tests.profile.fakes import FakeClock, make_list_batch

MIB = 1024 * 1024


class FakeGpu:
    """Replaces the torch.cuda functions the profiler uses; records every call."""

    def __init__(self, clock: FakeClock, oom_at: int | None = None) -> None:
        self.clock = clock
        self.oom_at = oom_at
        self.pending_s = 0.0
        self.allocated_bytes = 0
        self.peak_bytes = 0
        self.log: list[tuple[str, Any]] = []
        self.devices: set[Any] = set()

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        monkeypatch.setattr(torch.cuda, "get_device_name", self.get_device_name)
        monkeypatch.setattr(torch.cuda, "synchronize", self.synchronize)
        monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", self.reset_peak_memory_stats)
        monkeypatch.setattr(torch.cuda, "max_memory_allocated", self.max_memory_allocated)
        monkeypatch.setattr(torch.cuda, "empty_cache", self.empty_cache)

    # torch.cuda API

    def get_device_name(self, device: Any = None) -> str:
        self.devices.add(device)
        return "Fake H200"

    def synchronize(self, device: Any = None) -> None:
        self.devices.add(device)
        self.log.append(("synchronize", None))
        self.clock.advance(self.pending_s)
        self.pending_s = 0.0

    def reset_peak_memory_stats(self, device: Any = None) -> None:
        self.devices.add(device)
        self.log.append(("reset_peak_memory_stats", None))
        self.peak_bytes = self.allocated_bytes

    def max_memory_allocated(self, device: Any = None) -> int:
        self.devices.add(device)
        self.log.append(("max_memory_allocated", self.peak_bytes))
        return self.peak_bytes

    def empty_cache(self) -> None:
        self.log.append(("empty_cache", None))

    # the model

    def model(self, batch: list[int]) -> list[int]:
        n = len(batch)
        if n == self.oom_at:
            raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {n} MiB")
        self.log.append(("model", n))
        self.pending_s += n * 1e-3  # 1 ms per item of GPU time, finished at synchronize()
        self.clock.advance(1e-5)  # the launch itself
        self.peak_bytes = max(self.peak_bytes, self.allocated_bytes + n * MIB)
        return batch


@pytest.fixture
def gpu(clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> FakeGpu:
    fake = FakeGpu(clock)
    fake.install(monkeypatch)
    return fake


def test_cuda_timing_includes_the_gpu_time_and_only_the_timed_calls(
    gpu: FakeGpu, clock: FakeClock
) -> None:
    result = profile_model(
        gpu.model,
        make_list_batch,
        batch_sizes=[1, 8],
        repeats=3,
        warmup=2,
        device="cuda",
        progress=False,
        timer=clock,
    )
    assert result.device == "cuda:0 (Fake H200)"
    one, eight = result.rows
    # launch 0.01 ms + 1 ms per item of GPU time; warm-up work is not counted
    assert one.median_ms == pytest.approx(1.01)
    assert eight.median_ms == pytest.approx(8.01)
    assert eight.p99_ms == pytest.approx(8.01)
    assert eight.items_per_s == pytest.approx(8 / 8.01e-3)
    assert gpu.devices == {torch.device("cuda", 0)}


def test_cuda_synchronizes_around_each_timed_call_and_reads_the_peak_after(
    gpu: FakeGpu, clock: FakeClock
) -> None:
    profile_model(
        gpu.model,
        make_list_batch,
        batch_sizes=[4],
        repeats=2,
        warmup=1,
        device="cuda",
        progress=False,
        timer=clock,
    )
    assert [name for name, _ in gpu.log] == [
        "model",  # warm-up
        "synchronize",  # warm-up work drained before measuring
        "reset_peak_memory_stats",
        "synchronize",
        "model",
        "synchronize",
        "synchronize",
        "model",
        "synchronize",
        "max_memory_allocated",
    ]


def test_cuda_peak_memory_comes_from_max_memory_allocated(gpu: FakeGpu, clock: FakeClock) -> None:
    gpu.allocated_bytes = 100 * MIB  # weights, already resident
    result = profile_model(
        gpu.model,
        make_list_batch,
        batch_sizes=[1, 16, 64],
        repeats=2,
        warmup=0,
        device="cuda",
        progress=False,
        timer=clock,
    )
    assert [row.peak_mem_bytes for row in result.rows] == [101 * MIB, 116 * MIB, 164 * MIB]


def test_cuda_out_of_memory_stops_the_sweep_and_empties_the_cache(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    gpu = FakeGpu(clock, oom_at=32)
    gpu.install(monkeypatch)
    result = profile_model(
        gpu.model,
        make_list_batch,
        max_batch_size=128,
        repeats=1,
        warmup=1,
        device="cuda",
        progress=False,
        timer=clock,
    )
    assert result.batch_sizes == (1, 2, 4, 8, 16)
    assert result.oom_batch_size == 32
    assert gpu.log[-1] == ("empty_cache", None)
    assert ("model", 64) not in gpu.log


def test_auto_picks_cuda_when_available(gpu: FakeGpu, clock: FakeClock) -> None:
    result = profile_model(
        gpu.model, make_list_batch, batch_sizes=[1], repeats=1, progress=False, timer=clock
    )
    assert result.device == "cuda:0 (Fake H200)"


def test_an_explicit_cuda_index_is_used(gpu: FakeGpu, clock: FakeClock) -> None:
    result = profile_model(
        gpu.model,
        make_list_batch,
        batch_sizes=[1],
        repeats=1,
        device="cuda:1",
        progress=False,
        timer=clock,
    )
    assert result.device == "cuda:1 (Fake H200)"
    assert gpu.devices == {torch.device("cuda", 1)}

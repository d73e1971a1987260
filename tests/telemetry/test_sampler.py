"""TelemetrySampler: a daemon thread at a fixed rate, a thread-safe ``latest``, no crash."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import MutableMapping
from typing import Any

import pytest

from adaptive_batcher.telemetry import MAX_RATE_HZ, TelemetrySample, TelemetrySampler
from adaptive_batcher.testing import FakeTelemetry
from tests.telemetry._helpers import wait_until, warnings_named

Logs = list[MutableMapping[str, Any]]


def counting_source() -> FakeTelemetry:
    """gpu_util_pct = call index, so a test can see ``latest`` move."""
    return FakeTelemetry(lambda i: TelemetrySample(time_s=float(i), gpu_util_pct=float(i)))


@pytest.mark.parametrize(
    ("rate_hz", "error", "message"),
    [
        (0, ValueError, "rate_hz must be a finite number > 0, got 0"),
        (-5.0, ValueError, "rate_hz must be a finite number > 0, got -5.0"),
        (float("nan"), ValueError, "rate_hz must be a finite number > 0, got nan"),
        (float("inf"), ValueError, "rate_hz must be a finite number > 0, got inf"),
        (1000.5, ValueError, "rate_hz must be <= 1000, got 1000.5"),
        ("20", TypeError, "rate_hz must be a number, got str"),
        (True, TypeError, "rate_hz must be a number, got bool"),
    ],
)
def test_bad_rate_messages(rate_hz: Any, error: type[Exception], message: str) -> None:
    with pytest.raises(error) as caught:
        TelemetrySampler(counting_source(), rate_hz=rate_hz)
    assert str(caught.value) == message


def test_rate_bounds_are_accepted() -> None:
    assert TelemetrySampler(counting_source(), rate_hz=MAX_RATE_HZ).rate_hz == MAX_RATE_HZ
    assert TelemetrySampler(counting_source(), rate_hz=0.5).rate_hz == 0.5
    assert TelemetrySampler(counting_source()).rate_hz == 20.0


def test_latest_is_unknown_before_the_first_reading() -> None:
    sampler = TelemetrySampler(counting_source())
    assert sampler.latest == TelemetrySample(source="fake")
    assert sampler.sample_count == 0
    assert not sampler.running


def test_samples_in_another_thread_and_latest_advances() -> None:
    source = counting_source()
    with TelemetrySampler(source, rate_hz=200.0) as sampler:
        assert sampler.running
        wait_until(lambda: sampler.sample_count >= 5)
        seen = sampler.latest.gpu_util_pct
        assert seen is not None and seen >= 4.0
        wait_until(lambda: (sampler.latest.gpu_util_pct or 0.0) > seen)
    assert threading.get_ident() not in source.thread_ids
    assert len(source.thread_ids) == 1
    assert not sampler.running


def test_thread_is_a_named_daemon() -> None:
    source = counting_source()
    sampler = TelemetrySampler(source, rate_hz=100.0)
    before = set(threading.enumerate())
    sampler.start()
    try:
        (thread,) = set(threading.enumerate()) - before
        assert thread.daemon
        assert thread.name == "adaptive_batcher.telemetry"
    finally:
        sampler.stop()


def test_stop_joins_and_sampling_stops() -> None:
    source = counting_source()
    sampler = TelemetrySampler(source, rate_hz=500.0)
    sampler.start()
    wait_until(lambda: source.calls >= 3)
    sampler.stop()
    assert not sampler.running
    calls = source.calls
    assert sampler.sample_count == calls
    time.sleep(0.02)  # ten periods at 500 Hz
    assert source.calls == calls
    assert sampler.latest.gpu_util_pct == float(calls - 1)
    sampler.stop()  # idempotent
    assert not source.closed  # the sampler does not own the source


def test_stop_interrupts_a_slow_rate_at_once() -> None:
    sampler = TelemetrySampler(counting_source(), rate_hz=0.5)  # one reading per 2 s
    sampler.start()
    wait_until(lambda: sampler.sample_count == 1)
    started = time.monotonic()
    sampler.stop()
    assert time.monotonic() - started < 1.0


def test_rate_is_respected() -> None:
    source = counting_source()
    sampler = TelemetrySampler(source, rate_hz=20.0)
    started = time.monotonic()
    sampler.start()
    time.sleep(0.25)
    sampler.stop()
    elapsed_s = time.monotonic() - started
    # 20 Hz: about 5 readings; never a busy loop (generous bounds for a loaded CI machine).
    assert 1 <= source.calls <= 20.0 * elapsed_s + 2


def test_start_twice_is_an_error_and_restart_works() -> None:
    source = counting_source()
    sampler = TelemetrySampler(source, rate_hz=200.0)
    sampler.start()
    with pytest.raises(RuntimeError, match=r"^sampler is already running$"):
        sampler.start()
    sampler.stop()
    calls = source.calls
    sampler.start()
    wait_until(lambda: source.calls > calls)
    sampler.stop()


def test_raising_source_is_survived_and_logged_once(logs: Logs) -> None:
    source = FakeTelemetry(
        lambda i: TelemetrySample(gpu_util_pct=float(i), source="fake"), raise_on={0, 1, 2, 5}
    )
    with TelemetrySampler(source, rate_hz=500.0) as sampler:
        wait_until(lambda: source.calls >= 8)
    assert sampler.latest.gpu_util_pct is not None
    warnings = warnings_named(logs, "telemetry.sample_failed")
    assert len(warnings) == 1
    assert warnings[0]["source"] == "fake"
    assert warnings[0]["error"] == "RuntimeError: FakeTelemetry: scripted failure on call 0"


def test_a_failed_reading_replaces_latest_with_unknowns() -> None:
    source = FakeTelemetry([TelemetrySample(gpu_util_pct=50.0)], raise_on={1})
    sampler = TelemetrySampler(source, clock=lambda: 9.0)
    assert sampler.sample_now().gpu_util_pct == 50.0
    failed = sampler.sample_now()
    assert failed == TelemetrySample(time_s=9.0, source="fake")
    assert sampler.latest == failed
    assert sampler.sample_now().gpu_util_pct == 50.0
    assert sampler.sample_count == 3


async def test_latest_is_readable_from_the_event_loop() -> None:
    source = counting_source()
    with TelemetrySampler(source, rate_hz=200.0) as sampler:
        for _ in range(500):  # the loop keeps running while the thread samples
            if sampler.sample_count >= 2:
                break
            await asyncio.sleep(0.01)
        assert sampler.sample_count >= 2
        assert sampler.latest.gpu_util_pct is not None
    assert threading.get_ident() not in source.thread_ids


class StuckSource:
    """A source whose sample() blocks until released (a wedged NVML call)."""

    name = "stuck"

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def sample(self) -> TelemetrySample:
        self.entered.set()
        self.release.wait()
        return TelemetrySample(gpu_util_pct=50.0, source=self.name)


def test_stop_soon_returns_at_once_and_a_stuck_reading_is_dropped() -> None:
    source = StuckSource()
    sampler = TelemetrySampler(source, rate_hz=100.0)
    sampler.start()
    assert source.entered.wait(5)
    (thread,) = [t for t in threading.enumerate() if t.name == "adaptive_batcher.telemetry"]
    sampler.stop_soon()  # the reading is stuck: a join would wait for it
    assert not sampler.running
    assert thread.is_alive()
    source.release.set()
    thread.join(5)
    assert not thread.is_alive()  # it ended by itself once the reading returned
    assert sampler.sample_count == 0  # the reading after the stop is dropped
    assert sampler.latest.gpu_util_pct is None

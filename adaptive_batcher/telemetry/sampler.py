"""Sampling a telemetry source off the event loop, in a daemon thread, at a fixed rate.

The event loop never calls NVML or torch: it reads :attr:`TelemetrySampler.latest`, which is a
lock-protected reference swap. One NVML call costs 4-9 us on an H200 (measured by this project
from Python through nvidia-ml-py: utilization ~4 us, memory ~9 us), so even at 50 Hz the
NVML calls take well under 1 ms per second; the thread sleeps between readings.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType

from adaptive_batcher._log import get_logger
from adaptive_batcher._validate import check_number
from adaptive_batcher.telemetry._util import describe_error
from adaptive_batcher.telemetry.base import Telemetry, TelemetrySample

__all__ = ["MAX_RATE_HZ", "TelemetrySampler", "TelemetryUsage"]

_log = get_logger()

#: Highest accepted sampling rate, in Hz: beyond it the thread mostly competes for the GIL.
MAX_RATE_HZ = 1000.0


def _check_rate(rate_hz: object) -> float:
    """``rate_hz`` as a float in (0, MAX_RATE_HZ]; exact messages are pinned by tests."""
    rate = check_number("rate_hz", rate_hz, 0.0, strict=True)
    if rate > MAX_RATE_HZ:
        raise ValueError(f"rate_hz must be <= {MAX_RATE_HZ:g}, got {rate_hz!r}")
    return rate


@dataclass(frozen=True, slots=True)
class TelemetryUsage:
    """What the GPU did since sampling started, from the readings (None: not measured).

    Integrals are trapezoids over consecutive readings, so they are as fine as the sampling
    rate; all are for the whole GPU, every process on it included (compare with the batcher's
    own ``Counts.device_busy_s`` to see co-tenants).

    Attributes:
        span_s: from the first reading to the latest, seconds.
        energy_j: energy spent, joules (NVML's energy counter; Volta and newer), between the
            first and the latest reading that has the counter (``NvmlTelemetry`` reads it at
            most once per ``energy_interval_s``, so that span may be up to that much shorter).
        gpu_busy_s: seconds in which any kernel ran (NVML utilization integrated): the cost
            measure on a GPU that NVML alone gives.
        sm_active_s: SM-seconds of work (GPM SM utilization integrated; Hopper and newer): how
            much of the GPU the kernels used, which NVML utilization cannot say (it reads 100 %
            from resnet50 batch 64 on, while throughput still grows 15 %; measured on an H200).
    """

    span_s: float = 0.0
    energy_j: float | None = None
    gpu_busy_s: float | None = None
    sm_active_s: float | None = None


class _Integrals:
    """Running trapezoid integrals of the readings (called under the sampler's lock)."""

    def __init__(self) -> None:
        self.first: TelemetrySample | None = None
        self.last: TelemetrySample | None = None
        self.first_energy_mj: int | None = None
        self.last_energy_mj: int | None = None
        self.gpu_busy_s: float | None = None
        self.sm_active_s: float | None = None

    def add(self, reading: TelemetrySample) -> None:
        if reading.time_s is None:
            return
        if reading.energy_mj is not None:
            if self.first_energy_mj is None:
                self.first_energy_mj = reading.energy_mj
            self.last_energy_mj = reading.energy_mj
        last = self.last
        if self.first is None:
            self.first = reading
        elif last is not None and last.time_s is not None:
            dt = reading.time_s - last.time_s
            self.gpu_busy_s = _step(self.gpu_busy_s, last.gpu_util_pct, reading.gpu_util_pct, dt)
            self.sm_active_s = _step(self.sm_active_s, last.sm_util_pct, reading.sm_util_pct, dt)
        self.last = reading

    def usage(self) -> TelemetryUsage:
        first, last = self.first, self.last
        if first is None or last is None or first.time_s is None or last.time_s is None:
            return TelemetryUsage()
        energy = None
        if self.first_energy_mj is not None and self.last_energy_mj is not None:
            energy = (self.last_energy_mj - self.first_energy_mj) / 1e3
        return TelemetryUsage(last.time_s - first.time_s, energy, self.gpu_busy_s, self.sm_active_s)


def _step(
    total: float | None, before: float | None, after: float | None, dt: float
) -> float | None:
    """``total`` plus the trapezoid of two percent readings over ``dt`` seconds."""
    if before is None or after is None or not dt > 0:
        return total
    return (total or 0.0) + (before + after) / 200.0 * dt


class TelemetrySampler:
    """Calls ``source.sample()`` ``rate_hz`` times a second in a daemon thread.

    :attr:`latest` is the most recent reading, safe to read from any thread (the event loop
    included); before the first reading it is an all-unknown sample. If the source raises, the
    error is logged once as the warning ``telemetry.sample_failed`` (keys ``source``,
    ``error``), ``latest`` becomes an all-unknown reading and sampling goes on.

    The sampler does not own the source: :meth:`stop` does not close it.

    Use as a context manager (``with TelemetrySampler(src) as sampler: ...``) or call
    :meth:`start` and :meth:`stop` (:meth:`stop_soon` on an event loop's thread, which must
    never wait for another thread). It can be started again after a stop.

    Args:
        source: the telemetry source to read.
        rate_hz: readings per second, a finite number in (0, 1000]; 10-50 Hz is the useful
            range. TypeError if not a number, ValueError if out of range.
        clock: monotonic clock in seconds used for pacing and for stamping failed readings
            (default ``time.monotonic``).
    """

    def __init__(
        self,
        source: Telemetry,
        rate_hz: float = 20.0,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._interval_s = 1.0 / _check_rate(rate_hz)
        self._source = source
        self._clock = clock
        self._lock = threading.Lock()
        self._latest = TelemetrySample(source=source.name)
        self._integrals = _Integrals()
        self._count = 0
        self._warned = False
        self._stop = threading.Event()  # the running thread's own; a new one per start
        self._thread: threading.Thread | None = None

    @property
    def rate_hz(self) -> float:
        """Readings per second."""
        return 1.0 / self._interval_s

    @property
    def latest(self) -> TelemetrySample:
        """The most recent reading (all unknown before the first one); thread-safe."""
        with self._lock:
            return self._latest

    @property
    def usage(self) -> TelemetryUsage:
        """Energy and busy time of the GPU since the first reading (see
        :class:`TelemetryUsage`); thread-safe."""
        with self._lock:
            return self._integrals.usage()

    @property
    def sample_count(self) -> int:
        """How many readings were attempted since construction (failed ones included)."""
        with self._lock:
            return self._count

    @property
    def running(self) -> bool:
        """True between :meth:`start` and :meth:`stop`."""
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Start the sampling thread; RuntimeError("sampler is already running") if it runs."""
        if self.running:
            raise RuntimeError("sampler is already running")
        self._stop = threading.Event()  # a thread left behind keeps its own, set
        self._thread = threading.Thread(
            target=self._run, args=(self._stop,), name="adaptive_batcher.telemetry", daemon=True
        )
        self._thread.start()

    def stop(self, timeout_s: float | None = None) -> None:
        """Ask the thread to stop and join it (at most ``timeout_s`` seconds if given).

        Returns after the reading in progress, if any, finishes. Idempotent; does not close the
        source. If the thread is still alive after ``timeout_s`` (a source stuck in a call), the
        warning ``telemetry.stop_timeout`` is logged and the daemon thread is left behind.
        """
        self._stop.set()
        thread = self._thread
        if thread is None:
            return
        thread.join(timeout_s)
        if thread.is_alive():
            _log.warning("telemetry.stop_timeout", source=self._source.name, timeout_s=timeout_s)
            return
        self._thread = None

    def stop_soon(self) -> None:
        """Ask the thread to stop and return at once, without waiting for it: the call for an
        event loop's thread, which must never wait for another thread (a reading stuck in
        ``source.sample()``, a wedged NVML call, would freeze the loop).

        The thread ends by itself: at once when it is between readings, else when the reading
        in progress returns (that reading is dropped). :attr:`running` is False from now on,
        and :meth:`start` may start a new thread. Idempotent; does not close the source.
        """
        self._stop.set()
        self._thread = None

    def _run(self, stop: threading.Event) -> None:
        """Sample, then sleep until the next tick; a late tick does not trigger a burst.
        ``stop`` is this thread's own flag: a thread left behind by :meth:`stop_soon` stores
        nothing once it is set, even after a new thread has started."""
        next_s = self._clock()
        while not stop.is_set():
            reading = self._read()
            if stop.is_set():
                break
            self._store(reading)
            next_s += self._interval_s
            delay_s = next_s - self._clock()
            if delay_s < 0.0 or not math.isfinite(delay_s):
                next_s, delay_s = self._clock(), 0.0
            stop.wait(delay_s)

    def sample_now(self) -> TelemetrySample:
        """Take one reading in the calling thread, store it as :attr:`latest` and return it.

        Used by the sampling thread; also handy in tests and for a reading at start-up.
        Raises nothing: a raising source gives an all-unknown reading.
        """
        reading = self._read()
        self._store(reading)
        return reading

    def _read(self) -> TelemetrySample:
        """One reading of the source; an all-unknown one, warned about once, if it raises."""
        try:
            return self._source.sample()
        except Exception as exc:
            self._warn_once(exc)
            return TelemetrySample(time_s=self._clock(), source=self._source.name)

    def _store(self, reading: TelemetrySample) -> None:
        with self._lock:
            self._latest = reading
            self._integrals.add(reading)
            self._count += 1

    def _warn_once(self, exc: BaseException) -> None:
        with self._lock:
            first, self._warned = not self._warned, True
        if not first:
            return
        _log.warning("telemetry.sample_failed", source=self._source.name, error=describe_error(exc))

    def __enter__(self) -> TelemetrySampler:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

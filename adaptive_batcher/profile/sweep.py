"""Step 1 of the practitioners' method: sweep batch sizes on the real model and hardware.

For each batch size (ascending): build one batch, run ``warmup`` untimed calls (the first call at a
new shape is slow: algorithm selection, allocator growth), then timed calls in rounds of
``repeats`` until the timings settle (robust coefficient of variation at most ``cv_threshold``) or
``max_repeats`` calls were timed; keep the median and p99 batch latency, throughput, peak memory,
the spread (CV, robust CV) and the number of timed calls. The sweep stops at the first batch size
that runs out of memory and keeps what it measured before. It then checks the curve for noise
(:mod:`adaptive_batcher.profile.noise`) and records torch's thread counts and the cores available.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from adaptive_batcher._log import get_logger
from adaptive_batcher._optional import require
from adaptive_batcher._threads import (
    TorchThreads,
    available_cores,
    current_torch_threads,
    use_torch_threads,
)
from adaptive_batcher._validate import (
    check_bool,
    check_callable,
    check_int,
    check_ints,
    check_number,
    check_optional_int,
    check_str,
)
from adaptive_batcher.profile._devices import (
    DeviceBackend,
    is_out_of_memory,
    make_backend,
    resolve_device,
)
from adaptive_batcher.profile.noise import (
    DEFAULT_CV_THRESHOLD,
    coefficient_of_variation,
    noise_warnings,
    robust_cv,
    setup_warnings,
)
from adaptive_batcher.profile.result import ProfileResult, ProfileRow

__all__ = ["default_batch_sizes", "profile_model"]

_log = get_logger()

DEFAULT_REPEAT_FACTOR: Final = 5
"""Without ``max_repeats``, a batch size is timed in at most this many rounds of ``repeats``."""


def default_batch_sizes(max_batch_size: int = 512) -> tuple[int, ...]:
    """Powers of two ``1, 2, 4, ...`` up to and including ``max_batch_size`` if it is one.

    Powers of two are the usual bucket set: a batch is padded up to the next bucket, so that a
    few shapes, warmed once, serve every size (on an H200 the first call at each new batch size
    cost 100-970 ms of p99, measured by this project with resnet50, bf16, eager).

    Raises:
        TypeError, ValueError: ``max_batch_size`` is not an int >= 1.
    """
    check_int("max_batch_size", max_batch_size, 1)
    sizes = [1]
    while sizes[-1] * 2 <= max_batch_size:
        sizes.append(sizes[-1] * 2)
    return tuple(sizes)


def _check_batch_sizes(batch_sizes: Iterable[int]) -> tuple[int, ...]:
    """The batch sizes, checked (ints >= 1, at least one), ascending, duplicates dropped."""
    return tuple(sorted(set(check_ints("batch_sizes", batch_sizes, 1))))


def _model_name(model: Callable[..., Any]) -> str:
    name = getattr(model, "__qualname__", None)
    return name if isinstance(name, str) else type(model).__name__


class _Progress:
    """A rich progress bar on stderr, or nothing when disabled."""

    def __init__(self, bar: Any, task: Any) -> None:
        self._bar = bar
        self._task = task

    def show(self, batch_size: int) -> None:
        if self._bar is not None:
            self._bar.update(self._task, description=f"profiling batch {batch_size}")

    def advance(self) -> None:
        if self._bar is not None:
            self._bar.advance(self._task)

    def done(self, text: str) -> None:
        if self._bar is not None:
            self._bar.update(self._task, description=text)


@contextmanager
def _progress(enabled: bool, total: int) -> Iterator[_Progress]:
    if not enabled:
        yield _Progress(None, None)
        return
    needed_by = "profile_model(progress=True) (its progress bar; progress=False needs nothing)"
    console = require("rich.console", needed_by)
    progress = require("rich.progress", needed_by)
    bar = progress.Progress(
        progress.TextColumn("{task.description}"),
        progress.BarColumn(),
        progress.MofNCompleteColumn(),
        progress.TimeElapsedColumn(),
        console=console.Console(stderr=True),
    )
    with bar:
        yield _Progress(bar, bar.add_task("profiling", total=total))


@dataclass(frozen=True, slots=True)
class _Timing:
    """How each batch size is timed (arguments of :func:`profile_model`, checked)."""

    repeats: int
    max_repeats: int
    cv_threshold: float
    warmup: int
    timer: Callable[[], float]


def _time_calls(
    model: Callable[[Any], Any],
    batch: Any,
    count: int,
    timer: Callable[[], float],
    backend: DeviceBackend,
) -> list[float]:
    """``count`` timed calls of ``model(batch)``, each between two device barriers; seconds."""
    samples_s: list[float] = []
    for _ in range(count):
        backend.synchronize()
        start = timer()
        out = model(batch)
        backend.synchronize()
        samples_s.append(timer() - start)
        del out
    return samples_s


def _settled(samples_s: list[float], cv_threshold: float) -> bool:
    spread = robust_cv(samples_s)
    return spread is not None and spread <= cv_threshold


def _measure(
    model: Callable[[Any], Any],
    make_batch: Callable[[int], Any],
    batch_size: int,
    timing: _Timing,
    backend: DeviceBackend,
) -> ProfileRow:
    """One batch size: build the batch, warm up, time rounds of calls until settled. May raise
    OOM."""
    batch = make_batch(batch_size)
    for _ in range(timing.warmup):
        model(batch)
    backend.synchronize()
    backend.start_memory_window()
    samples_s: list[float] = []
    while len(samples_s) < timing.max_repeats and not _settled(samples_s, timing.cv_threshold):
        count = min(timing.repeats, timing.max_repeats - len(samples_s))
        samples_s += _time_calls(model, batch, count, timing.timer, backend)
    return _row(batch_size, samples_s, backend.peak_memory_bytes())


def _row(batch_size: int, samples_s: list[float], peak_mem_bytes: int | None) -> ProfileRow:
    median_s = statistics.median(samples_s)
    if not (math.isfinite(median_s) and median_s > 0):
        raise RuntimeError(
            f"batch size {batch_size}: median latency is {median_s!r} s; the timer must be "
            "monotonic with sub-millisecond resolution (time.perf_counter is)"
        )
    p99_s = max(float(np.percentile(samples_s, 99)), median_s)
    return ProfileRow(
        batch_size=batch_size,
        median_ms=median_s * 1e3,
        p99_ms=p99_s * 1e3,
        items_per_s=batch_size / median_s,
        peak_mem_bytes=peak_mem_bytes,
        repeats=len(samples_s),
        cv=coefficient_of_variation(samples_s),
        robust_cv=robust_cv(samples_s),
    )


def _check_timing(
    repeats: int,
    max_repeats: int | None,
    cv_threshold: float,
    warmup: int,
    timer: Callable[[], float],
) -> _Timing:
    check_int("repeats", repeats, 1)
    most = DEFAULT_REPEAT_FACTOR * repeats if max_repeats is None else max_repeats
    check_int("max_repeats", most, repeats)
    threshold = check_number("cv_threshold", cv_threshold, 0.0, strict=True)
    check_int("warmup", warmup, 0)
    check_callable("timer", timer)
    return _Timing(repeats, most, threshold, warmup, timer)


def profile_model(
    model: Callable[[Any], Any],
    make_batch: Callable[[int], Any],
    *,
    batch_sizes: Iterable[int] | None = None,
    max_batch_size: int = 512,
    repeats: int = 20,
    max_repeats: int | None = None,
    cv_threshold: float = DEFAULT_CV_THRESHOLD,
    warmup: int = 3,
    device: str = "auto",
    torch_threads: int | None = None,
    progress: bool = True,
    timer: Callable[[], float] = time.perf_counter,
    model_name: str | None = None,
) -> ProfileResult:
    """Sweep batch sizes: median / p99 batch latency, throughput and peak memory at each, with
    the spread of the timings and a check of the curve for noise.

    Method: wall clock around the call (with ``torch.cuda.synchronize()`` before and after it on
    CUDA), after ``warmup`` untimed calls, at every batch size. The timed calls run in rounds of
    ``repeats``; after each round the robust coefficient of variation of all the calls so far
    (``1.4826 x MAD / median``, see :mod:`adaptive_batcher.profile.noise`) is compared with
    ``cv_threshold``, and the batch size is done once it is at or below it (at least 2 calls) or
    ``max_repeats`` calls were timed. Median, p99, CV and robust CV are over all those calls.
    ``make_batch`` is called once per batch size, outside the timing; the same batch is fed to
    every call.

    Afterwards :func:`~adaptive_batcher.profile.noise.noise_warnings` checks the rows: a batch
    size that did not settle, or a larger batch measurably faster than a smaller one, sets
    ``noisy`` and adds a warning (and the structlog event ``profile.noisy``). torch's thread
    counts (when torch has been imported) and the cores available are recorded; more torch
    intra-op threads than cores adds a warning (event ``profile.threads_oversubscribed``).

    ``device`` selects how timing and memory are measured; it does not move the model or the
    batch, which ``model`` and ``make_batch`` must place themselves. On CUDA the peak memory is
    ``torch.cuda.max_memory_allocated`` after ``torch.cuda.reset_peak_memory_stats``; on CPU it is
    the growth of the process peak RSS (``resource.getrusage().ru_maxrss``, stdlib) since the sweep
    started (None where ``resource`` is missing, i.e. Windows).

    The first batch size that raises an out-of-memory error (``torch.OutOfMemoryError``,
    ``MemoryError``, or a ``RuntimeError`` whose message says an allocator ran out:
    :func:`~adaptive_batcher.profile.is_out_of_memory`), while building
    the batch or running it, stops the sweep: it is recorded as ``oom_batch_size`` and the rows
    measured before it are kept. Any other exception from ``model`` or ``make_batch`` propagates.

    Args:
        model: ``model(batch)`` runs one batch (any callable; its result is discarded).
        make_batch: ``make_batch(n)`` returns a batch of ``n`` items.
        batch_sizes: the batch sizes to try (ints >= 1; run in ascending order, duplicates
            dropped). Default: :func:`default_batch_sizes` of ``max_batch_size``; when given,
            ``max_batch_size`` is ignored.
        max_batch_size: largest power-of-two batch size for the default sweep (>= 1).
        repeats: timed calls per round (>= 1).
        max_repeats: the most timed calls per batch size (>= ``repeats``); default
            ``5 * repeats``. ``max_repeats=repeats`` times exactly one round.
        cv_threshold: a batch size is settled once the robust CV of its timings is at most this
            (> 0; default 0.1, i.e. 10 %).
        warmup: untimed calls per batch size before the timed ones (>= 0).
        device: ``"auto"`` (CUDA if available, else CPU), ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
        torch_threads: ``torch.set_num_threads(torch_threads)`` for the sweep, the previous count
            restored afterwards (>= 1); None (default) leaves torch as it is.
        progress: show a rich progress bar on stderr (rich comes with the ``cli`` extra).
        timer: clock in seconds (monotonic); injectable so tests run on a fake clock.
        model_name: stored in the result; default: the callable's ``__qualname__``.

    Returns:
        A :class:`ProfileResult`; its ``rows`` may be empty if the first batch size ran out of
        memory.

    Raises:
        TypeError: an argument has the wrong type (``model must be callable, got int``, ...).
        ValueError: an argument is out of range (``repeats must be >= 1, got 0``, ...).
        RuntimeError: a CUDA device was requested but is not available, ``torch_threads`` was
            given without torch installed, or the timer measured a median of zero.
        ImportError: ``progress=True`` without rich (``pip install "adaptive-batcher[cli]"``).
    """
    check_callable("model", model)
    check_callable("make_batch", make_batch)
    if batch_sizes is None:
        sizes = default_batch_sizes(max_batch_size)
    else:
        check_int("max_batch_size", max_batch_size, 1)
        sizes = _check_batch_sizes(batch_sizes)
    timing = _check_timing(repeats, max_repeats, cv_threshold, warmup, timer)
    check_optional_int("torch_threads", torch_threads, 1)
    check_bool("progress", progress)
    if model_name is not None:
        check_str("model_name", model_name)
    backend = make_backend(resolve_device(device))
    name = model_name if model_name is not None else _model_name(model)
    with use_torch_threads(torch_threads, option="torch_threads"):
        threads = current_torch_threads()
        rows, oom_batch_size = _sweep(model, make_batch, sizes, timing, backend, progress, name)
    return _result(rows, oom_batch_size, backend.description, name, timing, threads)


def _sweep(
    model: Callable[[Any], Any],
    make_batch: Callable[[int], Any],
    sizes: tuple[int, ...],
    timing: _Timing,
    backend: DeviceBackend,
    progress: bool,
    name: str,
) -> tuple[list[ProfileRow], int | None]:
    """The rows measured, and the batch size that ran out of memory (or None)."""
    _log.info(
        "profile.started",
        model=name,
        device=backend.description,
        batch_sizes=list(sizes),
        repeats=timing.repeats,
        max_repeats=timing.max_repeats,
        cv_threshold=timing.cv_threshold,
        warmup=timing.warmup,
    )
    rows: list[ProfileRow] = []
    oom_batch_size: int | None = None
    with _progress(progress, len(sizes)) as bar:
        for size in sizes:
            bar.show(size)
            try:
                row = _measure(model, make_batch, size, timing, backend)
            except Exception as exc:
                if not is_out_of_memory(exc):
                    raise
                oom_batch_size = size
                _log.warning("profile.oom", batch_size=size, error=repr(exc))
                break
            rows.append(row)
            _log.debug(
                "profile.batch_size_done",
                batch_size=row.batch_size,
                median_ms=row.median_ms,
                p99_ms=row.p99_ms,
                items_per_s=row.items_per_s,
                peak_mem_bytes=row.peak_mem_bytes,
                repeats=row.repeats,
                cv=row.cv,
                robust_cv=row.robust_cv,
            )
            bar.advance()
        bar.done(
            f"profiled {len(rows)} batch sizes"
            + ("" if oom_batch_size is None else f", out of memory at {oom_batch_size}")
        )
    if oom_batch_size is not None:
        backend.release_memory()
    _log.info(
        "profile.finished",
        model=name,
        batch_sizes_done=len(rows),
        oom_batch_size=oom_batch_size,
    )
    return rows, oom_batch_size


def _result(
    rows: list[ProfileRow],
    oom_batch_size: int | None,
    device: str,
    name: str,
    timing: _Timing,
    threads: TorchThreads | None,
) -> ProfileResult:
    """The result, with the noise checks done and logged."""
    cores = available_cores()
    noise = noise_warnings(rows, cv_threshold=timing.cv_threshold)
    setup = setup_warnings(rows, threads, cores)
    if noise:
        _log.warning("profile.noisy", model=name, warnings=list(noise))
    if threads is not None and cores is not None and threads.intra_op > cores:
        _log.warning(
            "profile.threads_oversubscribed",
            model=name,
            torch_threads=threads.intra_op,
            available_cores=cores,
        )
    return ProfileResult(
        rows=tuple(rows),
        oom_batch_size=oom_batch_size,
        device=device,
        model_name=name,
        repeats=timing.repeats,
        max_repeats=timing.max_repeats,
        cv_threshold=timing.cv_threshold,
        torch_threads=None if threads is None else threads.intra_op,
        torch_interop_threads=None if threads is None else threads.inter_op,
        available_cores=cores,
        warnings=(*noise, *setup),
        noisy=bool(noise),
    )

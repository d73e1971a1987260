"""Running one batch: padding, result checks, per-slot errors, whole-batch failure, scatter.

:meth:`BatchRunner.run` settles every request it is given, whatever happens: a result, the
exception instance the model put in the request's slot, or a typed error. Nothing here can leave
a caller waiting: even a failing ``is_oom`` hook or a logging processor that raises ends in
:class:`~adaptive_batcher.errors.BatchFailedError` for the callers still pending. Where the model
call itself runs (on the loop, in a worker thread, inline, or launched on a CUDA stream) is the
executor's business: :mod:`adaptive_batcher.runtime.executors`.

What the model raises, by type:

- ``asyncio.CancelledError``, ``KeyboardInterrupt``, ``SystemExit`` (:data:`STOPS_THE_TASK`): the
  pending callers get ``BatchFailedError`` and the exception propagates (the batch task handles it).
- anything else, ``Exception`` or not (``GeneratorExit``, a ``BaseException`` subclass): a model
  failure, split on OOM or with ``bisect``. A ``StopIteration`` or ``GeneratorExit`` carried by
  the executor (:class:`~adaptive_batcher.runtime.executors.CarriedModelError`) is unwrapped: the
  callers' cause is the model's exception itself.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence, Set
from operator import attrgetter
from typing import Any, NamedTuple

from adaptive_batcher._log import get_logger
from adaptive_batcher.core.batcher_core import BatcherCore
from adaptive_batcher.core.buckets import pad_target
from adaptive_batcher.errors import (
    BatcherError,
    BatchFailedError,
    PaddingError,
    ResultCountError,
    describe,
)
from adaptive_batcher.runtime.executors import BatchExecutor, CarriedModelError, run_timed

__all__ = [
    "STOPS_THE_TASK",
    "BatchRunner",
    "ModelCall",
    "check_padded",
    "check_results",
    "fail_pending",
]

#: Raised by the model, these end the batch task after its callers are failed: a cancellation
#: (a time-limited close), or a request to stop the program.
STOPS_THE_TASK = (asyncio.CancelledError, KeyboardInterrupt, SystemExit)

_log = get_logger()
_item_of = attrgetter("item")
_arrival_of = attrgetter("arrival_s")
_NOT_RESULT_SEQUENCES = (Mapping, Set, str, bytes)  # a tuple: no union object built per batch


class ModelCall(NamedTuple):
    """One model call that succeeded: when it ended (s, the loop's clock), its requests, the
    units it ran (padding included), how long it took (s) and, for a streaming model, how long
    its first answer took (s; None: not a stream)."""

    end_s: float
    items: int
    units: int
    service_s: float
    answer_s: float | None = None


def fail_pending(requests: Sequence[Any], exc: BaseException, core: BatcherCore[Any]) -> int:
    """Give every request whose future is not done its own typed error, counted as failed by
    ``core``; returns how many. A ``ResultCountError`` or ``PaddingError`` is copied for each
    caller, with its cause."""
    failed = 0
    for request in requests:
        future = request.handle
        if not future.done():
            error: BatcherError
            if isinstance(exc, ResultCountError | PaddingError):
                error = type(exc)(str(exc))  # each caller its own
                error.__cause__ = exc.__cause__
            else:
                error = BatchFailedError(exc, len(requests))
            future.set_exception(error)
            failed += 1
    core.count_failed(failed)
    return failed


class BatchRunner:
    """Calls the model on a batch of runtime requests and settles their futures.

    Args:
        executor: how the model is called.
        buckets: allowed batch sizes (empty: any); a batch is padded up to the next one.
        pad_fn: the padding function for buckets.
        counts_units: True when requests have sizes (a size function), so units != items.
        bisect: re-run a failing batch in halves until the failing item is isolated.
        is_oom: tells out-of-memory errors apart (always split); an exception in it counts as
            "not OOM".
        core: where answers, failures and latencies are counted (the batcher's core).
        clock: the event loop's clock, seconds.
        name: the batcher's name, for log events.
    """

    def __init__(
        self,
        executor: BatchExecutor,
        buckets: tuple[int, ...],
        pad_fn: Callable[[list[Any], int], list[Any]],
        counts_units: bool,
        bisect: bool,
        is_oom: Callable[[BaseException], bool],
        core: BatcherCore[Any],
        clock: Callable[[], float],
        name: str,
    ) -> None:
        self.executor = executor
        self.buckets = buckets
        self.pad_fn = pad_fn
        self.counts_units = counts_units
        self.bisect = bisect
        self.is_oom = is_oom
        self.core = core
        self.clock = clock
        self.name = name

    def leave(self, request: Any) -> bool:
        """The caller of ``request`` left (cancelled, or stopped reading its stream): count it
        as completed if its running batch has handed it a first element (a streaming batch,
        see :mod:`adaptive_batcher.runtime.streaming`) and return True; else False (never for
        a batch answered at once), and the caller counts it as cancelled."""
        del request
        return False

    async def run(self, requests: list[Any]) -> list[ModelCall] | None:
        """Run ``requests`` through the model and settle each; split on OOM or when bisecting.

        Raises:
            asyncio.CancelledError, KeyboardInterrupt, SystemExit: after the requests still
                pending were failed with ``BatchFailedError`` (any other exception, ``Exception``
                or not, is a model failure and is not raised).

        Returns:
            The model calls that succeeded, each with its time as the executor measured it:
            one for a batch that ran whole; when it was split (out of memory, or bisection),
            each a run of its own for the service-time fit and ``stats()`` (as the simulator
            counts them): a failed call's time is device time, not a batch's service time.
        """
        calls: list[ModelCall] = []
        await self._run(requests, calls)
        return calls

    async def _run(self, requests: list[Any], calls: list[ModelCall]) -> bool:
        """:meth:`run`, the calls that succeeded appended to ``calls``; True when this call
        ran out of memory."""
        items = list(map(_item_of, requests))
        units = sum(r.size for r in requests) if self.counts_units else len(items)
        try:
            results, took_s = await self.call_model(items, units)
        except STOPS_THE_TASK as exc:
            fail_pending(requests, exc, self.core)
            raise
        except PaddingError as exc:  # the user's pad_fn, not an item: no split, no bisection
            self.padding_failed(requests, exc)
            return False
        except BaseException as exc:  # GeneratorExit & co. too: failures, not task-enders
            return await self._model_failed(requests, exc, units, calls)
        ended = self.clock()
        ran = pad_target(self.buckets, units) if self.buckets else units
        calls.append(ModelCall(ended, len(items), ran, took_s))
        self.scatter(requests, results)
        return False

    async def _model_failed(
        self, requests: list[Any], exc: BaseException, units: int, calls: list[ModelCall]
    ) -> bool:
        """Split the batch (OOM, or ``bisect``) or fail its callers with ``exc`` as the cause;
        True when the call ran out of memory.

        Every OOM is counted when it happens; its cause is judged once the halves have run
        (``BatcherCore.judge_oom``): the batch's size when every half ran out of memory or
        none did; a request that runs out of memory alone when exactly one half did (down to
        that request, which fails with the error), or when a request left before the halves
        ran. Only the first moves the memory guard (one such request every 2 s, counted as a
        size error, halved the cap to 1 for all traffic)."""
        if type(exc) is CarriedModelError:
            exc = exc.carried
        oom = self.is_oom_error(exc)
        halves = self.core.split_failed_call(
            requests, oom=oom, bisect=self.bisect, judge_later=True
        )
        if halves is None:
            self._fail(requests, exc, "batch.failed")
            if oom:
                self.core.judge_oom(size_caused=False)  # one request, alone
            return oom
        await self.rerun_halves(
            requests, halves, exc, units, lambda live: self._run(live, calls), judge=oom
        )
        return oom

    async def rerun_halves(
        self,
        requests: Sequence[Any],
        halves: tuple[Sequence[Any], Sequence[Any]],
        exc: BaseException,
        units: int,
        run_half: Callable[[list[Any]], Awaitable[bool]],
        *,
        judge: bool,
    ) -> None:
        """Re-run a failed call's ``halves`` (``BatcherCore.split_failed_call``) one after the
        other, each with the requests still pending (``run_half`` returns True when its call
        ran out of memory); with ``judge``, the out-of-memory call's cause is judged once they
        have run (see :meth:`_model_failed`). Logs ``batch.split``."""
        _log.warning(
            "batch.split", batcher=self.name, batch_size=len(requests), error=describe(exc)
        )
        failed, left = 0, False
        for half in halves:
            live = [r for r in half if not r.handle.done()]
            left = left or len(live) < len(half)
            failed += await run_half(live)
        if judge:
            self.core.judge_oom(size_caused=not left and failed != 1, units=units)

    def padding_failed(self, requests: list[Any], exc: PaddingError) -> int:
        """Fail the requests still pending with ``exc`` (each its own); log
        ``batch.pad_failed``. Returns how many were failed."""
        return self._fail(requests, exc, "batch.pad_failed")

    def _fail(self, requests: list[Any], exc: BaseException, event: str) -> int:
        """Fail the requests still pending with ``exc`` and log ``event``; how many failed."""
        failed = fail_pending(requests, exc, self.core)
        _log.warning(
            event, batcher=self.name, batch_size=len(requests), failed=failed, error=describe(exc)
        )
        return failed

    def pad(self, items: list[Any], units: int) -> list[Any]:
        """``items`` padded by ``pad_fn`` up to the next bucket (as they are without buckets,
        or when ``units`` fills a bucket).

        Raises:
            PaddingError: ``pad_fn`` raised an ``Exception`` (its ``__cause__``), or returned a
                wrong number of items (see ``check_padded``).
        """
        if not self.buckets:
            return items
        target = pad_target(self.buckets, units)
        if target <= units:
            return items
        try:
            padded = self.pad_fn(list(items), target)
        except Exception as exc:  # the user's pad_fn failed, not the model
            raise PaddingError(
                f"pad_fn raised {describe(exc)} padding a batch of {len(items)} to {target}"
            ) from exc
        check_padded(padded, len(items), target, self.counts_units)
        return padded

    async def call_model(self, items: list[Any], units: int) -> tuple[Sequence[Any], float]:
        """Pad to a bucket, call the model, check the results; returns one result per item and
        the call's time, s, as the executor measured it (:func:`run_timed`: where the model ran).

        The batch is counted before the model runs, so a model that changes its input list
        (clears it, pops from it) still gets ``ResultCountError`` for a wrong result count.

        Raises:
            PaddingError: ``pad_fn`` raised, or returned a wrong number of items; the model did
                not run.
            ResultCountError: the model returned no sequence, a mapping or set, or the wrong
                number of results.
            Exception: whatever the model (or ``pad_fn``) raised.
        """
        if not items:
            return [], 0.0
        count = len(items)
        batch = self.pad(items, units)
        padded = len(batch)  # before the model: it may change the list it is given
        results, took_s = await run_timed(self.executor, batch, self.clock)
        check_results(results, padded)
        return (results if padded == count else results[:count]), took_s

    def scatter(self, requests: list[Any], results: Sequence[Any]) -> None:
        """Hand each request its result. An exception instance fails only that request: as is,
        unless it cannot be raised into the caller's future as is: a ``StopIteration`` (asyncio
        refuses it) or a ``BaseException`` that is not an ``Exception`` (``KeyboardInterrupt``
        returned as data must not stop the caller's task) is wrapped in ``BatchFailedError``
        whose ``cause`` it is."""
        now = self.clock()
        failed = 0
        settled: set[int] | None = None  # ids of requests settled meanwhile (caller gave up)
        for request, result in zip(requests, results, strict=True):
            future = request.handle
            if future.done():
                if settled is None:
                    settled = set()
                settled.add(id(request))
            elif isinstance(result, BaseException):
                if not isinstance(result, Exception) or isinstance(result, StopIteration):
                    result = BatchFailedError(result, len(requests))
                future.set_exception(result)
                failed += 1
            else:
                future.set_result(result)
        answered = [r for r in requests if id(r) not in settled] if settled else requests
        self.core.record_answers(list(map(_arrival_of, answered)), failed, now)

    def is_oom_error(self, exc: BaseException) -> bool:
        """``is_oom(exc)``; False when the hook itself raises (a broken hook must not strand
        the batch)."""
        try:
            return bool(self.is_oom(exc))
        except Exception:
            return False


def check_padded(padded: Any, items: int, target: int, counts_units: bool) -> None:
    """Raise ``PaddingError`` unless ``pad_fn`` returned a sequence of ``target`` items, or,
    when items have sizes (``counts_units``: ``target`` is in units), at least ``items`` items:
    every caller needs its own result slot, and the padding's are dropped."""
    if isinstance(padded, _NOT_RESULT_SEQUENCES) or not hasattr(padded, "__len__"):
        raise PaddingError(
            f"pad_fn returned {type(padded).__name__}, expected a list of "
            f"{f'at least {items}' if counts_units else target} items"
        )
    count = len(padded)
    if count == target if not counts_units else count >= items:
        return
    if counts_units:
        raise PaddingError(
            f"pad_fn returned {count} items for a batch of {items} padded to {target} units; "
            f"expected at least {items} items, the batch's own first"
        )
    raise PaddingError(
        f"pad_fn returned {count} items for a batch of {items} padded to {target}; "
        f"expected {target}"
    )


def check_results(results: Any, expected: int) -> None:
    """Raise ``ResultCountError`` unless ``results`` is a sequence of ``expected`` results."""
    if isinstance(results, _NOT_RESULT_SEQUENCES):
        raise ResultCountError(
            f"model returned {type(results).__name__}, expected a sequence of {expected} results"
        )
    try:
        count = len(results)
    except TypeError:
        hint = ""
        if inspect.iscoroutine(results):
            hint = (
                " (a plain function returned a coroutine: make the model itself `async def`,"
                " and a decorator's wrapper of it `async def` too)"
            )
        elif inspect.isasyncgen(results):
            hint = (
                " (a plain function returned an async generator: make the model itself an"
                " `async def` generator function, or wrap one with functools.wraps)"
            )
        raise ResultCountError(
            f"model returned {type(results).__name__}, expected a sequence of {expected} "
            f"results{hint}"
        ) from None
    if count != expected:
        raise ResultCountError(f"model returned {count} results for a batch of {expected}")

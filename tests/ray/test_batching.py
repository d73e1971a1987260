"""``adaptive_batcher.ray.batch`` behaves as Ray Serve's ``@serve.batch`` (plain asyncio).

Each behaviour that Ray's own unit tests of ``@serve.batch`` check has an equivalent here, in
our words (the upstream file is run by ``scripts/ray_upstream_tests.py`` where it is at hand);
the behaviours where we differ on purpose are tested as ours, and the Ray guide says why.
Timing-dependent cases run in virtual time, so they assert behaviour, not the machine's speed.
"""

from __future__ import annotations

import asyncio
import inspect
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from adaptive_batcher import (
    SLO,
    DeadlineExceededError,
    ItemTooLargeError,
    QueueFullError,
    ResultCountError,
)
from adaptive_batcher.ray import BatchSizeMismatchError, ItemTooLargeForBatchError, batch
from adaptive_batcher.testing import run_in_virtual_time

LONG_S = 1000.0  # a window no test waits out: batches leave full, or not at all


async def pending_after(tasks: list[asyncio.Task[Any]], wait_s: float) -> int:
    """How many of ``tasks`` are still running after ``wait_s`` seconds."""
    _, pending = await asyncio.wait(tasks, timeout=wait_s)
    return len(pending)


def echo_handler(use_class: bool, **options: Any) -> Callable[[Any], Awaitable[Any]]:
    """A one-parameter handler that returns its batch and divides by zero on "raise"."""

    @batch(**options)
    async def function(requests: list[Any]) -> list[Any]:
        if "raise" in requests:
            _ = 1 / 0
        return requests

    class Holder:
        @batch(**options)
        async def method(self, requests: list[Any]) -> list[Any]:
            if "raise" in requests:
                _ = 1 / 0
            return requests

    return Holder().method if use_class else function


def pairs_handler(use_class: bool, **options: Any) -> Callable[..., Any]:
    """A two-parameter handler: one list per parameter, a tuple per caller back."""

    @batch(**options)
    async def function(key1: list[str], key2: list[str]) -> list[tuple[str, str]]:
        return list(zip(key1, key2, strict=True))

    class Holder:
        @batch(**options)
        async def method(self, key1: list[str], key2: list[str]) -> list[tuple[str, str]]:
            return list(zip(key1, key2, strict=True))

    return Holder().method if use_class else function


# -- the decorator -------------------------------------------------------------------------


def test_bare_and_parametrised_forms_accept_what_ray_accepts() -> None:
    @batch
    async def bare(requests: list[int]) -> list[int]:
        return requests

    @batch(max_batch_size=1.0, batch_wait_timeout_s=0)  # an integral float is an int
    async def integral(requests: list[int]) -> list[int]:
        return requests

    @batch(batch_wait_timeout_s=0.0)
    async def no_parameters() -> None:  # refused only when called, as in Ray
        return None

    class Holder:
        @batch
        async def method(self) -> None:
            return None

    assert integral._get_max_batch_size() == 1
    assert bare._get_max_batch_size() == 10 and bare._get_batch_wait_timeout_s() == 0.01
    assert Holder.method._get_batch_wait_timeout_s() == 0.01


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"max_batch_size": 0}, ValueError, "max_batch_size must be an integer >= 1, got 0"),
        ({"max_batch_size": 1.5}, TypeError, "max_batch_size must be an integer >= 1, got 1.5"),
        ({"max_batch_size": True}, TypeError, "max_batch_size must be an integer"),
        ({"batch_wait_timeout_s": -0.5}, ValueError, "batch_wait_timeout_s must be a finite"),
        ({"batch_wait_timeout_s": "a"}, TypeError, "batch_wait_timeout_s must be a number"),
        ({"batch_wait_timeout_s": float("inf")}, ValueError, "batch_wait_timeout_s must be"),
        ({"max_concurrent_batches": 0}, ValueError, "max_concurrent_batches must be an int"),
        ({"max_concurrent_batches": 1.5}, TypeError, "max_concurrent_batches must be an int"),
        ({"batch_size_fn": 3}, TypeError, "batch_size_fn must be callable or None"),
        ({"deadline_ms": -1}, ValueError, "deadline_ms must be"),
        ({"shed_late": True}, ValueError, "shed_late=True needs an slo"),
    ],
)
def test_bad_settings_are_refused_with_the_setting_named(
    options: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):

        @batch(**options)
        async def handler(requests: list[int]) -> list[int]:
            return requests


@pytest.mark.parametrize("parametrised", [True, False])
def test_a_sync_handler_is_refused_at_decoration(parametrised: bool) -> None:
    def sync_handler(requests: list[int]) -> list[int]:
        return requests

    decorate = batch(max_batch_size=4) if parametrised else batch
    with pytest.raises(TypeError, match="must be 'async def'"):
        decorate(sync_handler)


def test_the_handler_looks_like_the_function_it_wraps() -> None:
    async def handle(requests: list[int]) -> list[int]:
        """Doubles."""
        return [2 * r for r in requests]

    async def stream(requests: list[int]) -> AsyncIterator[list[int]]:
        yield requests

    handler = batch(handle)
    assert handler.__name__ == "handle" and handler.__doc__ == "Doubles."
    assert handler.__wrapped__ is handle  # type: ignore[attr-defined]
    # a server that inspects its handlers sees what Ray's decorator shows it
    assert inspect.iscoroutinefunction(handler)
    assert not inspect.isasyncgenfunction(batch(stream))


# -- batches, windows, errors --------------------------------------------------------------


@pytest.mark.parametrize("use_class", [True, False])
async def test_a_cap_of_one_answers_each_call_alone_and_raises_the_models_error(
    use_class: bool,
) -> None:
    call = echo_handler(use_class, max_batch_size=1, batch_wait_timeout_s=LONG_S)
    assert await asyncio.wait_for(call("hi"), timeout=5) == "hi"
    with pytest.raises(ZeroDivisionError):  # the model's own error, not a wrapper
        await call("raise")


@pytest.mark.parametrize("use_class", [True, False])
def test_window_zero_batches_what_arrived_while_the_model_was_busy(use_class: bool) -> None:
    gate = asyncio.Event()

    @batch(max_batch_size=2, batch_wait_timeout_s=0)
    async def function(requests: list[str]) -> list[str]:
        await gate.wait()
        if "raise" in requests:
            _ = 1 / 0
        return requests

    class Holder:
        @batch(max_batch_size=2, batch_wait_timeout_s=0)
        async def method(self, requests: list[str]) -> list[str]:
            return await function.__wrapped__(requests)  # type: ignore[attr-defined,no-any-return]

    call = Holder().method if use_class else function

    async def main() -> None:
        first = asyncio.ensure_future(call("alone"))
        assert await pending_after([first], 0.01) == 1  # running, blocked on the gate
        second = asyncio.ensure_future(call("hi"))
        third = asyncio.ensure_future(call("raise"))
        gate.set()
        assert await first == "alone"
        for task in (second, third):  # one batch: both get its error
            with pytest.raises(ZeroDivisionError):
                await task

    run_in_virtual_time(main())


def test_the_window_counts_from_the_oldest_call_and_a_full_batch_leaves_at_once() -> None:
    batches: list[int] = []

    @batch(max_batch_size=10, batch_wait_timeout_s=0.25)
    async def handler(requests: list[None]) -> list[str]:
        batches.append(len(requests))
        return ["done"] * len(requests)

    async def main() -> None:
        for _ in range(2):
            tasks = [asyncio.ensure_future(handler(None)) for _ in range(9)]
            assert await pending_after(tasks, 0.05) == 9  # waiting for company
            tasks.append(asyncio.ensure_future(handler(None)))
            assert await pending_after(tasks, 0.01) == 0  # the tenth fills the batch
            assert {t.result() for t in tasks} == {"done"}
            await asyncio.sleep(0.5)  # an idle gap: the next window starts with its call

    run_in_virtual_time(main())
    assert batches == [10, 10]


def test_a_queue_longer_than_the_cap_leaves_in_full_batches_without_waiting() -> None:
    batches: list[int] = []

    @batch(max_batch_size=2, batch_wait_timeout_s=10_000)
    async def handler(requests: list[int]) -> list[int]:
        batches.append(len(requests))
        return requests

    async def main() -> None:
        tasks = [asyncio.ensure_future(handler(i)) for i in range(10)]
        assert await pending_after(tasks, 0.5) == 0
        assert [t.result() for t in tasks] == list(range(10))

    run_in_virtual_time(main())
    assert batches == [2] * 5


@pytest.mark.parametrize("use_class", [True, False])
def test_a_batch_waits_for_its_cap_and_shares_its_error(use_class: bool) -> None:
    call = echo_handler(use_class, max_batch_size=3, batch_wait_timeout_s=LONG_S)

    async def main() -> None:
        for first_two, error in ((("hi1", "hi2"), None), (("hi1", "raise"), ZeroDivisionError)):
            tasks = [asyncio.ensure_future(call(arg)) for arg in first_two]
            assert await pending_after(tasks, 0.1) == 2
            tasks.append(asyncio.ensure_future(call("hi3")))
            assert await pending_after(tasks, 1.0) == 0
            if error is None:
                assert [t.result() for t in tasks] == ["hi1", "hi2", "hi3"]
            else:
                assert all(isinstance(t.exception(), error) for t in tasks)

    run_in_virtual_time(main())


# -- arguments -----------------------------------------------------------------------------

CALL_STYLES: dict[str, Callable[[Callable[..., Any], str, str], Any]] = {
    "positional": lambda f, a, b: f(a, b),
    "keyword": lambda f, a, b: f(key1=a, key2=b),
    "mixed": lambda f, a, b: f(a, key2=b),
    "keyword, reversed": lambda f, a, b: f(key2=b, key1=a),
}


@pytest.mark.parametrize("style", list(CALL_STYLES))
@pytest.mark.parametrize("use_class", [True, False])
async def test_each_parameter_is_batched_as_a_list_however_it_is_passed(
    style: str, use_class: bool
) -> None:
    handler = pairs_handler(use_class, max_batch_size=2, batch_wait_timeout_s=LONG_S)
    call = CALL_STYLES[style]
    results = await asyncio.wait_for(
        asyncio.gather(call(handler, "a1", "a2"), call(handler, "b1", "b2")), timeout=5
    )
    assert results == [("a1", "a2"), ("b1", "b2")]


async def test_calls_in_different_styles_share_a_batch() -> None:
    seen: list[tuple[list[str], list[str]]] = []

    @batch(max_batch_size=2, batch_wait_timeout_s=LONG_S)
    async def handler(key1: list[str], key2: list[str]) -> list[str]:
        seen.append((key1, key2))
        return [a + b for a, b in zip(key1, key2, strict=True)]

    results = await asyncio.wait_for(
        asyncio.gather(handler("a", "b"), handler(key2="d", key1="c")), timeout=5
    )
    assert results == ["ab", "cd"]
    assert seen == [(["a", "c"], ["b", "d"])]


async def test_defaults_keyword_only_and_extra_arguments_are_batched_too() -> None:
    seen: list[Any] = []

    @batch(max_batch_size=2, batch_wait_timeout_s=LONG_S)
    async def handler(
        text: list[str], *extra: list[int], scale: list[int] | None = None, **tags: list[str]
    ) -> list[str]:
        seen.append((text, extra, scale, tags))
        return [f"{t}{s}" for t, s in zip(text, scale or [], strict=True)]

    results = await asyncio.wait_for(
        asyncio.gather(handler("a", 1, lang="en"), handler("b", 2, scale=3, lang="de")),
        timeout=5,
    )
    assert results == ["aNone", "b3"]
    assert seen == [(["a", "b"], ([1, 2],), [None, 3], {"lang": ["en", "de"]})]


async def test_a_call_that_does_not_fit_the_signature_raises_type_error() -> None:
    handler = pairs_handler(False, max_batch_size=2)
    with pytest.raises(TypeError, match="key2"):
        await handler("only one")


async def test_calls_that_cannot_be_lined_up_fail_their_batch_with_type_error() -> None:
    @batch(max_batch_size=2, batch_wait_timeout_s=LONG_S)
    async def handler(*values: list[int]) -> list[int]:
        return [0, 0]

    outcomes = await asyncio.wait_for(
        asyncio.gather(handler(1), handler(1, 2), return_exceptions=True), timeout=5
    )
    assert all(isinstance(o, TypeError) for o in outcomes)
    assert "as many extra positional arguments" in str(outcomes[0])


# -- cancellation --------------------------------------------------------------------------


def start_calls(handler: Callable[..., Any], streams: bool) -> list[asyncio.Task[Any]]:
    """Two calls, as tasks (for a streaming handler: the read of the first element)."""
    if streams:
        generators = [handler("a1", "a2"), handler("b1", "b2")]
        return [asyncio.ensure_future(g.__anext__()) for g in generators]
    return [asyncio.ensure_future(handler("a1", "a2")), asyncio.ensure_future(handler("b1", "b2"))]


def blocked_handlers(gate: asyncio.Event, reached: list[bool], use_class: bool) -> Any:
    """A unary and a streaming two-parameter handler that wait for ``gate``."""

    async def unary(key1: list[str], key2: list[str]) -> list[tuple[str, str]]:
        await gate.wait()
        reached.append(True)
        return list(zip(key1, key2, strict=True))

    async def streaming(key1: list[str], key2: list[str]) -> AsyncIterator[Any]:
        yield await unary(key1, key2)

    options = {"max_batch_size": 2, "batch_wait_timeout_s": LONG_S}

    class Holder:
        @batch(**options)
        async def unary(self, key1: list[str], key2: list[str]) -> list[tuple[str, str]]:
            return await unary(key1, key2)

        @batch(**options)
        async def streaming(self, key1: list[str], key2: list[str]) -> AsyncIterator[Any]:
            async for step in streaming(key1, key2):
                yield step

    if use_class:
        holder = Holder()
        return holder.unary, holder.streaming
    return batch(**options)(unary), batch(**options)(streaming)


@pytest.mark.parametrize("use_class", [True, False])
@pytest.mark.parametrize("streams", [True, False])
async def test_cancelling_callers_of_a_running_batch_leaves_the_others(
    use_class: bool, streams: bool
) -> None:
    gate = asyncio.Event()
    reached: list[bool] = []
    unary, streaming = blocked_handlers(gate, reached, use_class)
    handler = streaming if streams else unary
    tasks = start_calls(handler, streams)
    assert await pending_after(tasks, 0.01) == 2
    tasks[0].cancel()
    assert await pending_after(tasks, 0.01) == 1  # the other caller still waits
    tasks[1].cancel()
    assert await pending_after(tasks, 0.01) == 0
    assert reached == []  # the batch never got past the gate meanwhile
    gate.set()
    fresh = start_calls(handler, streams)
    assert await asyncio.wait_for(asyncio.gather(*fresh), timeout=5) == [
        ("a1", "a2"),
        ("b1", "b2"),
    ]


@pytest.mark.parametrize("use_class", [True, False])
@pytest.mark.parametrize("streams", [True, False])
async def test_calls_cancelled_around_a_failing_batch_leave_the_handler_working(
    use_class: bool, streams: bool
) -> None:
    failing = [True]

    async def unary(key1: list[str], key2: list[str]) -> list[tuple[str, str]]:
        if failing[0]:
            raise ValueError("not yet")
        return list(zip(key1, key2, strict=True))

    async def streaming(key1: list[str], key2: list[str]) -> AsyncIterator[Any]:
        yield await unary(key1, key2)

    options = {"max_batch_size": 2, "batch_wait_timeout_s": LONG_S}

    class Holder:
        @batch(**options)
        async def unary(self, key1: list[str], key2: list[str]) -> list[tuple[str, str]]:
            return await unary(key1, key2)

        @batch(**options)
        async def streaming(self, key1: list[str], key2: list[str]) -> AsyncIterator[Any]:
            async for step in streaming(key1, key2):
                yield step

    holder = Holder()
    if use_class:
        handler = holder.streaming if streams else holder.unary
    else:
        handler = batch(**options)(streaming if streams else unary)
    for task in start_calls(handler, streams):
        task.cancel()
    await asyncio.sleep(0)
    failing[0] = False
    results = await asyncio.wait_for(asyncio.gather(*start_calls(handler, streams)), timeout=5)
    assert results == [("a1", "a2"), ("b1", "b2")]


# -- setters -------------------------------------------------------------------------------


@pytest.mark.parametrize("use_class", [True, False])
async def test_setters_raise_the_cap_above_the_first_one(use_class: bool) -> None:
    handler: Any = pairs_handler(use_class, max_batch_size=2, batch_wait_timeout_s=LONG_S)
    assert (handler._get_max_batch_size(), handler._get_batch_wait_timeout_s()) == (2, LONG_S)
    first = [asyncio.ensure_future(handler(f"a{i}", f"b{i}")) for i in range(2)]
    assert await pending_after(first, 1) == 0
    handler.set_max_batch_size(3)
    handler.set_batch_wait_timeout_s(15_000)
    assert (handler._get_max_batch_size(), handler._get_batch_wait_timeout_s()) == (3, 15_000)
    second = [asyncio.ensure_future(handler(f"a{i}", f"b{i}")) for i in range(3)]
    assert await pending_after(second[:2] + second[2:], 1) == 0  # a batch of three, full
    assert [t.result() for t in second] == [("a0", "b0"), ("a1", "b1"), ("a2", "b2")]


def test_setters_apply_to_the_batch_being_collected() -> None:
    """Ours, on purpose (Ray keeps the settings a batch started collecting with): lowering the
    window or the cap releases the calls that wait at once."""
    handler: Any = pairs_handler(False, max_batch_size=3, batch_wait_timeout_s=15_000)

    async def main() -> None:
        tasks = [asyncio.ensure_future(handler(f"a{i}", f"b{i}")) for i in range(2)]
        assert await pending_after(tasks, 0.1) == 2
        handler.set_batch_wait_timeout_s(0)
        assert await pending_after(tasks, 0.1) == 0
        assert [t.result() for t in tasks] == [("a0", "b0"), ("a1", "b1")]

    run_in_virtual_time(main())


async def test_set_max_concurrent_batches_lets_batches_run_side_by_side() -> None:
    running: list[int] = []
    most: list[int] = [0]
    gate = asyncio.Event()

    @batch(max_batch_size=1, batch_wait_timeout_s=0)
    async def handler(requests: list[int]) -> list[int]:
        running.append(1)
        most[0] = max(most[0], len(running))
        await gate.wait()
        running.pop()
        return requests

    handler.set_max_concurrent_batches(3)
    assert handler._get_max_concurrent_batches() == 3  # type: ignore[attr-defined]
    tasks = [asyncio.ensure_future(handler(i)) for i in range(3)]
    await asyncio.sleep(0.01)
    assert most == [3]
    gate.set()
    assert await asyncio.wait_for(asyncio.gather(*tasks), timeout=5) == [0, 1, 2]


def test_setters_check_their_values() -> None:
    handler = pairs_handler(False)
    with pytest.raises(ValueError, match="max_batch_size must be an integer >= 1, got 0"):
        handler.set_max_batch_size(0)  # type: ignore[attr-defined]
    with pytest.raises(TypeError, match="batch_wait_timeout_s must be a number"):
        handler.set_batch_wait_timeout_s("1")  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="max_concurrent_batches must be an integer >= 1"):
        handler.set_max_concurrent_batches(0)  # type: ignore[attr-defined]
    assert handler._get_max_batch_size() == 10  # type: ignore[attr-defined]


# -- streaming -----------------------------------------------------------------------------


def pairs_stream(use_class: bool, steps: int) -> Callable[..., Any]:
    options = {"max_batch_size": 2, "batch_wait_timeout_s": LONG_S}

    @batch(**options)
    async def function(key1: list[str], key2: list[str]) -> AsyncIterator[list[Any]]:
        for step in range(steps):
            yield [(step, a, b) for a, b in zip(key1, key2, strict=True)]

    class Holder:
        @batch(**options)
        async def method(self, key1: list[str], key2: list[str]) -> AsyncIterator[list[Any]]:
            for step in range(steps):
                yield [(step, a, b) for a, b in zip(key1, key2, strict=True)]

    return Holder().method if use_class else function


@pytest.mark.parametrize("steps", [0, 2, 5])
@pytest.mark.parametrize("use_class", [True, False])
@pytest.mark.parametrize("style", list(CALL_STYLES))
async def test_a_streaming_handler_gives_each_caller_its_elements(
    steps: int, use_class: bool, style: str
) -> None:
    handler = pairs_stream(use_class, steps)
    call = CALL_STYLES[style]
    streams = [call(handler, "a1", "a2"), call(handler, "b1", "b2")]  # both queued now
    first = await asyncio.wait_for(_read(streams[0]), timeout=5)  # read one to its end first
    second = await _read(streams[1])
    assert first == [(step, "a1", "a2") for step in range(steps)]
    assert second == [(step, "b1", "b2") for step in range(steps)]


async def _read(stream: AsyncIterator[Any]) -> list[Any]:
    return [element async for element in stream]


@pytest.mark.parametrize("failure", ["raises", "wrong length"])
async def test_a_failing_stream_raises_after_its_elements_then_ends(failure: str) -> None:
    @batch(max_batch_size=2, batch_wait_timeout_s=LONG_S)
    async def handler(key1: list[str], key2: list[str]) -> AsyncIterator[list[Any]]:
        for step in range(5):
            row = [(step, a, b) for a, b in zip(key1, key2, strict=True)]
            if step == 2:
                if failure == "raises":
                    raise RuntimeError("model broke")
                yield row * 2
            yield row

    expected = RuntimeError if failure == "raises" else BatchSizeMismatchError
    streams = [handler("a1", "a2"), handler("b1", "b2")]
    for args, stream in zip([("a1", "a2"), ("b1", "b2")], streams, strict=True):
        assert [await stream.__anext__() for _ in range(2)] == [(0, *args), (1, *args)]
        with pytest.raises(expected):
            await asyncio.wait_for(stream.__anext__(), timeout=5)
        with pytest.raises(StopAsyncIteration):
            await stream.__anext__()


@pytest.mark.parametrize("marker", [StopAsyncIteration, StopIteration])
async def test_a_stop_marker_ends_callers_one_after_another(marker: type[Exception]) -> None:
    callers = 4
    step_done = asyncio.Event()

    @batch(max_batch_size=callers, batch_wait_timeout_s=LONG_S)
    async def handler(ids: list[int]) -> AsyncIterator[list[Any]]:
        for finished in range(1, callers + 1):
            step_done.clear()
            yield [marker] * finished + ids[finished:]
            await step_done.wait()

    streams = [handler(i) for i in range(callers)]
    for caller, stream in enumerate(streams):
        assert await asyncio.wait_for(_read(stream), timeout=5) == [caller] * caller
        step_done.set()


async def test_setters_work_while_a_batch_streams() -> None:
    @batch(max_batch_size=2, batch_wait_timeout_s=LONG_S)
    async def handler(key1: list[str], key2: list[str]) -> AsyncIterator[list[Any]]:
        for _ in range(3):
            yield list(zip(key1, key2, strict=True))

    first = [handler("a1", "a2"), handler("b1", "b2")]
    for stream, expected in zip(first, [("a1", "a2"), ("b1", "b2")], strict=True):
        assert [await stream.__anext__() for _ in range(2)] == [expected, expected]
    handler.set_max_batch_size(3)  # type: ignore[attr-defined]
    handler.set_batch_wait_timeout_s(15_000)  # type: ignore[attr-defined]
    second = [handler(f"a{i}", f"b{i}") for i in range(3)]
    for stream, expected in zip(first, [("a1", "a2"), ("b1", "b2")], strict=True):
        assert await _read(stream) == [expected]
    for i, stream in enumerate(second):
        assert await asyncio.wait_for(_read(stream), timeout=5) == [(f"a{i}", f"b{i}")] * 3


# -- batch_size_fn -------------------------------------------------------------------------


def sized_handler(cap: int, wait_s: float, batches: list[list[str]]) -> Any:
    @batch(
        max_batch_size=cap,
        batch_wait_timeout_s=wait_s,
        batch_size_fn=lambda items: sum(item["size"] for item in items),
    )
    async def handler(requests: list[dict[str, Any]]) -> list[str]:
        batches.append([r["value"] for r in requests])
        return [r["value"] for r in requests]

    return handler


def test_an_item_that_does_not_fit_waits_for_the_next_batch() -> None:
    batches: list[list[str]] = []
    handler = sized_handler(10, 0.05, batches)

    async def main() -> list[str]:
        calls = [handler({"size": 6, "value": v}) for v in ("first", "second")]
        return list(await asyncio.gather(*calls))

    assert run_in_virtual_time(main()) == ["first", "second"]
    assert batches == [["first"], ["second"]]


def test_items_that_fit_share_a_batch() -> None:
    batches: list[list[str]] = []
    handler = sized_handler(20, 0.1, batches)

    async def main() -> list[str]:
        calls = [handler({"size": s, "value": v}) for s, v in ((5, "a"), (6, "b"), (7, "c"))]
        return list(await asyncio.gather(*calls))

    assert run_in_virtual_time(main()) == ["a", "b", "c"]
    assert batches == [["a", "b", "c"]]


def test_an_item_larger_than_the_cap_raises_runtime_error() -> None:
    batches: list[list[str]] = []
    handler = sized_handler(10, 0.05, batches)

    async def main() -> None:
        fitting = asyncio.ensure_future(handler({"size": 6, "value": "first"}))
        with pytest.raises(RuntimeError, match="greater than max_batch_size") as raised:
            await handler({"size": 12, "value": "second"})
        assert isinstance(raised.value, ItemTooLargeError)  # ours too
        assert isinstance(raised.value, ItemTooLargeForBatchError)
        assert await fitting == "first"

    run_in_virtual_time(main())
    assert batches == [["first"]]


async def test_batch_size_fn_sees_the_first_argument_of_a_multi_argument_call() -> None:
    seen: list[list[Any]] = []

    def size(items: list[str]) -> int:
        seen.append(items)
        return len(items[0])

    @batch(max_batch_size=4, batch_wait_timeout_s=0, batch_size_fn=size)
    async def handler(text: list[str], tag: list[str]) -> list[str]:
        return [t + g for t, g in zip(text, tag, strict=True)]

    assert await handler("abc", tag="!") == "abc!"
    assert seen == [["abc"]]
    with pytest.raises(RuntimeError):
        await handler("abcde", tag="?")


# -- where we differ from Ray on purpose, and our own options ---------------------------------


async def test_each_instance_has_its_own_batcher_and_is_answered_as_itself() -> None:
    class Model:
        def __init__(self, tag: str) -> None:
            self.tag = tag
            self.batches: list[list[str]] = []

        @batch(max_batch_size=4, batch_wait_timeout_s=0.05)
        async def handle(self, requests: list[str]) -> list[str]:
            self.batches.append(list(requests))
            return [f"{self.tag}:{r}" for r in requests]

    one, two = Model("one"), Model("two")
    results = await asyncio.wait_for(
        asyncio.gather(one.handle("a"), two.handle("b"), one.handle("c")), timeout=5
    )
    assert results == ["one:a", "two:b", "one:c"]
    assert (one.batches, two.batches) == ([["a", "c"]], [["b"]])
    assert Model.handle.get_batcher(one) is not Model.handle.get_batcher(two)  # type: ignore[attr-defined]


def test_each_event_loop_has_its_own_batcher() -> None:
    @batch(max_batch_size=2, batch_wait_timeout_s=0.01)
    async def handler(requests: list[int]) -> list[int]:
        return [r + 1 for r in requests]

    assert asyncio.run(handler(1)) == 2
    assert asyncio.run(handler(2)) == 3  # a new loop gets a new batcher


async def test_an_exception_instance_in_a_slot_is_raised_to_that_caller_only() -> None:
    @batch(max_batch_size=2, batch_wait_timeout_s=LONG_S)
    async def handler(requests: list[int]) -> list[Any]:
        return [KeyError(r) if r < 0 else r for r in requests]

    outcomes = await asyncio.wait_for(
        asyncio.gather(handler(-1), handler(2), return_exceptions=True), timeout=5
    )
    assert isinstance(outcomes[0], KeyError) and outcomes[1] == 2


async def test_a_wrong_number_of_results_is_a_result_count_error() -> None:
    @batch(max_batch_size=1)
    async def handler(requests: list[int]) -> list[int]:
        return [*requests, 0]

    with pytest.raises(BatchSizeMismatchError) as raised:
        await handler(1)
    assert isinstance(raised.value, ResultCountError)


async def test_our_options_slo_deadline_and_queue_bound() -> None:
    gate = asyncio.Event()

    @batch(
        max_batch_size=1,
        batch_wait_timeout_s=0,
        slo=SLO(latency_ms=50),
        deadline_ms=20,
        max_queue_size=1,
    )
    async def handler(requests: list[int]) -> list[int]:
        await gate.wait()
        return requests

    running = asyncio.ensure_future(handler(0))
    await asyncio.sleep(0)
    queued = asyncio.ensure_future(handler(1))
    await asyncio.sleep(0)
    with pytest.raises(QueueFullError):
        await handler(2)
    with pytest.raises(DeadlineExceededError):
        await queued
    stats = handler.get_batcher().stats()  # type: ignore[attr-defined]
    assert stats.slo == SLO(latency_ms=50) and stats.policy is not None
    gate.set()
    assert await running == 0
    await handler.aclose()  # type: ignore[attr-defined]


async def test_a_stream_that_cannot_be_queued_raises_at_its_first_read() -> None:
    @batch(max_batch_size=2, batch_size_fn=lambda items: 5)
    async def handler(requests: list[int]) -> AsyncIterator[list[int]]:
        yield requests

    stream = handler(1)  # nothing raised yet, as in Ray
    with pytest.raises(RuntimeError, match="greater than max_batch_size"):
        await stream.__anext__()
    with pytest.raises(StopAsyncIteration):
        await stream.__anext__()


def test_the_package_and_the_shim_work_without_ray() -> None:
    """``import adaptive_batcher`` never imports Ray, and the shim runs where Ray is missing."""
    code = """
import asyncio, sys
sys.modules["ray"] = None  # any import of ray now fails, as if it were not installed
import adaptive_batcher
from adaptive_batcher.ray import BatchSizeMismatchError, batch

@batch(max_batch_size=2, batch_wait_timeout_s=0.001)
async def double(values):
    return [2 * v for v in values]

assert asyncio.run(double(21)) == 42
assert BatchSizeMismatchError.__mro__[1:3] == (
    adaptive_batcher.ResultCountError, adaptive_batcher.BatcherError)
print("ok")
"""
    plain = subprocess.run(
        [sys.executable, "-c", "import sys, adaptive_batcher; print('ray' in sys.modules)"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert plain.stdout.strip() == "False"
    without = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=120
    )
    assert without.stdout.splitlines()[-1:] == ["ok"], without.stderr

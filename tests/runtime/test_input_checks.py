"""The runtime's input checks: exact messages naming the argument; numpy integers are ints."""

from __future__ import annotations

import gc
import re
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from adaptive_batcher import SLO, AdaptiveBatcher, ItemSizeError
from adaptive_batcher.testing import EchoModel


def exactly(message: str) -> str:
    return f"^{re.escape(message)}$"


def items_then_failure() -> Iterator[int]:
    yield 1
    yield 2
    raise LookupError("the item source broke")


async def test_submit_many_over_a_raising_generator_raises_its_error_and_submits_nothing() -> None:
    model = EchoModel()
    async with AdaptiveBatcher(model, window_ms=0) as batcher:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with pytest.raises(LookupError, match=exactly("the item source broke")):
                await batcher.submit_many(items_then_failure())
            gc.collect()  # a coroutine never awaited warns when it is collected
        assert [str(w.message) for w in caught] == []
        assert batcher.stats().counts.submitted == 0
        assert await batcher.submit_many(iter([3, 4])) == [3, 4]  # still serving
    assert model.batches == [[3, 4]]


async def test_size_fn_may_return_any_integral() -> None:
    model = EchoModel()
    sizes = {"a": np.int64(2), "b": np.int32(1), "c": 1}
    async with AdaptiveBatcher(model, max_batch_size=4, window_ms=1, size_fn=sizes.get) as batcher:
        assert await batcher.submit_many(["a", "b", "c"]) == ["a", "b", "c"]
    assert model.batches == [["a", "b", "c"]]  # 2 + 1 + 1 units fill the cap of 4
    assert batcher.recorder.counts().submitted == 3


@pytest.mark.parametrize(
    ("size", "message"),
    [
        (1.5, "size_fn(item) must be an int, got float"),
        (2.0, "size_fn(item) must be an int, got float"),
        (True, "size_fn(item) must be an int, got bool"),
        (np.True_, "size_fn(item) must be an int, got bool"),
        (None, "size_fn(item) must be an int, got NoneType"),
        ("2", "size_fn(item) must be an int, got str"),
        (0, "size_fn must return an int >= 1, got 0"),
        (-3, "size_fn must return an int >= 1, got -3"),
    ],
)
async def test_a_bad_size_is_refused_naming_size_fn(size: object, message: str) -> None:
    """A typed error (a ValueError, as for an item too large), counted as a refused request."""
    model = EchoModel()
    async with AdaptiveBatcher(model, window_ms=0, size_fn=lambda _: size) as batcher:
        with pytest.raises(ItemSizeError, match=exactly(message)):
            await batcher.submit("x")
        assert batcher.stats().queue_depth == 0
    assert model.batches == []
    counts = batcher.stats().counts
    assert (counts.submitted, counts.rejected) == (1, 1)


async def test_a_size_fn_that_raises_refuses_the_item_with_the_cause() -> None:
    def size_fn(item: str) -> int:
        raise KeyError(item)

    async with AdaptiveBatcher(EchoModel(), size_fn=size_fn) as batcher:
        with pytest.raises(ItemSizeError, match="size_fn raised for this item: KeyError") as info:
            await batcher.submit("x")
        with pytest.raises(ItemSizeError):  # the same check guards submit_many
            await batcher.submit_many(["y"])
    assert isinstance(info.value.__cause__, KeyError)
    counts = batcher.stats().counts
    assert (counts.submitted, counts.rejected) == (2, 2)


@pytest.mark.parametrize(("guards", "kind"), [(5, "int"), (True, "bool"), ("guard", "str")])
def test_guards_must_be_a_sequence(guards: object, kind: str) -> None:
    message = f"guards must be a sequence of guard factories, got {kind}"
    with pytest.raises(TypeError, match=exactly(message)):
        AdaptiveBatcher(EchoModel(), guards=guards)  # type: ignore[arg-type]


def test_guards_from_a_generator_are_kept() -> None:
    from adaptive_batcher.control.guards import BudgetGuard

    batcher = AdaptiveBatcher(
        EchoModel(), slo=SLO(latency_ms=50), guards=(g for g in [BudgetGuard])
    )
    controller = batcher._core.controller
    assert controller is not None
    assert controller.chain.name == "BudgetGuard(pid)"  # the generator was not used up by the check


@pytest.mark.parametrize(
    ("batch_sizes", "message"),
    [
        (8, "batch_sizes must be a sequence of ints, got int"),
        (True, "batch_sizes must be a sequence of ints, got bool"),
        ("1248", "batch_sizes must be a sequence of ints, got str"),
        ([1, 2.0], "batch_sizes[1] must be an int, got float"),
    ],
)
def test_batch_sizes_of_the_wrong_type_are_named(batch_sizes: object, message: str) -> None:
    with pytest.raises(TypeError, match=exactly(message)):
        AdaptiveBatcher(EchoModel(), max_batch_size=1, batch_sizes=batch_sizes)  # type: ignore[arg-type]


def test_cuda_event_factory_must_be_callable() -> None:
    with pytest.raises(TypeError, match=exactly("cuda_event_factory must be callable, got str")):
        AdaptiveBatcher(EchoModel(), cuda_event_factory="event")  # type: ignore[arg-type]


async def test_numpy_scalars_are_ints_and_numbers_for_the_constructor_and_set_limits() -> None:
    model = EchoModel()
    batcher = AdaptiveBatcher(
        model,
        max_batch_size=np.int64(8),  # type: ignore[arg-type]
        window_ms=np.float32(1.0),  # type: ignore[arg-type]
        max_concurrent_batches=np.int32(2),  # type: ignore[arg-type]
        max_queue_size=np.int64(100),  # type: ignore[arg-type]
        batch_sizes=np.array([2, 4, 8]),
        control_interval_ms=np.int64(50),  # type: ignore[arg-type]
        control_interval_batches=np.uint8(4),  # type: ignore[arg-type]
        telemetry_hz=np.float64(10.0),
    )
    async with batcher:
        stats = batcher.stats()
        assert (stats.max_batch_size, stats.window_ms, stats.max_concurrent_batches) == (8, 1.0, 2)
        assert type(stats.max_batch_size) is int
        batcher.set_limits(window_ms=np.float64(0.0), max_batch_size=np.int16(4))  # type: ignore[arg-type]
        assert (batcher.stats().max_batch_size, batcher.stats().window_ms) == (4, 0.0)
        assert await batcher.submit_many(range(3), deadline_ms=np.int64(1000)) == [0, 1, 2]
    buckets = batcher._core.settings.buckets
    assert buckets == (2, 4, 8) and all(type(b) is int for b in buckets)


def test_numpy_bools_are_bools() -> None:
    batcher = AdaptiveBatcher(
        EchoModel(),
        slo=SLO(latency_ms=50),
        shed_late=np.True_,  # type: ignore[arg-type]
        bisect_on_error=np.False_,  # type: ignore[arg-type]
    )
    assert batcher._core.settings.shed_late is True


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"shed_late": 1}, "shed_late must be a bool, got int"),
        ({"shed_late": np.int64(1)}, "shed_late must be a bool, got int64"),
        ({"bisect_on_error": "yes"}, "bisect_on_error must be a bool, got str"),
        ({"bisect_on_error": None}, "bisect_on_error must be a bool, got NoneType"),
    ],
)
def test_flags_must_be_bools(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(TypeError, match=exactly(message)):
        AdaptiveBatcher(EchoModel(), slo=SLO(latency_ms=50), **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(("make_item", "kind"), [(None, "NoneType"), (1, "int")])
async def test_warmup_refuses_a_make_item_that_is_not_callable(make_item: Any, kind: str) -> None:
    model = EchoModel()
    async with AdaptiveBatcher(model, max_batch_size=4) as batcher:
        with pytest.raises(TypeError, match=exactly(f"make_item must be callable, got {kind}")):
            await batcher.warmup(make_item)
    assert model.batches == []


@pytest.mark.parametrize(
    ("items", "kind"),
    [
        (5, "int"),
        (None, "NoneType"),
        ("abc", "str"),
        (bytearray(b"ab"), "bytearray"),
        (memoryview(b"ab"), "memoryview"),
    ],
)
async def test_submit_many_refuses_items_that_are_not_a_sequence(items: Any, kind: str) -> None:
    model = EchoModel()
    async with AdaptiveBatcher(model, window_ms=0) as batcher:
        with pytest.raises(
            TypeError, match=exactly(f"items must be a sequence of inputs, got {kind}")
        ):
            await batcher.submit_many(items)
        assert batcher.stats().counts.submitted == 0
    assert model.batches == []


@pytest.mark.parametrize("flag", ["no", 1, None])
async def test_submit_many_refuses_a_return_exceptions_that_is_not_a_bool(flag: Any) -> None:
    """Before: a truthy "no" returned the exceptions in place instead of raising them."""
    model = EchoModel()
    async with AdaptiveBatcher(model, window_ms=0) as batcher:
        with pytest.raises(
            TypeError,
            match=exactly(f"return_exceptions must be a bool, got {type(flag).__name__}"),
        ):
            await batcher.submit_many([1, 2], return_exceptions=flag)
        assert batcher.stats().counts.submitted == 0
    assert model.batches == []

"""The runtime's input checks: exact messages naming the argument; numpy integers are ints."""

from __future__ import annotations

import gc
import re
import warnings
from collections.abc import Iterator

import numpy as np
import pytest

from adaptive_batcher import SLO, AdaptiveBatcher
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
    ("size", "error", "message"),
    [
        (1.5, TypeError, "size_fn(item) must be an int, got float"),
        (2.0, TypeError, "size_fn(item) must be an int, got float"),
        (True, TypeError, "size_fn(item) must be an int, got bool"),
        (None, TypeError, "size_fn(item) must be an int, got NoneType"),
        ("2", TypeError, "size_fn(item) must be an int, got str"),
        (0, ValueError, "size_fn must return an int >= 1, got 0"),
        (-3, ValueError, "size_fn must return an int >= 1, got -3"),
    ],
)
async def test_a_bad_size_is_refused_naming_size_fn(
    size: object, error: type[Exception], message: str
) -> None:
    model = EchoModel()
    async with AdaptiveBatcher(model, window_ms=0, size_fn=lambda _: size) as batcher:
        with pytest.raises(error, match=exactly(message)):
            await batcher.submit("x")
        assert batcher.stats().queue_depth == 0
    assert model.batches == []


async def test_a_numpy_bool_size_is_refused() -> None:
    async with AdaptiveBatcher(EchoModel(), size_fn=lambda _: np.True_) as batcher:
        with pytest.raises(TypeError, match=exactly("size_fn(item) must be an int, got bool")):
            await batcher.submit("x")


@pytest.mark.parametrize(("guards", "kind"), [(5, "int"), (True, "bool"), ("guard", "str")])
def test_guards_must_be_a_sequence(guards: object, kind: str) -> None:
    message = f"guards must be a sequence of guard factories, got {kind}"
    with pytest.raises(TypeError, match=exactly(message)):
        AdaptiveBatcher(EchoModel(), guards=guards)  # type: ignore[arg-type]


def test_guards_from_a_generator_are_kept() -> None:
    from adaptive_batcher.control.guards import BudgetGuard

    batcher = AdaptiveBatcher(EchoModel(), slo=SLO(p99_ms=50), guards=(g for g in [BudgetGuard]))
    controller = batcher._controller
    assert controller is not None
    assert controller.chain.name == "BudgetGuard(pid)"  # the generator was not used up by the check

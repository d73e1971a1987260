"""The result-reshaping adapters refuse a model output whose rows do not match its input's:
every caller gets ``ResultCountError``, never someone else's rows (numpy and torch)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from adaptive_batcher import AdaptiveBatcher, ResultCountError, concat_rows, row_count, stacked


def ones(kind: str, *shape: int) -> Any:
    return torch.ones(*shape) if kind == "torch" else np.ones(shape)


BAD_CONCAT: dict[str, tuple[Callable[[Any], Any], str]] = {
    "one row more": (
        lambda x: x[[*range(len(x)), 0]],
        r"^concat_rows: the model returned 4 rows for 3 input rows \(2 items\); expected 3$",
    ),
    "one row fewer": (
        lambda x: x[:-1],
        r"^concat_rows: the model returned 2 rows for 3 input rows \(2 items\); expected 3$",
    ),
    "a scalar": (
        lambda x: x.sum(),
        r"^concat_rows: the model returned an array of no dimension for 3 input rows "
        r"\(2 items\); expected an array of 3 rows$",
    ),
    "a list": (
        lambda x: [1, 2, 3],
        r"^concat_rows: the model returned a list for 3 input rows \(2 items\); expected an "
        r"array of 3 rows$",
    ),
}


@pytest.mark.parametrize("kind", ["numpy", "torch"])
@pytest.mark.parametrize("case", list(BAD_CONCAT))
def test_concat_rows_refuses_rows_that_do_not_match_its_input(kind: str, case: str) -> None:
    """Before (numpy, one row more): the last caller got two rows, one of them another's; with
    one fewer it got none; torch raised its own RuntimeError."""
    fn, message = BAD_CONCAT[case]
    model = concat_rows(fn)
    with pytest.raises(ResultCountError, match=message):
        model([ones(kind, 2, 3), ones(kind, 1, 3)])


BAD_STACKED: dict[str, tuple[Callable[[Any], Any], str]] = {
    "one row fewer": (
        lambda x: x[:1],
        r"^stacked: the model returned 1 rows for 2 items; expected 2$",
    ),
    "a scalar": (
        lambda x: x.sum(),
        r"^stacked: the model returned an array of no dimension for 2 items; expected an array "
        r"of 2 rows$",
    ),
    "a float": (
        lambda x: 1.0,
        r"^stacked: the model returned a float for 2 items; expected an array of 2 rows$",
    ),
}


@pytest.mark.parametrize("kind", ["numpy", "torch"])
@pytest.mark.parametrize("case", list(BAD_STACKED))
def test_stacked_refuses_rows_that_do_not_match_its_input(kind: str, case: str) -> None:
    fn, message = BAD_STACKED[case]
    with pytest.raises(ResultCountError, match=message):
        stacked(fn)([ones(kind, 3), ones(kind, 3)])


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_matching_rows_go_back_to_their_callers(kind: str) -> None:
    blocks = [ones(kind, 2, 3) * 1, ones(kind, 1, 3) * 2]
    parts = concat_rows(lambda x: x * 10)(blocks)
    assert [tuple(p.shape) for p in parts] == [(2, 3), (1, 3)]
    assert [float(p.sum()) for p in parts] == [60.0, 60.0]
    rows = stacked(lambda x: x + 1)([ones(kind, 3), ones(kind, 3)])
    assert [float(r.sum()) for r in rows] == [6.0, 6.0]


async def test_every_caller_of_a_batch_with_extra_rows_gets_result_count_error() -> None:
    model = concat_rows(lambda x: np.concatenate([x, x[:1]]))
    async with AdaptiveBatcher(
        model, max_batch_size=8, window_ms=5, size_fn=row_count, executor="inline"
    ) as batcher:
        results = await batcher.submit_many(
            [np.ones((2, 3)), np.ones((1, 3))], return_exceptions=True
        )
    assert all(type(r) is ResultCountError for r in results)
    assert str(results[1]) == (
        "concat_rows: the model returned 4 rows for 3 input rows (2 items); expected 3"
    )


@pytest.mark.parametrize(
    ("items", "message"),
    [
        (["hello", "world"], r"^stacked: item 0 is a str; items must be torch tensors or numeric"),
        ([np.ones(3), None], r"^stacked: item 1 is a NoneType; items must be"),
        ([torch.ones(3), np.ones(3)], r"^stacked: item 1 is a ndarray and item 0 a Tensor; "),
        ([np.ones(3), torch.ones(3)], r"^stacked: item 1 is a Tensor and item 0 a ndarray; "),
        ([None, torch.ones(3), torch.ones(3)], r"^stacked: item 0 is a NoneType; items must be"),
        ([np.ones(3), np.array(["a", "b", "c"])], r"^stacked: item 1 is a ndarray; items must"),
    ],
)
def test_stacked_names_the_item_that_is_no_array(items: list[Any], message: str) -> None:
    """A fresh user's str, None and list items reached the model as a numpy array of strings
    or objects, and the error named the model's input (``linear(): argument 'input' must be
    Tensor, not numpy.ndarray``), not the item."""
    with pytest.raises(TypeError, match=message):
        stacked(lambda x: x)(items)


class _ArrayLike:
    """An object numpy makes an array of (``__array__``), as pandas' and others' are."""

    def __init__(self, values: list[float]) -> None:
        self.values = values

    def __array__(self, dtype: Any = None, copy: Any = None) -> Any:
        return np.asarray(self.values, dtype=dtype)


def test_stacked_still_takes_lists_of_numbers_and_array_likes_as_numpy_items() -> None:
    rows = stacked(lambda x: x * 2)([[1.0, 2.0], [3.0, 4.0]])
    assert [r.tolist() for r in rows] == [[2.0, 4.0], [6.0, 8.0]]
    rows = stacked(lambda x: x * 2)([_ArrayLike([1.0]), _ArrayLike([2.0])])
    assert [r.tolist() for r in rows] == [[2.0], [4.0]]
    with pytest.raises(ValueError, match="same shape"):  # numpy's own, for arrays that differ
        stacked(lambda x: x)([np.ones(2), np.ones(3)])
    with pytest.raises(TypeError, match="numpy made a batch of dtype object"):
        stacked(lambda x: x)([[1.0, "a"], [2.0, None]])


async def test_a_caller_whose_item_is_no_array_gets_its_own_error() -> None:
    """With ``bisect_on_error`` only the caller that sent a str fails, with the item named."""
    model = stacked(lambda x: x + 1)
    async with AdaptiveBatcher(
        model, max_batch_size=8, window_ms=5, bisect_on_error=True, executor="inline"
    ) as batcher:
        results = await batcher.submit_many(
            [torch.ones(2), "two", torch.ones(2)], return_exceptions=True
        )
    assert [type(r).__name__ for r in results] == ["Tensor", "BatchFailedError", "Tensor"]
    assert "is a str" in str(results[1].__cause__)

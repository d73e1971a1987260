"""Adapters between a list of items (what the batcher hands over) and one tensor (what models take).

* :func:`stacked` — items are single samples of shape ``S``; the model takes ``(n, *S)``.
* :func:`concat_rows` — items are row blocks of shape ``(r_i, *S)``; the model takes
  ``(sum r_i, *S)``; each caller gets back exactly its own ``r_i`` rows. Pair it with
  ``size_fn=row_count`` so the batch cap counts rows.
* :func:`repeat_last` — the default padding: fill a batch up to a bucket size by repeating the
  last item (the padded results are dropped before anyone sees them); :func:`pad_rows` does the
  same for row blocks, with one block of zero rows.

Arrays may be ``torch.Tensor`` or ``numpy.ndarray`` (all of a batch one kind; numpy items may
also be numbers, sequences of them or array-likes); an item that is none of these (a ``str``,
``None``) raises ``TypeError`` naming it, inside the model call, so its caller gets
``BatchFailedError`` with that cause (only that caller with ``bisect_on_error``). The adapters
keep sync models sync and async models async, so the executor choice is unchanged. Both check
what the model returns before handing rows out: an output that is not an array, or whose rows
do not match the rows it was given, raises :class:`~adaptive_batcher.errors.ResultCountError`
(every caller of the batch gets its own), never someone else's rows.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from adaptive_batcher.errors import ResultCountError
from adaptive_batcher.runtime.executors import is_async_callable

__all__ = ["concat_rows", "pad_rows", "repeat_last", "row_count", "stacked"]


def repeat_last(items: list[Any], target_size: int) -> list[Any]:
    """Pad ``items`` to ``target_size`` items by repeating the last one."""
    return items + [items[-1]] * (target_size - len(items))


def pad_rows(items: list[Any], target_size: int) -> list[Any]:
    """Pad row blocks to ``target_size`` rows in total with one extra all-zero block.

    The zero block takes the shape and dtype of the last item's rows; its result is dropped.
    """
    missing = target_size - sum(row_count(i) for i in items)
    if missing <= 0:
        return items
    last = items[-1]
    if _is_torch(last):
        import torch

        block: Any = torch.zeros((missing, *last.shape[1:]), dtype=last.dtype, device=last.device)
    else:
        block = np.zeros((missing, *last.shape[1:]), dtype=last.dtype)
    return [*items, block]


def row_count(item: Any) -> int:
    """Size function for row blocks: ``item.shape[0]`` (rows), or ``len(item)``."""
    shape = getattr(item, "shape", None)
    if shape is not None and len(shape) > 0:
        return int(shape[0])
    return len(item)


def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch")


def _stack(items: list[Any]) -> Any:
    return _join("stacked", items, _torch_stack, np.stack)


def _concat(items: list[Any]) -> Any:
    return _join("concat_rows", items, _torch_cat, functools.partial(np.concatenate, axis=0))


def _torch_stack(items: list[Any]) -> Any:
    import torch

    return torch.stack(items)


def _torch_cat(items: list[Any]) -> Any:
    import torch

    return torch.cat(items, dim=0)


def _join(
    adapter: str,
    items: list[Any],
    torch_join: Callable[[list[Any]], Any],
    numpy_join: Callable[[list[Any]], Any],
) -> Any:
    """The items joined into one torch tensor or numeric numpy array. Tensors are looked at one
    by one only when torch refuses them, arrays only when not all ndarrays (the hot path).

    Raises:
        TypeError: an item is no array, sequence or number (say a str or None), or the items
            mix torch tensors with anything else, named by position and type; or numpy made
            strings, bytes or objects of the items. The model would otherwise fail on an input
            it was never meant to get (``linear(): argument 'input' must be Tensor, not
            numpy.ndarray``, in a fresh user's trial).
        ValueError, RuntimeError: numpy's or torch's, for arrays that do not fit together.
    """
    first = items[0]
    if _is_torch(first):
        try:
            return torch_join(items)
        except TypeError:  # an item that is no tensor: torch's message names none
            _check_items(adapter, items)
            raise
    if not (isinstance(first, np.ndarray) and len({type(item) for item in items}) == 1):
        _check_items(adapter, items)
    batch = numpy_join(items)
    if batch.dtype.kind in "OUSV":
        _check_items(adapter, items)  # names an array of strings or objects
        raise TypeError(
            f"{adapter}: numpy made a batch of dtype {batch.dtype} of the items; items must be "
            "torch tensors or numeric arrays"
        )
    return batch


def _check_items(adapter: str, items: list[Any]) -> None:
    """Raise ``TypeError`` naming the first item that is no array, sequence or number, else
    the first that mixes torch tensors with other kinds (see :func:`_join`)."""
    other = next((k for k, item in enumerate(items) if not _numeric_like(item)), None)
    if other is not None:
        raise TypeError(
            f"{adapter}: item {other} is a {type(items[other]).__name__}; items must be torch "
            "tensors or numeric arrays"
        )
    kinds = [_is_torch(item) for item in items]
    if any(kinds) and not all(kinds):
        odd = kinds.index(not kinds[0])
        raise TypeError(
            f"{adapter}: item {odd} is a {type(items[odd]).__name__} and item 0 a "
            f"{type(items[0]).__name__}; a batch's items are all torch tensors or all arrays"
        )


def _numeric_like(item: Any) -> bool:
    """A numeric numpy array, or what numpy may make one of (an array-like, a sequence, a
    number)."""
    if isinstance(item, np.ndarray):
        return item.dtype.kind not in "OUSV"
    numbers = (list, tuple, int, float, complex, np.number)
    return isinstance(item, numbers) or hasattr(item, "__array__")


def _check_rows(adapter: str, output: Any, rows: int, given: str) -> None:
    """Raise ``ResultCountError`` unless ``output`` is an array with ``rows`` rows (its first
    dimension): a model whose output rows do not match its input's would hand callers
    someone else's rows."""
    shape = getattr(output, "shape", None)
    if shape is None or len(shape) == 0:
        got = f"a {type(output).__name__}" if shape is None else "an array of no dimension"
        raise ResultCountError(
            f"{adapter}: the model returned {got} for {given}; expected an array of {rows} rows"
        )
    if int(shape[0]) != rows:
        raise ResultCountError(
            f"{adapter}: the model returned {int(shape[0])} rows for {given}; expected {rows}"
        )


def _split_rows(output: Any, counts: list[int]) -> list[Any]:
    total = sum(counts)
    _check_rows("concat_rows", output, total, f"{total} input rows ({len(counts)} items)")
    if _is_torch(output):
        return list(output.split(counts, dim=0))
    return list(np.split(output, np.cumsum(counts)[:-1], axis=0))


def _unstack(output: Any, items: int) -> list[Any]:
    _check_rows("stacked", output, items, f"{items} items")
    return list(output.unbind(0)) if _is_torch(output) else list(output)


def _adapt(
    fn: Callable[[Any], Any],
    collate: Callable[[list[Any]], Any],
    scatter: Callable[[Any, list[Any]], list[Any]],
) -> Callable[[list[Any]], Any]:
    if is_async_callable(fn):

        @functools.wraps(fn)
        async def run_async(items: list[Any]) -> list[Any]:
            return scatter(await fn(collate(items)), items)

        return run_async

    @functools.wraps(fn)
    def run(items: list[Any]) -> list[Any]:
        return scatter(fn(collate(items)), items)

    return run


def stacked(fn: Callable[[Any], Any]) -> Callable[[list[Any]], Sequence[Any]]:
    """Wrap ``fn(x: (n, *S)) -> (n, *T)`` as a batch model over items of shape ``S``.

    The wrapped model raises ``ResultCountError`` when ``fn`` returns no array or one whose
    first dimension is not ``n``."""
    return _adapt(fn, _stack, lambda out, items: _unstack(out, len(items)))


def concat_rows(fn: Callable[[Any], Any]) -> Callable[[list[Any]], Sequence[Any]]:
    """Wrap ``fn(x: (N, *S)) -> (N, *T)`` as a batch model over row blocks ``(r_i, *S)``.

    Each caller receives the ``r_i`` output rows that correspond to its own input rows. The
    wrapped model raises ``ResultCountError`` when ``fn`` returns no array or one whose first
    dimension is not ``N`` (more rows would give the last caller another's, fewer would cut
    callers short).
    """
    return _adapt(fn, _concat, lambda out, items: _split_rows(out, [row_count(i) for i in items]))

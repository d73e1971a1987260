"""Per-caller calls of a batch handler and the one call with lists that serves a batch.

``@serve.batch`` handlers take one list per parameter: callers ``f(a, key=b)`` and
``f(c, key=d)`` become ``handler([a, c], key=[b, d])``. Each call is bound to the handler's
signature (defaults applied), so positional, keyword and out-of-order calls batch together.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["Call", "CallShape"]

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


class Call:
    """One caller's arguments, one value per parameter of the handler, in order."""

    __slots__ = ("values",)

    def __init__(self, values: tuple[Any, ...]) -> None:
        self.values = values

    def __repr__(self) -> str:
        return f"Call{self.values!r}"


class CallShape:
    """How calls of ``fn`` (``self`` already bound for a method) become items and back.

    A handler with a single positional parameter (the usual ``handler(self, requests)``) takes
    the caller's argument itself as the item; any other takes a :class:`Call`.
    """

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.signature = inspect.signature(fn)
        self.parameters = tuple(self.signature.parameters.values())
        self.single = len(self.parameters) == 1 and self.parameters[0].kind in _POSITIONAL

    def item(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The item for one call.

        Raises:
            TypeError: the arguments do not fit the handler's signature (as calling it would).
        """
        if self.single and len(args) == 1 and not kwargs:
            return args[0]
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        values = tuple(bound.arguments[p.name] for p in self.parameters)
        return values[0] if self.single else Call(values)

    def first_argument(self, item: Any) -> Any:
        """The caller's first argument (what Ray's ``batch_size_fn`` sees per caller)."""
        if self.single:
            return item
        first = item.values[0]
        if self.parameters[0].kind is inspect.Parameter.VAR_POSITIONAL:
            return first[0]
        return first

    def columns(self, items: Sequence[Any]) -> tuple[list[Any], dict[str, Any]]:
        """The positional and keyword arguments of the batch call: one list per argument.

        Raises:
            TypeError: the calls of the batch pass different extra (``*args``/``**kwargs``)
                arguments, which cannot be lined up.
        """
        if self.single:
            return [list(items)], {}
        args: list[Any] = []
        kwargs: dict[str, Any] = {}
        for index, parameter in enumerate(self.parameters):
            values = [item.values[index] for item in items]
            if parameter.kind in _POSITIONAL:
                args.append(values)
            elif parameter.kind is inspect.Parameter.KEYWORD_ONLY:
                kwargs[parameter.name] = values
            elif parameter.kind is inspect.Parameter.VAR_POSITIONAL:
                args.extend(_transpose_extra_args(parameter.name, values))
            else:
                kwargs.update(_transpose_extra_kwargs(parameter.name, values))
        return args, kwargs


def _transpose_extra_args(name: str, values: list[tuple[Any, ...]]) -> list[list[Any]]:
    lengths = {len(v) for v in values}
    if len(lengths) > 1:
        raise TypeError(
            f"*{name}: every call in a batch must pass as many extra positional arguments, "
            f"got {sorted(lengths)}"
        )
    width = lengths.pop() if lengths else 0
    return [[v[i] for v in values] for i in range(width)]


def _transpose_extra_kwargs(name: str, values: list[dict[str, Any]]) -> dict[str, list[Any]]:
    keys = {tuple(sorted(v)) for v in values}
    if len(keys) > 1:
        raise TypeError(
            f"**{name}: every call in a batch must pass the same extra keyword arguments, "
            f"got {sorted(keys)}"
        )
    names = keys.pop() if keys else ()
    return {key: [v[key] for v in values] for key in names}

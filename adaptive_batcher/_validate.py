"""Argument checks with exact, stable messages (pinned by tests).

An "int" is any integral: ``int`` or anything ``operator.index`` accepts (numpy integer scalars),
returned as a plain ``int``. A "number" is any real number (``numbers.Real``: ints, floats, numpy
integer and float scalars), returned as a ``float``. Bools (Python's and numpy's) are neither;
a "bool" is either of them, returned as a plain ``bool``.
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

__all__ = [
    "check_bool",
    "check_callable",
    "check_choice",
    "check_int",
    "check_integral",
    "check_number",
    "check_optional_int",
    "check_real",
    "check_sequence",
    "check_str",
    "check_strings",
]


def check_int(name: str, value: object, minimum: int) -> int:
    """``value`` as an int >= ``minimum``; TypeError if not an int (bools too), else ValueError."""
    number = value if type(value) is int else check_integral(name, value)
    if number < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return number


def check_integral(name: str, value: object) -> int:
    """``value`` as a plain int if it is an integral but a bool (``operator.index``), else
    TypeError; no range check."""
    if not isinstance(value, bool):
        try:
            return operator.index(value)  # type: ignore[arg-type]
        except TypeError:
            pass  # numpy bools land here too: they refuse __index__
    raise TypeError(f"{name} must be an int, got {type(value).__name__}")


def check_optional_int(name: str, value: object, minimum: int) -> int | None:
    """Like :func:`check_int`, but None passes through."""
    return None if value is None else check_int(name, value, minimum)


def check_real(name: str, value: object) -> float:
    """``value`` as a float if it is a real number (not a bool), else TypeError; no range check."""
    if type(value) is float or type(value) is int:
        return float(value)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    return float(value)


def check_number(name: str, value: object, minimum: float, *, strict: bool = False) -> float:
    """``value`` as a finite float >= ``minimum`` (> if ``strict``)."""
    number = check_real(name, value)
    too_small = number <= minimum if strict else number < minimum
    if not math.isfinite(number) or too_small:
        relation = ">" if strict else ">="
        raise ValueError(f"{name} must be a finite number {relation} {minimum:g}, got {value!r}")
    return number


def check_bool(name: str, value: object) -> bool:
    """``value`` as a plain bool if it is a bool (numpy's too), else TypeError (ints too)."""
    if not isinstance(value, bool | np.bool_):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return bool(value)


def check_str(name: str, value: object) -> str:
    """``value`` if it is a str, else TypeError."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {type(value).__name__}")
    return value


def check_sequence(name: str, value: object, of: str) -> tuple[Any, ...]:
    """The items of ``value`` as a tuple; TypeError if it is not iterable, or is a string.

    ``of`` says what the items are, for the message (``"ints"``, ``"guard factories"``).
    """
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise TypeError(f"{name} must be a sequence of {of}, got {type(value).__name__}")
    return tuple(value)


def check_callable(name: str, value: object) -> Callable[..., Any]:
    """``value`` if callable, else TypeError."""
    if not callable(value):
        raise TypeError(f"{name} must be callable, got {type(value).__name__}")
    return value


def check_choice(name: str, value: object, choices: Iterable[str]) -> str:
    """``value`` if it is one of ``choices``; TypeError for a non-string, else ValueError."""
    allowed = tuple(choices)
    check_str(name, value)
    if value not in allowed:
        listed = ", ".join(repr(c) for c in allowed)
        raise ValueError(f"{name} must be one of {listed}, got {value!r}")
    return value


def check_strings(name: str, value: object) -> tuple[str, ...]:
    """``value`` (an iterable of str, not a str itself) as a tuple; TypeError naming the item."""
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise TypeError(f"{name} must be a sequence of str, got {type(value).__name__}")
    items = tuple(value)
    for i, item in enumerate(items):
        if not isinstance(item, str):
            raise TypeError(f"{name}[{i}] must be a str, got {type(item).__name__}")
    return items

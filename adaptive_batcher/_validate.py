"""Argument checks with exact, stable messages (pinned by tests): the package's one set.

Every message reads ``<name> must be <what>, got <value>`` (the value's type name for a
TypeError). A check takes the name first, returns the value in its canonical type, and raises
TypeError for a value of the wrong type, ValueError for one out of range.

An "int" is any integral: ``int`` or anything ``operator.index`` accepts (numpy integer scalars),
returned as a plain ``int``. A "number" is any real number (``numbers.Real``: ints, floats, numpy
integer and float scalars), returned as a ``float``. Bools (Python's and numpy's) are neither;
a "bool" is either of them, returned as a plain ``bool``.

Command-line text goes through the same checks: :func:`parse_int`, :func:`parse_number` and
:func:`parse_ints` read it, and :func:`argument_type` turns a check into an argparse ``type=``
callable whose ``argparse.ArgumentTypeError`` carries the check's message (e.g.
``--repeats must be >= 1, got 0``).
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Callable, Iterable
from itertools import pairwise
from typing import Any, Final, TypeVar

import numpy as np

__all__ = [
    "MAX_SERVICE_S",
    "argument_type",
    "check_batch_time",
    "check_bool",
    "check_callable",
    "check_choice",
    "check_finite",
    "check_in_range",
    "check_increasing_ints",
    "check_int",
    "check_integral",
    "check_ints",
    "check_number",
    "check_optional_int",
    "check_real",
    "check_sequence",
    "check_str",
    "check_strings",
    "int_argument",
    "number_argument",
    "parse_int",
    "parse_ints",
    "parse_number",
]

T = TypeVar("T")

MAX_SERVICE_S: Final = 1e5
"""The longest batch time a service-time model, table or profile may give, s (about 28 hours).
No inference batch takes longer, the latency histograms end there
(:data:`~adaptive_batcher.metrics.histogram.MAX_S`), and far longer times (from ~1e302 s)
overflow the simulator's and the histograms' arithmetic."""


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
    """``value`` as a float if it is a real number (not a bool), else TypeError; no range check
    (an int too large for a float, 10**400, is infinite: range checks refuse it as such)."""
    if type(value) is float or type(value) is int:
        return _float(value)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    return _float(value)


def _float(value: Any) -> float:
    """``float(value)``; an int beyond a float's range is infinite, with its sign."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def check_number(name: str, value: object, minimum: float, *, strict: bool = False) -> float:
    """``value`` as a finite float >= ``minimum`` (> if ``strict``)."""
    number = check_real(name, value)
    too_small = number <= minimum if strict else number < minimum
    if not math.isfinite(number) or too_small:
        relation = ">" if strict else ">="
        raise ValueError(f"{name} must be a finite number {relation} {minimum:g}, got {value!r}")
    return number


def check_finite(name: str, value: object) -> float:
    """``value`` as a finite float (a time on any clock), else TypeError or ValueError."""
    number = check_real(name, value)
    if not math.isfinite(number):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return number


def check_batch_time(name: str, value: object, unit: str = "s", *, strict: bool = False) -> float:
    """``value``, a batch time in ``unit`` (``"s"`` or ``"ms"``), as a finite float >= 0 (> 0 if
    ``strict``) and at most :data:`MAX_SERVICE_S`; ValueError names ``name`` and the limit."""
    number = check_number(name, value, 0.0, strict=strict)
    limit = MAX_SERVICE_S * (1e3 if unit == "ms" else 1.0)
    if number > limit:
        raise ValueError(f"{name} must be at most {limit:g} {unit} (MAX_SERVICE_S), got {value!r}")
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
    """The items of ``value`` as a tuple; TypeError if it is not iterable, or is a string or
    bytes (``bytes``, ``bytearray``, ``memoryview``: one value, not a sequence of them).

    ``of`` says what the items are, for the message (``"ints"``, ``"guard factories"``).
    """
    if isinstance(value, str | bytes | bytearray | memoryview) or not isinstance(value, Iterable):
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


def check_in_range(
    name: str,
    value: object,
    low: float,
    high: float,
    *,
    open_low: bool = False,
    open_high: bool = False,
) -> float:
    """``value`` as a float in the interval from ``low`` to ``high``, each end included unless
    ``open_low`` / ``open_high``; TypeError if not a number, else ValueError (NaN too), e.g.
    ``margin must be a number in (0, 1], got 1.5``."""
    number = check_real(name, value)
    above = number > low if open_low else number >= low
    below = number < high if open_high else number <= high
    if not (above and below):
        interval = f"{'(' if open_low else '['}{low:g}, {high:g}{')' if open_high else ']'}"
        raise ValueError(f"{name} must be a number in {interval}, got {value!r}")
    return number


def check_ints(name: str, value: object, minimum: int, *, empty: bool = False) -> tuple[int, ...]:
    """The items of ``value`` (an iterable of ints, not a string) as a tuple of plain ints >=
    ``minimum``, non-empty unless ``empty``; an item's error names it ``<name>[<index>]``."""
    items = check_sequence(name, value, "ints")
    if not items and not empty:
        raise ValueError(f"{name} must be a non-empty sequence of ints, got {list(items)}")
    return tuple(check_int(f"{name}[{i}]", item, minimum) for i, item in enumerate(items))


def check_increasing_ints(
    name: str, value: object, minimum: int, *, empty: bool = False
) -> tuple[int, ...]:
    """Like :func:`check_ints`, and the ints strictly increasing."""
    items = check_ints(name, value, minimum, empty=empty)
    if any(b <= a for a, b in pairwise(items)):
        raise ValueError(f"{name} must be strictly increasing, got {list(items)}")
    return items


# -- command-line text ---------------------------------------------------------------------------


def parse_int(name: str, text: str) -> int:
    """``text`` read as a decimal int (as ``int(text)``), else ValueError:
    ``--repeats must be an int, got '1.5'``."""
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{name} must be an int, got {text!r}") from None


def parse_number(name: str, text: str) -> float:
    """``text`` read as a float (as ``float(text)``; ``"nan"`` and ``"inf"`` read as such, for
    the range check to refuse), else ValueError: ``--rate must be a number, got 'fast'``."""
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{name} must be a number, got {text!r}") from None


def parse_ints(name: str, text: str) -> tuple[int, ...]:
    """``text`` read as comma-separated decimal ints (``"1,2,4"``; blanks around items allowed),
    else ValueError: ``--batch-sizes must be comma-separated ints, got '1,x'``."""
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ValueError(f"{name} must be comma-separated ints, got {text!r}") from None


def argument_type(name: str, convert: Callable[[str, str], T]) -> Callable[[str], T]:
    """An argparse ``type=`` callable: ``convert(name, text)``, its TypeError or ValueError
    turned into ``argparse.ArgumentTypeError`` with the same message (argparse then prints
    ``error: argument <flag>: <message>`` and exits with status 2).

    ``name`` is the option as the user typed it (``"--repeats"``), so the message names it.
    """

    def parse(text: str) -> T:
        import argparse  # only command lines need it

        try:
            return convert(name, text)
        except (TypeError, ValueError) as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = name  # argparse's fallback messages use it
    return parse


def int_argument(name: str, minimum: int) -> Callable[[str], int]:
    """An argparse type for an int >= ``minimum`` (:func:`parse_int`, :func:`check_int`)."""
    return argument_type(name, lambda n, text: check_int(n, parse_int(n, text), minimum))


def range_argument(
    name: str, low: float, high: float, *, open_low: bool = False, open_high: bool = False
) -> Callable[[str], float]:
    """An argparse type for a number from ``low`` to ``high``, each end included unless
    ``open_low`` / ``open_high`` (:func:`parse_number`, :func:`check_in_range`)."""

    def convert(n: str, text: str) -> float:
        value = parse_number(n, text)
        return check_in_range(n, value, low, high, open_low=open_low, open_high=open_high)

    return argument_type(name, convert)


def number_argument(name: str, minimum: float, *, strict: bool = False) -> Callable[[str], float]:
    """An argparse type for a finite number >= ``minimum`` (> if ``strict``)
    (:func:`parse_number`, :func:`check_number`)."""
    return argument_type(
        name, lambda n, text: check_number(n, parse_number(n, text), minimum, strict=strict)
    )

"""Argument checks with exact, stable messages (pinned by tests)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

__all__ = [
    "check_bool",
    "check_callable",
    "check_choice",
    "check_int",
    "check_number",
    "check_optional_int",
    "check_strings",
]


def check_int(name: str, value: object, minimum: int) -> int:
    """``value`` as an int >= ``minimum``; TypeError if not an int (bools too), else ValueError."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def check_optional_int(name: str, value: object, minimum: int) -> int | None:
    """Like :func:`check_int`, but None passes through."""
    return None if value is None else check_int(name, value, minimum)


def check_number(name: str, value: object, minimum: float, *, strict: bool = False) -> float:
    """``value`` as a finite float >= ``minimum`` (> if ``strict``)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    number = float(value)
    too_small = number <= minimum if strict else number < minimum
    if not math.isfinite(number) or too_small:
        relation = ">" if strict else ">="
        raise ValueError(f"{name} must be a finite number {relation} {minimum:g}, got {value!r}")
    return number


def check_callable(name: str, value: object) -> Callable[..., Any]:
    """``value`` if callable, else TypeError."""
    if not callable(value):
        raise TypeError(f"{name} must be callable, got {type(value).__name__}")
    return value


def check_bool(name: str, value: object) -> bool:
    """``value`` if it is a bool, else TypeError (1 and "yes" are not bools)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return value


def check_choice(name: str, value: object, choices: Iterable[str]) -> str:
    """``value`` if it is one of ``choices``; TypeError for a non-string, else ValueError."""
    allowed = tuple(choices)
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {type(value).__name__}")
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

"""The shared argument checks: what counts as an int and as a number, and their exact messages."""

from __future__ import annotations

import math
import re
from fractions import Fraction

import numpy as np
import pytest

from adaptive_batcher._validate import (
    check_bool,
    check_int,
    check_number,
    check_real,
    check_sequence,
    check_str,
)


@pytest.mark.parametrize("value", [3, np.int64(3), np.int32(3), np.uint8(3)])
def test_any_integral_is_an_int_and_comes_back_plain(value: object) -> None:
    result = check_int("n", value, 1)
    assert result == 3 and type(result) is int


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        (True, "bool"),
        (np.True_, "bool"),
        (2.0, "float"),
        (1.5, "float"),
        (np.float64(2.0), "float64"),
        ("2", "str"),
        (None, "NoneType"),
        (math.nan, "float"),
    ],
)
def test_non_integrals_are_refused_by_type(value: object, kind: str) -> None:
    with pytest.raises(TypeError) as caught:
        check_int("n", value, 1)
    assert str(caught.value) == f"n must be an int, got {kind}"


def test_an_int_below_the_minimum_is_a_value_error() -> None:
    with pytest.raises(ValueError, match=r"^n must be >= 1, got 0$"):
        check_int("n", np.int64(0), 1)


@pytest.mark.parametrize(
    "value", [2, 2.0, np.float64(2.0), np.float32(2.0), np.int64(2), np.int8(2), Fraction(2)]
)
def test_any_real_is_a_number_and_comes_back_a_float(value: object) -> None:
    for result in (check_real("x", value), check_number("x", value, 0.0)):
        assert result == 2.0 and type(result) is float


@pytest.mark.parametrize(
    ("value", "kind"),
    [(True, "bool"), (np.False_, "bool"), ("5", "str"), (None, "NoneType"), ([1], "list")],
)
def test_non_numbers_are_refused_by_type(value: object, kind: str) -> None:
    for check in (lambda: check_real("x", value), lambda: check_number("x", value, 0.0)):
        with pytest.raises(TypeError) as caught:
            check()
        assert str(caught.value) == f"x must be a number, got {kind}"


@pytest.mark.parametrize("value", [math.nan, math.inf, np.float32("nan"), -1])
def test_check_number_wants_finite_values_in_range(value: object) -> None:
    message = f"x must be a finite number >= 0, got {value!r}"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        check_number("x", value, 0.0)


def test_check_real_has_no_range() -> None:
    assert check_real("x", -math.inf) == -math.inf
    assert math.isnan(check_real("x", np.float64("nan")))


def test_check_str() -> None:
    assert check_str("s", "ok") == "ok"
    with pytest.raises(TypeError) as caught:
        check_str("s", None)
    assert str(caught.value) == "s must be a str, got NoneType"


def test_check_sequence_takes_any_iterable_but_a_string() -> None:
    assert check_sequence("xs", [1, 2], "ints") == (1, 2)
    assert check_sequence("xs", (n for n in (3,)), "ints") == (3,)
    for value, kind in ((5, "int"), ("ab", "str"), (b"ab", "bytes"), (None, "NoneType")):
        with pytest.raises(TypeError) as caught:
            check_sequence("xs", value, "ints")
        assert str(caught.value) == f"xs must be a sequence of ints, got {kind}"


def test_check_bool_takes_numpy_bools_as_plain_bools() -> None:
    for value, expected in ((True, True), (np.True_, True), (np.False_, False)):
        result = check_bool("flag", value)
        assert result is expected
    for value, kind in ((1, "int"), (np.int8(1), "int8"), ("yes", "str"), (None, "NoneType")):
        with pytest.raises(TypeError, match=f"^flag must be a bool, got {kind}$"):
            check_bool("flag", value)

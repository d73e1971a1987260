"""The shared argument checks: what counts as an int and as a number, and their exact messages."""

from __future__ import annotations

import argparse
import math
import re
from fractions import Fraction

import numpy as np
import pytest

from adaptive_batcher._validate import (
    argument_type,
    check_bool,
    check_finite,
    check_in_range,
    check_increasing_ints,
    check_int,
    check_ints,
    check_number,
    check_real,
    check_sequence,
    check_str,
    int_argument,
    number_argument,
    parse_int,
    parse_ints,
    parse_number,
    range_argument,
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


def test_check_finite_takes_any_finite_real_and_names_the_rest() -> None:
    assert check_finite("t", -5) == -5.0 and type(check_finite("t", np.float32(1.5))) is float
    for value in (math.nan, -math.inf):
        with pytest.raises(ValueError, match=f"^t must be a finite number, got {value!r}$"):
            check_finite("t", value)
    with pytest.raises(TypeError, match=r"^t must be a number, got str$"):
        check_finite("t", "1")


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


def test_check_in_range_names_the_interval_with_its_open_ends() -> None:
    assert check_in_range("f", np.float32(0.5), 0.0, 1.0, open_low=True) == 0.5
    assert check_in_range("f", 1, 0.0, 1.0, open_low=True) == 1.0
    assert check_in_range("p", 0, 0.0, 1.0) == 0.0
    cases = [
        ({"open_low": True}, 0.0, "f must be a number in (0, 1], got 0.0"),
        ({"open_high": True}, 1, "f must be a number in [0, 1), got 1"),
        ({}, 1.5, "f must be a number in [0, 1], got 1.5"),
        ({}, math.nan, "f must be a number in [0, 1], got nan"),
    ]
    for kwargs, value, message in cases:
        with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
            check_in_range("f", value, 0.0, 1.0, **kwargs)
    with pytest.raises(TypeError, match=r"^f must be a number, got str$"):
        check_in_range("f", "0.5", 0.0, 1.0)


def test_check_ints_names_the_item_at_fault() -> None:
    assert check_ints("xs", (np.int64(4), 2), 1) == (4, 2)
    assert check_ints("xs", [], 1, empty=True) == ()
    with pytest.raises(ValueError, match=r"^xs must be a non-empty sequence of ints, got \[\]$"):
        check_ints("xs", iter(()), 1)
    with pytest.raises(ValueError, match=r"^xs\[1\] must be >= 1, got 0$"):
        check_ints("xs", [2, 0], 1)
    with pytest.raises(TypeError, match=r"^xs\[0\] must be an int, got float$"):
        check_ints("xs", [2.0], 1)
    with pytest.raises(TypeError, match=r"^xs must be a sequence of ints, got str$"):
        check_ints("xs", "12", 1)


def test_check_increasing_ints() -> None:
    assert check_increasing_ints("xs", [1, 4, 16], 1) == (1, 4, 16)
    for value in ([4, 2], [2, 2]):
        message = f"xs must be strictly increasing, got {value}"
        with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
            check_increasing_ints("xs", value, 1)


def test_parsers_read_command_line_text_or_name_it() -> None:
    assert parse_int("--n", " 12 ") == 12
    assert parse_number("--x", "2.5") == 2.5
    assert math.isnan(parse_number("--x", "nan"))  # for the range check to refuse
    assert parse_ints("--sizes", "1, 2,4") == (1, 2, 4)
    for parse, text, message in (
        (parse_int, "1.5", "--n must be an int, got '1.5'"),
        (parse_number, "fast", "--n must be a number, got 'fast'"),
        (parse_ints, "1,,2", "--n must be comma-separated ints, got '1,,2'"),
    ):
        with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
            parse("--n", text)


def test_argument_types_raise_argparse_errors_with_the_checks_message() -> None:
    assert int_argument("--n", 1)("3") == 3
    assert number_argument("--x", 0.0, strict=True)("0.5") == 0.5
    assert range_argument("--q", 1.0, 100.0, open_high=True)("1") == 1.0
    for convert, text, message in (
        (
            range_argument("--q", 1.0, 100.0, open_high=True),
            "100",
            "--q must be a number in [1, 100), got 100.0",
        ),
        (
            range_argument("--m", 0.0, 1.0, open_low=True),
            "0",
            "--m must be a number in (0, 1], got 0.0",
        ),
        (int_argument("--n", 1), "0", "--n must be >= 1, got 0"),
        (int_argument("--n", 1), "x", "--n must be an int, got 'x'"),
        (number_argument("--x", 0.0), "-1", "--x must be a finite number >= 0, got -1.0"),
        (number_argument("--x", 0.0), "inf", "--x must be a finite number >= 0, got inf"),
        (
            argument_type("--s", lambda name, text: check_str(name, int(text))),
            "7",
            "--s must be a str, got int",  # a TypeError too
        ),
    ):
        with pytest.raises(argparse.ArgumentTypeError) as caught:
            convert(text)
        assert str(caught.value) == message


def test_argparse_prints_the_checks_message_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="p")
    parser.add_argument("--n", type=int_argument("--n", 1))
    with pytest.raises(SystemExit) as caught:
        parser.parse_args(["--n", "0"])
    assert caught.value.code == 2
    assert capsys.readouterr().err.endswith("p: error: argument --n: --n must be >= 1, got 0\n")

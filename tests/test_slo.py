"""SLO: every field is type-checked first, with a message naming it; numpy scalars are numbers."""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np
import pytest

from adaptive_batcher import SLO

FIELDS = ("p99_ms", "percentile", "preprocess_ms", "margin")


def exactly(message: str) -> str:
    return f"^{re.escape(message)}$"


@pytest.mark.parametrize("field", FIELDS)
@pytest.mark.parametrize(
    ("value", "kind"),
    [("50", "str"), (None, "NoneType"), (True, "bool"), (np.True_, "bool"), ([1], "list")],
)
def test_a_field_of_the_wrong_type_is_named(field: str, value: object, kind: str) -> None:
    kwargs: dict[str, Any] = {"p99_ms": 50.0, field: value}
    with pytest.raises(TypeError, match=exactly(f"SLO.{field} must be a number, got {kind}")):
        SLO(**kwargs)


def test_the_reported_case() -> None:
    with pytest.raises(TypeError, match=exactly("SLO.p99_ms must be a number, got str")):
        SLO(p99_ms="50")  # type: ignore[arg-type]


def test_numpy_scalars_are_numbers_and_are_stored_as_floats() -> None:
    slo = SLO(
        p99_ms=np.int64(50),  # type: ignore[arg-type]
        percentile=np.float32(95.0),  # type: ignore[arg-type]
        preprocess_ms=np.int32(5),  # type: ignore[arg-type]
        margin=np.float64(0.5),
    )
    assert slo == SLO(p99_ms=50.0, percentile=95.0, preprocess_ms=5.0, margin=0.5)
    assert all(type(getattr(slo, field)) is float for field in FIELDS)
    assert slo.target_ms == 25.0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"p99_ms": math.nan}, "SLO.p99_ms must be a finite number > 0, got nan"),
        ({"p99_ms": math.inf}, "SLO.p99_ms must be a finite number > 0, got inf"),
        ({"p99_ms": 0}, "SLO.p99_ms must be a finite number > 0, got 0.0"),
        ({"p99_ms": 50, "percentile": math.nan}, "SLO.percentile must be in (0, 100), got nan"),
        ({"p99_ms": 50, "preprocess_ms": math.inf}, "SLO.preprocess_ms must be >= 0, got inf"),
        ({"p99_ms": 50, "margin": np.float64(2.0)}, "SLO.margin must be in (0, 1], got 2.0"),
    ],
)
def test_values_out_of_range_keep_their_messages(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=exactly(message)):
        SLO(**kwargs)

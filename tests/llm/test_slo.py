"""TokenSLO: validation with exact messages, the per-request test, and the presets."""

from __future__ import annotations

import math

import numpy as np
import pytest

from adaptive_batcher.llm.slo import TOKEN_SLO_PRESETS, TokenSLO, token_slo_preset


def test_fields_are_stored_as_floats_with_seconds_views() -> None:
    slo = TokenSLO(ttft_ms=300, tpot_ms=np.int64(50), e2e_ms=30_000)
    assert (slo.ttft_ms, slo.tpot_ms, slo.percentile, slo.e2e_ms) == (300.0, 50.0, 99.0, 30000.0)
    assert type(slo.tpot_ms) is float
    assert (slo.ttft_s, slo.tpot_s, slo.e2e_s, slo.quantile) == (0.3, 0.05, 30.0, 0.99)
    assert TokenSLO(1, 1).e2e_s is None


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"ttft_ms": 0}, ValueError, "TokenSLO.ttft_ms must be a finite number > 0, got 0.0"),
        (
            {"tpot_ms": math.inf},
            ValueError,
            "TokenSLO.tpot_ms must be a finite number > 0, got inf",
        ),
        (
            {"tpot_ms": 1e-4},
            ValueError,
            r"TokenSLO.tpot_ms must be at least 0.001 ms \(1 us, the smallest latency the "
            r"histograms resolve\), got 0.0001",
        ),
        ({"ttft_ms": "300"}, TypeError, "TokenSLO.ttft_ms must be a number, got str"),
        ({"percentile": 100}, ValueError, r"TokenSLO.percentile must be in \[1, 100\), got 100.0"),
        (
            {"e2e_ms": -1},
            ValueError,
            "TokenSLO.e2e_ms must be a finite number > 0 or None, got -1.0",
        ),
        ({"margin": 0}, ValueError, r"TokenSLO.margin must be a number in \(0, 1\], got 0"),
        ({"tpot_ms": True}, TypeError, "TokenSLO.tpot_ms must be a number, got bool"),
    ],
)
def test_bad_fields_are_refused_with_their_name(
    kwargs: dict[str, object], error: type[Exception], message: str
) -> None:
    arguments: dict[str, object] = {"ttft_ms": 300.0, "tpot_ms": 50.0, **kwargs}
    with pytest.raises(error, match=rf"^{message}$"):
        TokenSLO(**arguments)  # type: ignore[arg-type]


def test_meets_needs_every_target() -> None:
    slo = TokenSLO(300, 50, e2e_ms=2000)
    assert slo.meets(0.3, 0.05, 2.0)
    assert not slo.meets(0.301, 0.01, 1.0)
    assert not slo.meets(0.1, 0.051, 1.0)
    assert not slo.meets(0.1, 0.01, 2.1)
    assert not slo.meets(0.1, 0.01)  # an e2e target and no e2e time: a miss
    assert TokenSLO(300, 50).meets(0.3, 0.05)


def test_meets_many_matches_meets_and_counts_nan_as_a_miss() -> None:
    slo = TokenSLO(300, 50)
    ttft = np.array([0.1, 0.4, 0.2, np.nan])
    tpot = np.array([0.04, 0.01, 0.06, 0.01])
    assert slo.meets_many(ttft, tpot).tolist() == [True, False, False, False]
    with_e2e = TokenSLO(300, 50, e2e_ms=1000)
    assert with_e2e.meets_many(ttft, tpot, np.array([0.9, 0.9, 0.9, 0.9])).tolist() == [
        True,
        False,
        False,
        False,
    ]
    assert not with_e2e.meets_many(ttft, tpot).any()


def test_presets_cite_their_sources() -> None:
    assert token_slo_preset("chat") == TokenSLO(300, 50)
    assert token_slo_preset("chat_distserve") == TokenSLO(250, 100)
    assert token_slo_preset("code_completion") == TokenSLO(125, 200)
    assert token_slo_preset("summarisation") == TokenSLO(15_000, 150)
    assert token_slo_preset("search").ttft_ms == 300
    for name, preset in TOKEN_SLO_PRESETS.items():
        assert preset.name == name and preset.source
    assert "DistServe" in TOKEN_SLO_PRESETS["code_completion"].source


def test_unknown_preset_lists_the_names() -> None:
    with pytest.raises(
        ValueError, match=r"^name must be one of 'chat', .*'summarisation', got 'x'$"
    ):
        token_slo_preset("x")
    with pytest.raises(TypeError, match=r"^name must be a str, got int$"):
        token_slo_preset(3)  # type: ignore[arg-type]

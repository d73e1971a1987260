"""The real-engine benchmark's references (benchmarks/llm_engine.py): the best static gate by
goodput, and the best among those whose admitted requests meet the SLO's tail targets."""

from __future__ import annotations

import math

from adaptive_batcher.llm import TokenSLO
from benchmarks.llm_engine import Summary, best_by_goodput

SLO = TokenSLO(ttft_ms=120, tpot_ms=30)


def _summary(goodput_rps: float, ttft_p99_ms: float, tpot_p99_ms: float) -> Summary:
    return Summary(
        sent=100, good=int(goodput_rps * 15), goodput_rps=goodput_rps, attainment=0.5,
        ttft_p50_ms=50.0, ttft_p99_ms=ttft_p99_ms, tpot_p50_ms=20.0, tpot_p99_ms=tpot_p99_ms,
        refused_pct=40.0, expired=0, unanswered=0, errors=0, error_statuses=(),
    )  # fmt: skip


def test_the_tails_are_met_only_when_both_p99s_are_within_their_targets() -> None:
    assert _summary(10, 120.0, 30.0).meets_tails(SLO)  # at the targets: met
    assert not _summary(10, 121.0, 20.0).meets_tails(SLO)
    assert not _summary(10, 80.0, 30.5).meets_tails(SLO)
    assert not _summary(0, math.nan, math.nan).meets_tails(SLO)  # nothing answered


def test_the_best_within_the_slo_skips_a_higher_goodput_past_its_tpot_target() -> None:
    statics = {
        "static_8": _summary(12.9, 102.0, 19.7),
        "static_16": _summary(15.9, 118.0, 32.0),  # more answers, TPOT p99 past 30 ms
        "static_32": _summary(0.5, 157.0, 52.8),
    }
    assert best_by_goodput(statics) == ("static_16", statics["static_16"])
    assert best_by_goodput(statics, SLO) == ("static_8", statics["static_8"])
    assert best_by_goodput({"static_32": statics["static_32"]}, SLO) is None

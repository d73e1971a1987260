"""Per-bin percentiles of a replay's series: stacked bins give each bin's own percentile."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from adaptive_batcher.metrics.recorder import Counts
from adaptive_batcher.sim.result import Outcome, SimResult, _fill_bin_percentiles
from adaptive_batcher.slo import SLO


@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 12), min_size=1, max_size=30),
    seed=st.integers(0, 2**32 - 1),
    q=st.sampled_from([50.0, 95.0, 99.0]),
)
def test_each_bin_gets_the_percentile_of_its_own_values(
    lengths: list[int], seed: int, q: float
) -> None:
    values = np.random.default_rng(seed).lognormal(0.0, 1.0, sum(lengths))
    edges = np.concatenate(([0], np.cumsum(lengths)))
    out = np.full(len(lengths), np.nan)
    _fill_bin_percentiles(out, values, edges, q)
    for b, length in enumerate(lengths):
        if length:
            assert out[b] == np.percentile(values[edges[b] : edges[b + 1]], q)  # exactly
        else:
            assert np.isnan(out[b])


def test_answers_are_judged_against_the_batchers_share_of_the_slo() -> None:
    """The simulator replays the batcher alone: with 20 ms of a 50 ms SLO spent before it, an
    answer 35 ms after arriving at the batcher is late, and one 25 ms after is within it, in
    the totals, the phases and the per-second series alike."""
    arrival = np.array([0.0, 0.1, 0.2, 0.3])
    done = arrival + np.array([0.025, 0.035, 0.025, 0.035])

    def build(slo: SLO) -> SimResult:
        return SimResult.build(
            name="t",
            arrival_s=arrival,
            done_s=done,
            outcome=np.full(4, Outcome.OK, dtype=np.int8),
            sizes=np.ones(4, dtype=np.int64),
            slo=slo,
            counts=Counts(4, 4, 0, 0, 0, 0, 0, 4, 4, 4, 0),
            busy_s=0.1,
            decisions=[],
            slots=1,
        )

    preprocessed = SLO(latency_ms=50.0, preprocess_ms=20.0)
    result = build(preprocessed)
    assert result.slo_attainment == 0.5
    assert result.series.goodput_rps.sum() == 2.0
    assert result.phase(0.0, 1.0, preprocessed).slo_attainment == 0.5
    assert build(SLO(latency_ms=50.0)).slo_attainment == 1.0

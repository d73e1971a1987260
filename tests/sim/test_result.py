"""Per-bin percentiles of a replay's series: stacked bins give each bin's own percentile."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from adaptive_batcher.sim.result import _fill_bin_percentiles


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

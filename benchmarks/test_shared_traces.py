"""The shared Azure traces, read where the replays read them (../shared/traces).

Kept with the benchmarks, which need the shared folder anyway, so that the unit tests run on a
clone without it.
"""

from __future__ import annotations

import numpy as np
import pytest

from adaptive_batcher.sim.traces import TRACE_DIR, find_trace, load_trace


def test_real_azure_code_trace() -> None:
    path = find_trace("azure_llm_2023_code")
    assert path is not None, (
        f"the shared trace azure_llm_2023_code.csv is missing from {TRACE_DIR}; "
        "these tests read ../shared/traces next to the repository"
    )
    arrivals = load_trace(path, size_column="ContextTokens")
    assert len(arrivals) == 8819
    assert 56 * 60 < arrivals.duration_s < 58 * 60  # ~57.3 min
    assert arrivals.rate_rps == pytest.approx(2.6, abs=0.1)
    assert arrivals.sizes.tolist()[:3] == [4808, 3180, 110]
    gaps = np.diff(arrivals.times_s)
    assert gaps.std() / gaps.mean() > 10  # very bursty: CV 13.2 per the traces README
    compressed = load_trace(path, compress=100.0)
    assert compressed.rate_rps == pytest.approx(100 * arrivals.rate_rps)

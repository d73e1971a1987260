"""Token workloads: arrivals with prompt and output lengths."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from adaptive_batcher.sim.llm.workloads import (
    IndependentLengths,
    LengthSampler,
    TokenArrivals,
    TraceLengths,
    load_token_trace,
    token_workload,
)
from adaptive_batcher.sim.workloads import FixedSize, Poisson

ROWS = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.0000000,374,44
2023-11-16 18:15:47.0000000,396,109
2023-11-16 18:15:47.5000000,879,55
2023-11-16 18:15:49.0000000,91,16
2023-11-16 18:15:50.0000000,20000,1
"""


def trace(tmp_path: Path) -> Path:
    path = tmp_path / "azure_llm_2023_tiny.csv"
    path.write_text(ROWS, encoding="utf-8")
    return path


def test_a_trace_keeps_its_lengths_and_compresses_to_a_rate(tmp_path: Path) -> None:
    arrivals = load_token_trace(trace(tmp_path))
    assert arrivals.times_s.tolist() == [0.0, 1.0, 1.5, 3.0, 4.0]
    assert arrivals.prompt_tokens.tolist() == [374, 396, 879, 91, 20000]
    assert arrivals.output_tokens.tolist() == [44, 109, 55, 16, 1]
    assert arrivals.rate_rps == pytest.approx(5 / 4.0) and arrivals.name == "azure_llm_2023_tiny"
    fast = load_token_trace(
        "azure_llm_2023_tiny", rate_rps=10.0, trace_dir=tmp_path, max_prompt=8192
    )
    assert fast.rate_rps == pytest.approx(10.0) and fast.times_s[-1] == pytest.approx(0.5)
    assert fast.prompt_tokens.max() == 8192
    window = load_token_trace(trace(tmp_path), start_s=1.0, duration_s=2.0)
    assert window.times_s.tolist() == [0.0, 0.5] and window.duration_s == 2.0


def test_a_missing_trace_says_where_it_looked(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"trace 'absent' not found in"):
        load_token_trace("absent", trace_dir=tmp_path)


def test_tiling_and_rates() -> None:
    arrivals = TokenArrivals(np.array([0.0, 1.0]), np.array([5, 6]), np.array([1, 2]), "t", 2.0)
    tiled = arrivals.tiled(3)
    assert tiled.times_s.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0] and tiled.duration_s == 6.0
    assert tiled.prompt_tokens.tolist() == [5, 6] * 3
    assert arrivals.at_rate(2.0).duration_s == pytest.approx(1.0)
    assert not arrivals.times_s.flags.writeable


@pytest.mark.parametrize(
    ("times", "prompt", "output", "message"),
    [
        ([1.0, 0.0], [1, 1], [1, 1], "times_s must be sorted"),
        ([0.0], [0], [1], "prompt_tokens must be integers >= 1"),
        ([0.0], [1], [1.5], "output_tokens must be integers >= 1"),
        ([0.0, 1.0], [1], [1, 1], "must be 1-D of one length"),
    ],
)
def test_bad_arrivals_are_refused(
    times: list[float], prompt: list[float], output: list[float], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        TokenArrivals(np.array(times), np.array(prompt), np.array(output))


def test_generated_workloads_are_deterministic_and_keep_trace_pairs() -> None:
    pairs = TraceLengths(np.array([100, 2000]), np.array([10, 300]))
    assert isinstance(pairs, LengthSampler)
    one = token_workload(Poisson(50.0), pairs, 10.0, np.random.default_rng(3))
    two = token_workload(Poisson(50.0), pairs, 10.0, np.random.default_rng(3))
    assert np.array_equal(one.times_s, two.times_s) and np.array_equal(
        one.prompt_tokens, two.prompt_tokens
    )
    assert set(zip(one.prompt_tokens.tolist(), one.output_tokens.tolist(), strict=True)) <= {
        (100, 10),
        (2000, 300),
    }
    assert 400 < len(one) < 600 and one.duration_s == 10.0
    fixed = token_workload(
        Poisson(5.0), IndependentLengths(FixedSize(7), FixedSize(3)), 2.0, np.random.default_rng(0)
    )
    assert set(fixed.prompt_tokens.tolist()) == {7} and set(fixed.output_tokens.tolist()) == {3}
